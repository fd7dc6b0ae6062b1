// NodeSegment: the one small segment per daemon that every local trainer
// maps: the node-wide doorbell the daemon sleeps on (any trainer's readiness
// entry rings it) and the daemon's heartbeat, which trainers watch to notice
// a dead daemon without a syscall.
#ifndef GRADSYNC_IPC_NODE_SEGMENT_H_
#define GRADSYNC_IPC_NODE_SEGMENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "ipc/doorbell.h"
#include "ipc/shared_segment.h"
#include "ipc/truncation_guard.h"

namespace gradsync::ipc {

inline constexpr uint64_t kNodeSegmentMagic = 0x4e73'636e'7973'6447ull;  // "GdsyncsN"
inline constexpr uint32_t kNodeSegmentVersion = 1;

struct NodeSegmentHeader {
  uint64_t magic;
  uint32_t layout_version;
  uint32_t header_bytes;
  int64_t daemon_pid;
  std::atomic<uint64_t> heartbeat;  // bumped periodically by the daemon
  Doorbell ready_bell;              // rung after every readiness entry
};

class NodeSegment {
 public:
  NodeSegment() = default;
  NodeSegment(NodeSegment&&) = default;
  NodeSegment& operator=(NodeSegment&&) = default;

  // Daemon side; the mapping is guarded (ipc/truncation_guard.h): whoever
  // truncates the segment cannot kill the daemon, see Truncated().
  static absl::StatusOr<NodeSegment> Create(const std::string& name, pid_t daemon_pid,
                                            mode_t mode = 0600, gid_t group = -1);
  // `owner`: who must own it (nullopt: the caller; see SharedSegment::Open).
  static absl::StatusOr<NodeSegment> Open(const std::string& name,
                                          std::optional<uid_t> owner = std::nullopt);

  // The daemon's check of its own segment, which anyone of its user can
  // damage: OK while the header is intact (magic, version) and the name
  // still refers to this mapping, and it was never truncated; the error
  // names what is wrong.
  absl::Status Check() const;
  // Daemon side: true once the segment was found cut short under this
  // mapping (it then reads zeros: no doorbell, no heartbeat reaches anyone).
  bool Truncated() const { return truncation_guard_ && truncation_guard_->truncated(); }
  // Whether name() still refers to this mapping's object.
  bool StillNamed() const { return segment_.CheckStillNamed().ok(); }

  NodeSegmentHeader* header() const { return header_; }
  Doorbell& ready_bell() const { return header_->ready_bell; }
  const std::string& name() const { return segment_.name(); }

 private:
  SharedSegment segment_;
  // Declared after segment_: it must go before the mapping does.
  std::unique_ptr<TruncationGuard> truncation_guard_;
  NodeSegmentHeader* header_ = nullptr;
};

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_NODE_SEGMENT_H_
