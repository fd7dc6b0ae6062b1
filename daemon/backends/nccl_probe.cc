// nccl_probe: can this machine run gradsync's GPU path? Finds NCCL the way
// gradsyncd does (gpu/nccl_loader: $NCCL_LIB, $GRADSYNC_NCCL_PATH,
// $NCCL_HOME, then the system), then asks the CUDA driver for devices.
//
// Exit status (scripts rely on it):
//   0  usable: NCCL loaded and at least one GPU
//   2  no GPU here: no CUDA driver installed, or the driver sees no device
//      (a valid machine for the CPU path)
//   3  CUDA driver error: a driver is installed but unusable (too old for
//      this runtime, not initialized, ...); a GPU machine that needs fixing
//   4  a GPU is present but NCCL was not found or is unusable
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "gpu/nccl_loader.h"

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

  // The runtime reports a missing driver and a too-old one alike
  // (cudaErrorInsufficientDriver); whether libcuda.so.1 loads tells them
  // apart.
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    std::printf("devices=0 reason=\"no CUDA driver (libcuda.so.1: %s)\"\n", dlerror());
    return 2;
  }
  int driver_version = 0;
  cudaDriverGetVersion(&driver_version);
  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err == cudaErrorNoDevice || (err == cudaSuccess && devices == 0)) {
    std::printf("cuda_driver=%d devices=0 reason=\"no CUDA device\"\n", driver_version);
    return 2;
  }
  if (err != cudaSuccess) {
    std::printf("cuda_driver=%d devices=? error=\"%s: %s\"\n", driver_version,
                cudaGetErrorName(err), cudaGetErrorString(err));
    return 3;
  }
  std::printf("cuda_driver=%d devices=%d\n", driver_version, devices);
  return nccl.ok() ? 0 : 4;
}
