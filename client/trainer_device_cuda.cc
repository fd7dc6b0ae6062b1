// NewDefaultTrainerDevice where CUDA is built: the driver API through
// dlopen, so libgradsync still loads on machines without CUDA.
#include "client/trainer_device_factory.h"
#include "gpu/cuda_trainer_device.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<gpu::TrainerDevice>> NewDefaultTrainerDevice() {
  return gpu::NewCudaTrainerDevice();  // unique_ptr converts to shared_ptr; an error passes as is
}

}  // namespace gradsync
