// CUDA runtime errors as absl::Status, naming the call, with sticky errors
// marked. Shared by every file that calls the CUDA runtime in the daemon
// (cuda_daemon_device, nccl_collectives), so that a sticky error reaches the
// scheduler marked whichever layer saw it first.
//
// Sticky errors (illegal address, launch failure, ...) poison every context
// of the process: every later CUDA call fails the same way. The daemon then
// fails the job and exits; nothing re-initializes CUDA in process.
#ifndef GRADSYNC_GPU_CUDA_STATUS_H_
#define GRADSYNC_GPU_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gradsync::gpu {

// "cudaErrorX (description)".
std::string DescribeCudaError(cudaError_t err);

// Whether `err` leaves the process's CUDA contexts unusable.
bool IsStickyCudaError(cudaError_t err);

// "what: cudaErrorX (description)": INVALID_ARGUMENT for bad values or
// handles, RESOURCE_EXHAUSTED for out of memory / mappings, INTERNAL
// otherwise; a sticky error is INTERNAL and marked (IsCudaContextPoisoned).
// `err` must not be cudaSuccess.
absl::Status CudaRuntimeError(cudaError_t err, absl::string_view what);

// Whether `status` came from a sticky CUDA error: the process must exit.
bool IsCudaContextPoisoned(const absl::Status& status);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_CUDA_STATUS_H_
