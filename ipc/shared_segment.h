// SharedSegment: one named POSIX shared-memory object, created or opened and
// mapped with Boost.Interprocess, with the permission checks gradsync needs.
//
// Created segments get exactly the requested mode (0600 by default, 0660 when
// a group is configured), regardless of the umask. Opening refuses a segment
// whose mode lets more people in than `max_mode` allows or that is not owned
// by the expected user (root callers included): someone else could then
// read or write a trainer's gradients.
#ifndef GRADSYNC_IPC_SHARED_SEGMENT_H_
#define GRADSYNC_IPC_SHARED_SEGMENT_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "boost/interprocess/mapped_region.hpp"

namespace gradsync::ipc {

class SharedSegment {
 public:
  SharedSegment() = default;
  SharedSegment(SharedSegment&&) = default;
  SharedSegment& operator=(SharedSegment&&) = default;

  // Creates (fails if it exists), sizes, zero-fills and maps a segment.
  // Its pages are reserved now (posix_fallocate): RESOURCE_EXHAUSTED naming
  // the bytes needed and free when /dev/shm cannot hold it, rather than a
  // SIGBUS for whoever writes the page that did not fit later.
  // `group` >= 0 chowns the segment to that group (mode should be 0660).
  static absl::StatusOr<SharedSegment> Create(const std::string& name, size_t size,
                                              mode_t mode = 0600, gid_t group = -1);

  // Opens and maps an existing segment read-write. It must be owned by
  // `owner` (nullopt: the caller's effective uid) — a trainer passes the
  // uid of the daemon it verified.
  static absl::StatusOr<SharedSegment> Open(const std::string& name, mode_t max_mode = 0660,
                                            std::optional<uid_t> owner = std::nullopt);

  // Removes the name (mappings stay valid until unmapped). NotFound if absent.
  static absl::Status Remove(const std::string& name);

  // OK while `name()` still refers to this mapping's object; NotFound once
  // the name was unlinked, FailedPrecondition when another object now has
  // it (the mapping itself stays valid either way).
  absl::Status CheckStillNamed() const;

  void* data() const { return region_.get_address(); }
  size_t size() const { return region_.get_size(); }
  const std::string& name() const { return name_; }
  bool valid() const { return data() != nullptr; }
  // The mapped object's identity (fstat when it was mapped).
  dev_t device() const { return dev_; }
  ino_t inode() const { return ino_; }

 private:
  boost::interprocess::mapped_region region_;
  std::string name_;
  // The object's identity, recorded when it was mapped.
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Removes every segment named "<prefix>.<pid>.*" that this process's
// effective uid owns, whose name records our pid namespace, and whose pid
// is no longer a live process there (gone, or a zombie): what a daemon
// killed with SIGKILL left behind. Another user's segment, one recorded in
// another pid namespace (its pid means nothing here) and one that records
// none are kept. Returns the names removed.
std::vector<std::string> RemoveStaleSegments(const std::string& prefix);

// "<prefix>.<pid>.<suffix>.pidns<inode>": the naming every gradsync segment
// follows. The pid is the creator's view of `daemon_pid`, so the name also
// records the creator's pid namespace (the inode of /proc/self/ns/pid).
std::string SegmentName(const std::string& prefix, pid_t daemon_pid, const std::string& suffix);

// The inode of this process's pid namespace; 0 when it cannot be read.
uint64_t OwnPidNamespace();

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_SHARED_SEGMENT_H_
