#include "gpu/probe_exit.h"

namespace gradsync::gpu {

ProbeExit ProbeExitCode(const ProbeFindings& found) {
  if (!found.driver_loaded) return kProbeNoGpu;
  const cudaError_t err = found.device_count_error;
  // The toolkit's link stub loaded as libcuda.so.1 stands in for a driver on
  // build machines: no GPU either.
  if (err == cudaErrorNoDevice || err == cudaErrorStubLibrary ||
      (err == cudaSuccess && found.device_count <= 0)) {
    return kProbeNoGpu;
  }
  // Anything else the driver says is a GPU machine that needs fixing, never
  // "fine": cudaErrorInsufficientDriver with libcuda present is an old driver.
  if (err != cudaSuccess) return kProbeDriverError;
  return found.nccl_usable ? kProbeUsable : kProbeNoNccl;
}

}  // namespace gradsync::gpu
