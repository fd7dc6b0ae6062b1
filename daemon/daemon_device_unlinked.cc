// NewReleaseDaemonDevice for a gradsyncd built without CUDA + NCCL (no
// toolkit or nvcc at build time, or --define=gpu=off): CPU tensors only.
#include "absl/status/status.h"
#include "daemon/daemon_device_factory.h"

namespace gradsync {

bool IsDeviceContextLost(const absl::Status&) { return false; }

absl::StatusOr<std::shared_ptr<gpu::DaemonDevice>> NewReleaseDaemonDevice() {
  return absl::UnimplementedError(
      "this gradsyncd was built without the CUDA + NCCL device: it synchronizes CPU tensors "
      "only");
}

}  // namespace gradsync
