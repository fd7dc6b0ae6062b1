// NewReleaseDaemonDevice where CUDA + NCCL are built: the CUDA runtime
// device with NCCL's communicators (loaded with dlopen at run time).
#include "daemon/daemon_device_factory.h"
#include "gpu/cuda_daemon_device.h"
#include "gpu/nccl_collectives.h"

namespace gradsync {

bool IsDeviceContextLost(const absl::Status& status) { return gpu::IsCudaContextPoisoned(status); }

absl::StatusOr<std::shared_ptr<gpu::DaemonDevice>> NewReleaseDaemonDevice() {
  absl::StatusOr<std::unique_ptr<gpu::DaemonDevice>> device =
      gpu::NewCudaDaemonDevice(gpu::CreateNcclCollectives);
  if (!device.ok()) return device.status();
  // Called from main before the servers start: NCCL's environment is set
  // while no other thread can read it. No NCCL is not an error yet (only
  // a job that needs it fails, saying why).
  gpu::LoadNcclBeforeThreads().IgnoreError();
  return std::shared_ptr<gpu::DaemonDevice>(std::move(*device));
}

}  // namespace gradsync
