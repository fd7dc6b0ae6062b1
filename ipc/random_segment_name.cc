#include "ipc/random_segment_name.h"

#include "common/secure_random.h"
#include "ipc/shared_segment.h"

namespace gradsync::ipc {

std::string RandomSegmentName(const std::string& prefix, pid_t daemon_pid, const std::string& tag) {
  return SegmentName(prefix, daemon_pid, absl::StrCat(tag, ".", SecureRandomHex()));
}

}  // namespace gradsync::ipc
