// NewDefaultTrainerDevice for a libgradsync built without CUDA (no
// toolkit at build time, or --define=gpu=off): CUDA tensors are refused.
#include "absl/status/status.h"
#include "client/trainer_device_factory.h"

namespace gradsync {

absl::StatusOr<std::shared_ptr<gpu::TrainerDevice>> NewDefaultTrainerDevice() {
  return absl::UnimplementedError(
      "this libgradsync was built without CUDA support: CUDA tensors cannot be registered");
}

}  // namespace gradsync
