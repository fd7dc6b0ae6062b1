// Segment names nobody can guess ahead of time:
// "<prefix>.<pid>.<tag>.<r>.pidns<inode>", r 64 bits from the kernel's
// CSPRNG. Predictable names let another user plant objects at them
// (creation is exclusive, so the daemon's create fails); the pid stays
// second and the pid namespace last so RemoveStaleSegments can judge them.
#ifndef GRADSYNC_IPC_RANDOM_SEGMENT_NAME_H_
#define GRADSYNC_IPC_RANDOM_SEGMENT_NAME_H_

#include <sys/types.h>

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace gradsync::ipc {

std::string RandomSegmentName(const std::string& prefix, pid_t daemon_pid, const std::string& tag);

// Calls `create` with fresh random names until one does not already exist
// (a collision means someone planted that exact name: try another), at most
// kRandomNameAttempts times; any other error is returned at once.
inline constexpr int kRandomNameAttempts = 8;
template <typename Segment>
absl::StatusOr<Segment> CreateUnderRandomName(
    const std::string& prefix, pid_t daemon_pid, const std::string& tag,
    const std::function<absl::StatusOr<Segment>(const std::string& name)>& create) {
  absl::Status last;
  for (int attempt = 0; attempt < kRandomNameAttempts; ++attempt) {
    absl::StatusOr<Segment> made = create(RandomSegmentName(prefix, daemon_pid, tag));
    if (made.ok() || made.status().code() != absl::StatusCode::kAlreadyExists) return made;
    last = made.status();
  }
  return absl::AlreadyExistsError(absl::StrCat(
      kRandomNameAttempts, " random segment names were all taken (last: ", last.message(), ")"));
}

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_RANDOM_SEGMENT_NAME_H_
