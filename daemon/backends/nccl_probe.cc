// nccl_probe: proves the GPU toolchain is wired in. Prints the NCCL and CUDA
// runtime versions and the number of visible devices. With no device (or no
// driver) it says so and exits 0: that is a valid machine for gradsync's CPU path.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>

int main() {
  int nccl_version = 0;
  if (ncclGetVersion(&nccl_version) != ncclSuccess) {
    std::fprintf(stderr, "nccl_probe: ncclGetVersion failed\n");
    return 1;
  }
  int runtime_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  std::printf("nccl_version=%d.%d.%d cuda_runtime=%d\n", nccl_version / 10000,
              (nccl_version / 100) % 100, nccl_version % 100, runtime_version);

  int devices = 0;
  cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess) {
    std::printf("devices=0 reason=\"%s\" (no usable GPU here; the CPU backend is used)\n",
                cudaGetErrorString(err));
    return 0;
  }
  std::printf("devices=%d\n", devices);
  return 0;
}
