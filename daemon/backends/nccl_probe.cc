// nccl_probe: can this machine run gradsync's GPU path? Finds NCCL the way
// gradsyncd does (gpu/nccl_loader: $NCCL_LIB, $GRADSYNC_NCCL_PATH,
// $NCCL_HOME, then the system), then asks the CUDA driver for devices.
// Exit status (scripts rely on it): gpu/probe_exit.h.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "gpu/nccl_loader.h"
#include "gpu/nccl_version.h"
#include "gpu/probe_exit.h"

int main() {
  using gradsync::gpu::LoadNccl;
  using gradsync::gpu::NcclSearchFromEnv;
  using gradsync::gpu::NcclVersionString;

  std::printf("nccl_header=%s cuda_runtime=%d\n", NcclVersionString(NCCL_VERSION_CODE).c_str(),
              CUDART_VERSION);
  absl::StatusOr<gradsync::gpu::NcclApi> nccl = LoadNccl(NcclSearchFromEnv());
  if (nccl.ok()) {
    std::printf("nccl_library=%s path=%s\n", NcclVersionString(nccl->version).c_str(),
                nccl->path.c_str());
  } else {
    std::printf("nccl_library=none error=\"%s\"\n", std::string(nccl.status().message()).c_str());
  }

  gradsync::gpu::ProbeFindings found;
  found.nccl_usable = nccl.ok();
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  found.driver_loaded = driver != nullptr;
  if (!found.driver_loaded) {
    std::printf("devices=0 reason=\"no CUDA driver (libcuda.so.1: %s)\"\n", dlerror());
    return gradsync::gpu::ProbeExitCode(found);
  }
  int driver_version = 0;
  if (cudaDriverGetVersion(&driver_version) != cudaSuccess) driver_version = -1;
  found.device_count_error = cudaGetDeviceCount(&found.device_count);
  const gradsync::gpu::ProbeExit code = gradsync::gpu::ProbeExitCode(found);
  if (code == gradsync::gpu::kProbeNoGpu) {
    std::printf("cuda_driver=%d devices=0 reason=\"no CUDA device\"\n", driver_version);
  } else if (code == gradsync::gpu::kProbeDriverError) {
    std::printf("cuda_driver=%d devices=? error=\"%s: %s\"\n", driver_version,
                cudaGetErrorName(found.device_count_error),
                cudaGetErrorString(found.device_count_error));
  } else {
    std::printf("cuda_driver=%d devices=%d\n", driver_version, found.device_count);
  }
  return code;
}
