// gpu::TrainerDevice on the CUDA driver API, for libgradsync (the trainer
// side of the GPU data path).
//
// The driver is loaded with dlopen (libcuda.so.1) when the first CUDA
// registration creates this device, never at link time: libgradsync.so
// loads and serves CPU gradients on machines without CUDA. Functions are
// resolved with cuGetProcAddress_v2 at the ABI of the headers we compiled
// against (capped at the driver's own version), so the _v2/_v3 variants
// behind cuda.h's macros are the ones called.
//
// Contexts: every call runs in the GPU's primary context (the one the CUDA
// runtime, hence PyTorch, uses: mappings and events are shared with the
// trainer's own work), pushed for the call and popped after, so the calling
// thread's current context is left as found. A primary context is retained
// the first time a GPU is used and released when the device is destroyed.
//
// Lifetimes the caller keeps (nothing here can check them):
//  - OpenMemory is reference counted per handle: opening the same handle
//    again returns the same base; the mapping goes away at the last
//    CloseMemory. Do not close while work this process queued still reads
//    or writes the mapping.
//  - An exported allocation (ExportMemory) and an exported event must stay
//    alive until the daemon has closed its side: freeing the memory, letting
//    a caching allocator reuse it, or destroying the event while the daemon
//    may use it is undefined behaviour in CUDA.
//  - RecordEvent is asynchronous: the event completes when the stream
//    reaches it. Nothing here ever synchronizes the host with the device.
//
// Thread-safe: PyTorch runs gradient hooks on autograd threads, not only on
// the thread that registered.
#ifndef GRADSYNC_GPU_CUDA_TRAINER_DEVICE_H_
#define GRADSYNC_GPU_CUDA_TRAINER_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace gradsync::gpu {

inline constexpr char kCudaDriverLibrary[] = "libcuda.so.1";

// Loads the driver (`driver_library`, a dlopen name or path; tests pass a
// bogus one) and initializes it. FAILED_PRECONDITION "CUDA driver
// (libcuda.so.1) not found: ..." when it cannot be loaded or is older than
// CUDA 12.0; UNAVAILABLE when cuInit fails (no device, driver/kernel module
// mismatch). Cheap after the first call in a process (the library stays
// loaded: the driver is never unloaded, other users share it).
absl::StatusOr<std::unique_ptr<TrainerDevice>> NewCudaTrainerDevice(
    const std::string& driver_library = kCudaDriverLibrary);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_CUDA_TRAINER_DEVICE_H_
