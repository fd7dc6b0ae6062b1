#include "gpu/device.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gradsync::gpu {

absl::StatusOr<IpcHandle> IpcHandle::FromBytes(const std::string& s) {
  if (s.size() != kSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("an IPC handle is ", kSize, " bytes, got ", s.size()));
  }
  IpcHandle h;
  std::copy(s.begin(), s.end(), h.bytes.begin());
  return h;
}

}  // namespace gradsync::gpu
