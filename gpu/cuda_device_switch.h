// Switches the calling thread's current CUDA device for a scope.
//
// Invariants (review of nccl_backend, item 10):
//  - cudaSetDevice is called only when the wanted device is not already
//    current (it initializes that GPU's primary context: CUDA >= 12).
//  - The previous device is put back at the end of the scope only if the
//    thread had a context before: cudaGetDevice answers 0 on a thread that
//    never chose a device, and "restoring" 0 would create a context (hundreds
//    of MiB) on GPU 0, which may be no GPU of this daemon's jobs.
// Not thread-safe: one per thread, on the stack.
#ifndef GRADSYNC_GPU_CUDA_DEVICE_SWITCH_H_
#define GRADSYNC_GPU_CUDA_DEVICE_SWITCH_H_

#include <cuda_runtime_api.h>

namespace gradsync::gpu {

class CudaDeviceSwitch {
 public:
  CudaDeviceSwitch();
  ~CudaDeviceSwitch();
  CudaDeviceSwitch(const CudaDeviceSwitch&) = delete;
  CudaDeviceSwitch& operator=(const CudaDeviceSwitch&) = delete;

  // Makes `ordinal` current on this thread (a no-op when it is).
  cudaError_t Use(int ordinal);

 private:
  int saved_ = -1;        // the thread's device at construction, -1 if unknown
  bool restore_ = false;  // the thread had a context: put saved_ back
  int current_ = -1;
};

// Whether the calling thread has a current CUDA context (it chose a device,
// or a library did). False when that cannot be told.
bool ThreadHasCudaContext();

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_CUDA_DEVICE_SWITCH_H_
