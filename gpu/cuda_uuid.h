// A GPU's DeviceId from its 16-byte UUID, in nvidia-smi's spelling
// ("GPU-8f6c1e2a-3b4d-5e6f-7a8b-9c0d1e2f3a4b"), the form CUDA_VISIBLE_DEVICES
// also accepts. The trainer (driver API, cuDeviceGetUuid_v2) and the daemon
// (runtime, cudaDeviceProp::uuid) both name GPUs through this one function,
// so the two sides agree byte for byte whatever their CUDA_VISIBLE_DEVICES.
// No CUDA dependency: testable on machines without a GPU.
#ifndef GRADSYNC_GPU_CUDA_UUID_H_
#define GRADSYNC_GPU_CUDA_UUID_H_

#include <string>

#include "gpu/device.h"

namespace gradsync::gpu {

// `bytes` points at 16 bytes (CUuuid::bytes / cudaUUID_t::bytes).
DeviceId FormatGpuUuid(const void* bytes);

// Whether two ids name one GPU. The hex digits compare without case (a user
// may copy an id in upper case), the "GPU-" prefix too.
bool SameGpu(const DeviceId& a, const DeviceId& b);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_CUDA_UUID_H_
