// nccl_probe's exit status from what it found. Scripts (gpu-check.sh,
// demo.sh) branch on it, so "no GPU here" (a valid CPU machine) must never
// be confused with a driver that is installed but broken, and neither may
// pass as usable.
//
//   0  kProbeUsable       NCCL loaded and at least one GPU
//   2  kProbeNoGpu        no CUDA driver installed (or only the toolkit's
//                         stub), or the driver sees no device
//   3  kProbeDriverError  a driver is installed but unusable (too old for
//                         this runtime, not initialized, devices busy, ...)
//   4  kProbeNoNccl       a GPU is present but NCCL was not found or is
//                         unusable
#ifndef GRADSYNC_GPU_PROBE_EXIT_H_
#define GRADSYNC_GPU_PROBE_EXIT_H_

#include <cuda_runtime_api.h>

namespace gradsync::gpu {

enum ProbeExit : int {
  kProbeUsable = 0,
  kProbeNoGpu = 2,
  kProbeDriverError = 3,
  kProbeNoNccl = 4,
};

struct ProbeFindings {
  // Whether libcuda.so.1 loads: the runtime reports a missing driver and a
  // too-old one alike (cudaErrorInsufficientDriver), this tells them apart.
  bool driver_loaded = false;
  cudaError_t device_count_error = cudaSuccess;  // from cudaGetDeviceCount
  int device_count = 0;
  bool nccl_usable = false;
};

ProbeExit ProbeExitCode(const ProbeFindings& found);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_PROBE_EXIT_H_
