// UNFINISHED on purpose: NewReleaseDaemonDevice for a gradsyncd built
// without gpu/cuda_daemon_device + gpu/nccl_collectives (not merged yet).
#include "absl/status/status.h"
#include "daemon/daemon_device_factory.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<gpu::DaemonDevice>> NewReleaseDaemonDevice() {
  return absl::UnimplementedError(
      "this gradsyncd was built without the CUDA + NCCL device (gpu/cuda_daemon_device is not "
      "linked): it synchronizes CPU tensors only");
}

}  // namespace gradsync
