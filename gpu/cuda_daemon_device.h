// gpu::DaemonDevice on the CUDA runtime, linked statically into gradsyncd
// (only the driver, libcuda.so.1, is needed where it runs), plus the
// daemon's own local-sum kernel (local_sum.cu). NCCL is not linked here:
// the collectives come from a factory (gpu/nccl_collectives loads NCCL at
// run time), so this device builds and is tested without it.
//
// GPUs are named by UUID (DeviceId) and mapped to this process's ordinals
// once, at creation. Every call selects its GPU with cudaSetDevice first and
// puts the previous device back only if the thread already had a context:
// "restoring" device 0 on a thread that never chose one would create a
// context on GPU 0 (review of nccl_backend, item 10).
//
// Invariants the caller keeps (CUDA can deadlock or corrupt otherwise):
//  - No Alloc, Free, OpenMemory or CloseMemory while a collective may be
//    running on any of the GPUs (cudaMalloc/cudaFree/cudaIpc*MemHandle can
//    wait on the running NCCL kernel, which waits on peers: NVIDIA/nccl#787).
//    Close and free only after the group collective returned or was aborted.
//  - OpenMemory is reference counted per handle (the same handle returns the
//    same base); the mapping goes at the last CloseMemory. Close exactly
//    once per successful Open.
//  - An opened event is closed (CloseEvent) before its trainer destroys it
//    where possible; a trainer that died leaves a handle the daemon may still
//    query (the result is then an error or kDone, never a wait).
//  - Nothing here synchronizes the host with the device except Alloc, which
//    polls its zeroing memset to completion within a bounded time (and
//    AllocHost/FreeHost, pinned host memory: memory work, gated like Alloc).
//  - A sticky CUDA error (illegal address, launch failure, ...) poisons the
//    process's contexts: every later call returns the same error, marked so
//    that IsCudaContextPoisoned() is true. The daemon must exit and let its
//    supervisor restart it; nothing re-initializes CUDA in process.
//
// Threads: the scheduler thread makes every call (device.h); the maps are
// locked anyway so a stray caller cannot corrupt them.
#ifndef GRADSYNC_GPU_CUDA_DAEMON_DEVICE_H_
#define GRADSYNC_GPU_CUDA_DAEMON_DEVICE_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/cuda_status.h"  // IsCudaContextPoisoned
#include "gpu/device.h"

namespace gradsync::gpu {

// Creates the NCCL communicators of one generation (gpu/nccl_collectives).
using CollectiveFactory =
    std::function<absl::StatusOr<std::unique_ptr<CollectiveGroup>>(const CollectiveOptions&)>;

// FAILED_PRECONDITION when the driver is missing or older than the runtime
// gradsyncd was built with, UNAVAILABLE when no GPU is visible; never
// aborts. `collectives` may be empty (CreateCollectives then fails). The
// device comes behind a GatedDaemonDevice: every job shares it.
absl::StatusOr<std::unique_ptr<DaemonDevice>> NewCudaDaemonDevice(CollectiveFactory collectives);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_CUDA_DAEMON_DEVICE_H_
