// NewDefaultTrainerDevice where CUDA is built: the driver API through
// dlopen, so libgradsync still loads on machines without CUDA.
#include "client/trainer_device_factory.h"
#include "gpu/cuda_trainer_device.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<gpu::TrainerDevice>> NewDefaultTrainerDevice() {
  absl::StatusOr<std::unique_ptr<gpu::TrainerDevice>> device = gpu::NewCudaTrainerDevice();
  if (!device.ok()) return device.status();
  return std::shared_ptr<gpu::TrainerDevice>(std::move(*device));
}

}  // namespace gradsync
