// The calling thread's current simulated GPU, as the CUDA runtime keeps one
// per host thread (cudaSetDevice / cudaGetDevice): device 0 (this process's
// ordinal 0) until the thread chooses one. CUDA refuses a kernel launch on a
// stream of another device than the current one (CUDA C++ Programming
// Guide, "Stream and Event Behavior"), so the simulation must too, or a
// thread that forgot cudaSetDevice would pass every test and fail on a GPU.
//
// Process-wide per thread, like CUDA's (not per SimTrainerDevice).
#ifndef GRADSYNC_GPU_SIM_SIM_CURRENT_DEVICE_H_
#define GRADSYNC_GPU_SIM_SIM_CURRENT_DEVICE_H_

#include <string>

#include "absl/status/status.h"

namespace gradsync::gpu::sim {

// The GPU index this thread chose (cudaSetDevice), or -1 if it never chose
// one: CUDA then answers ordinal 0.
int ChosenDevice();
// cudaSetDevice: makes sim GPU `device_index` current on this thread.
void ChooseDevice(int device_index);

// What the real daemon's per-call device switch does (CudaDeviceSwitch):
// makes `device_index` current for the scope, and puts the previous device
// back only if the thread had chosen one: on a thread that never chose a
// device the switched-to device stays current, as on a GPU.
class DeviceSwitch {
 public:
  explicit DeviceSwitch(int device_index);
  ~DeviceSwitch();
  DeviceSwitch(const DeviceSwitch&) = delete;
  DeviceSwitch& operator=(const DeviceSwitch&) = delete;

 private:
  const int saved_;
};

// A kernel launch on a stream of `stream_device` while `current_device` is
// current: OK when they match, else INVALID_ARGUMENT with the error the
// runtime returns (cudaErrorInvalidResourceHandle), naming both GPUs.
absl::Status CheckLaunchDevice(const std::string& what, int stream_device, int current_device);

}  // namespace gradsync::gpu::sim

#endif  // GRADSYNC_GPU_SIM_SIM_CURRENT_DEVICE_H_
