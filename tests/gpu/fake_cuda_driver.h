// What the fake CUDA driver (fake_cuda_driver.cc) records, for
// cuda_trainer_device_fake_test. The test reaches it with dlsym on the same
// library the device dlopen'ed ("fake_cuda_state").
#ifndef GRADSYNC_TESTS_GPU_FAKE_CUDA_DRIVER_H_
#define GRADSYNC_TESTS_GPU_FAKE_CUDA_DRIVER_H_

#include <cstddef>
#include <cstdint>

extern "C" {

struct FakeCudaState {
  int init_calls;
  int min_requested_version;   // over every cuGetProcAddress call
  int max_requested_version;
  uint64_t requested_flags_or;  // OR of the flags of every call
  int resolved;                 // symbols handed out
  int primary_retains;          // retain - release
  int ipc_opens;
  int ipc_closes;
  unsigned last_open_flags;
  int live_events;
  unsigned last_event_flags;
  void* last_stream;            // of the last cuEventRecord / cuMemsetD8Async
  int context_errors;           // calls that needed a current context and had none
};

// The state (reset by fake_cuda_reset, allocations included).
FakeCudaState* fake_cuda_state();
void fake_cuda_reset();
// Pretend [base, base + size) is a cudaMalloc allocation on ordinal 0.
void fake_cuda_add_allocation(void* base, size_t size, int ipc_capable);
// The calling thread's current context and context stack depth.
void* fake_cuda_current();
int fake_cuda_depth();
// Makes `ctx` the calling thread's current context (a trainer's own).
void fake_cuda_push(void* ctx);
void fake_cuda_pop();

}  // extern "C"

#endif  // GRADSYNC_TESTS_GPU_FAKE_CUDA_DRIVER_H_
