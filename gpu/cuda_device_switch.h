// Switches the calling thread's current CUDA device for a scope.
//
// Invariants:
//  - cudaSetDevice is skipped only when the wanted device is known to be
//    current: the thread has a context and cudaGetDevice names that device.
//    On a thread without a context cudaGetDevice answers 0 all the same, so
//    Use(0) there still calls cudaSetDevice(0) (with CUDA >= 12 that is what
//    creates and binds the primary context, and reports a failure there
//    rather than at the first real call).
//  - The previous device is put back at the end of the scope only if the
//    thread had a context before and the device changed: "restoring" the 0
//    that cudaGetDevice answers on a context-less thread would create a
//    context (hundreds of MiB) on GPU 0, which may be no GPU of this
//    daemon's jobs.
// Not thread-safe: one per thread, on the stack.
#ifndef GRADSYNC_GPU_CUDA_DEVICE_SWITCH_H_
#define GRADSYNC_GPU_CUDA_DEVICE_SWITCH_H_

#include <cuda_runtime_api.h>

namespace gradsync::gpu {

// Whether the calling thread has a current CUDA context (it chose a device,
// or a library did). False when that cannot be told.
bool ThreadHasCudaContext();

// The runtime calls a switch makes; tests replace them to check the logic
// without a GPU.
struct CudaDeviceOps {
  cudaError_t (*get_device)(int* ordinal);
  cudaError_t (*set_device)(int ordinal);
  bool (*thread_has_context)();
};

// cudaGetDevice, cudaSetDevice, ThreadHasCudaContext.
const CudaDeviceOps& RuntimeCudaDeviceOps();

class CudaDeviceSwitch {
 public:
  CudaDeviceSwitch() : CudaDeviceSwitch(RuntimeCudaDeviceOps()) {}
  explicit CudaDeviceSwitch(const CudaDeviceOps& ops);
  ~CudaDeviceSwitch();
  CudaDeviceSwitch(const CudaDeviceSwitch&) = delete;
  CudaDeviceSwitch& operator=(const CudaDeviceSwitch&) = delete;

  // Makes `ordinal` current on this thread (a no-op when it is known to be).
  cudaError_t Use(int ordinal);

 private:
  const CudaDeviceOps ops_;  // a copy: callers may pass a temporary
  int saved_ = -1;           // the thread's device at construction; -1: it had no context
  bool restore_ = false;     // the thread had a context: put saved_ back
  int current_ = -1;         // what this switch knows is current; -1: nothing yet
};

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_CUDA_DEVICE_SWITCH_H_
