#include "gpu/device.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace gradsync::gpu {
namespace {
constexpr char kDeviceLostPayload[] = "type.gradsync.dev/device-lost";
}  // namespace

absl::Status MarkDeviceLost(absl::Status status) {
  if (!status.ok()) status.SetPayload(kDeviceLostPayload, absl::Cord("1"));
  return status;
}

bool IsDeviceLost(const absl::Status& status) {
  return status.GetPayload(kDeviceLostPayload).has_value();
}

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
