#include "gpu/sim/sim_current_device.h"

#include "absl/strings/str_cat.h"
#include "gpu/sim/sim_device.h"

namespace gradsync::gpu::sim {
namespace {

// -1: the thread never chose a device.
thread_local int chosen_device = -1;

}  // namespace

int ChosenDevice() { return chosen_device; }

void ChooseDevice(int device_index) { chosen_device = device_index; }

DeviceSwitch::DeviceSwitch(int device_index) : saved_(chosen_device) {
  chosen_device = device_index;
}

DeviceSwitch::~DeviceSwitch() {
  if (saved_ >= 0) chosen_device = saved_;
}

absl::Status CheckLaunchDevice(const std::string& what, int stream_device, int current_device) {
  if (stream_device == current_device) return absl::OkStatus();
  // The message format of CudaRuntimeError (gpu/cuda_status.h), which the
  // real path returns for the same launch.
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": kernel launch on a stream of ", SimDeviceId(stream_device),
      " while this thread's current device is ", SimDeviceId(current_device),
      " (cudaSetDevice first): cudaErrorInvalidResourceHandle (invalid resource handle)"));
}

}  // namespace gradsync::gpu::sim
