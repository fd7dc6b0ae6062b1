// TruncationGuard: keeps a shared mapping whose object shrinks under this
// process (anyone who can open a segment can ftruncate it) from killing the
// process with SIGBUS.
//
// A MAP_SHARED page past the end of its object raises SIGBUS when touched.
// One process-wide handler looks the faulting address up among the guarded
// mappings. Inside one, it maps private zero pages over the rest of that
// mapping (from the faulting page to its end: a truncation only cuts the
// tail) and marks the guard truncated; the access then completes on memory
// nobody else sees, and the owner, which checks truncated() wherever it
// trusts what it read, fails only what used that mapping. Anywhere else the
// previous disposition comes back and the fault recurs under it: a genuine
// bug still crashes.
//
// Cost: nothing per access; truncated() is one atomic load. Registering and
// unregistering take no lock (the handler reads the same table).
//
// Threads: any. A guard must be destroyed before its mapping is unmapped
// (the handler would otherwise map zero pages over whatever took the
// address), so owners declare it after the mapping they guard.
#ifndef GRADSYNC_IPC_TRUNCATION_GUARD_H_
#define GRADSYNC_IPC_TRUNCATION_GUARD_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace gradsync::ipc {

class TruncationGuard {
 public:
  // Mappings guarded at once, process-wide (a daemon guards one segment per
  // trainer of its job, plus its node segments).
  static constexpr int kMaxGuards = 4096;

  // Guards [begin, begin + bytes), `begin` page-aligned (a mapping's start).
  // Installs the handler on first use. RESOURCE_EXHAUSTED when kMaxGuards
  // mappings are guarded already.
  static absl::StatusOr<std::unique_ptr<TruncationGuard>> Watch(void* begin, size_t bytes);

  ~TruncationGuard();
  TruncationGuard(const TruncationGuard&) = delete;
  TruncationGuard& operator=(const TruncationGuard&) = delete;

  // True once a SIGBUS hit the mapping: from then on it reads zeros where
  // the object was cut off, and writes there reach nobody.
  bool truncated() const;

 private:
  explicit TruncationGuard(int slot) : slot_(slot) {}
  const int slot_;
};

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_TRUNCATION_GUARD_H_
