// UNFINISHED on purpose: the definition of NewDefaultTrainerDevice for a
// libgradsync built without gpu/cuda_trainer_device (not merged into this
// tree yet). Replace this file's target with the CUDA one once it is.
#include "absl/status/status.h"
#include "client/trainer_device_factory.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<gpu::TrainerDevice>> NewDefaultTrainerDevice() {
  return absl::UnimplementedError(
      "this libgradsync was built without CUDA support (gpu/cuda_trainer_device is not linked): "
      "CUDA tensors cannot be registered");
}

}  // namespace gradsync
