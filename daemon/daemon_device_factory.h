// The DaemonDevice a release gradsyncd uses. Built with CUDA + nvcc:
// gpu/cuda_daemon_device with NCCL's collectives from gpu/nccl_collectives
// (daemon_device_cuda.cc). Built without: daemon_device_unlinked.cc, which
// says so; gradsyncd then runs CPU-only (--backend=nccl is refused at start).
#ifndef GRADSYNC_DAEMON_DAEMON_DEVICE_FACTORY_H_
#define GRADSYNC_DAEMON_DAEMON_DEVICE_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<gpu::DaemonDevice>> NewReleaseDaemonDevice();

// Whether an error of that device left its context unusable (a sticky
// CUDA error): the daemon must exit and be restarted.
bool IsDeviceContextLost(const absl::Status& status);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_DAEMON_DEVICE_FACTORY_H_
