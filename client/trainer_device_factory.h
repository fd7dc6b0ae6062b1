// The TrainerDevice a release libgradsync uses for CUDA tensors.
//
// Built with CUDA: gpu/cuda_trainer_device (trainer_device_cuda.cc; the
// driver API through dlopen, so libgradsync loads on machines without
// CUDA). Built without: trainer_device_unlinked.cc, which says so (CUDA
// registrations fail with UNIMPLEMENTED). Tests never come through here:
// they pass a simulated device in ConnectOptions::device (the C++ API; the
// exported C ABI cannot select it).
#ifndef GRADSYNC_CLIENT_TRAINER_DEVICE_FACTORY_H_
#define GRADSYNC_CLIENT_TRAINER_DEVICE_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace gradsync {

// Called once per client, at the first CUDA registration.
absl::StatusOr<std::shared_ptr<gpu::TrainerDevice>> NewDefaultTrainerDevice();

}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_TRAINER_DEVICE_FACTORY_H_
