// The DaemonDevice a release gradsyncd uses: gpu/cuda_daemon_device
// (`NewCudaDaemonDevice(collective_factory)`) with NCCL's collectives from
// gpu/nccl_collectives (`CreateNcclCollectives`). Neither is merged into
// this tree yet, so the only definition linked is daemon_device_unlinked.cc,
// which says so: gradsyncd then runs CPU-only (--backend=nccl is refused at
// start). Replace it with the real factory when they land.
#ifndef GRADSYNC_DAEMON_DAEMON_DEVICE_FACTORY_H_
#define GRADSYNC_DAEMON_DAEMON_DEVICE_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<gpu::DaemonDevice>> NewReleaseDaemonDevice();

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_DAEMON_DEVICE_FACTORY_H_
