#include "gpu/cuda_device_switch.h"

#include <cuda.h>  // CUcontext, for the one driver entry point used (cuCtxGetCurrent)

namespace gradsync::gpu {
namespace {

// cuCtxGetCurrent through the runtime (no libcuda link).
using CtxGetCurrentFn = CUresult (*)(CUcontext*);
CtxGetCurrentFn CtxGetCurrent() {
  static const CtxGetCurrentFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<CtxGetCurrentFn>(nullptr);
    }
    return reinterpret_cast<CtxGetCurrentFn>(p);
  }();
  return fn;
}

}  // namespace

bool ThreadHasCudaContext() {
  CtxGetCurrentFn get = CtxGetCurrent();
  CUcontext current = nullptr;
  // Unknown: say no, so nothing is "restored" onto a context never chosen.
  return get != nullptr && get(&current) == CUDA_SUCCESS && current != nullptr;
}

CudaDeviceSwitch::CudaDeviceSwitch() {
  if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
  current_ = saved_;
  restore_ = saved_ >= 0 && ThreadHasCudaContext();
}

CudaDeviceSwitch::~CudaDeviceSwitch() {
  if (restore_ && current_ != saved_) cudaSetDevice(saved_);
}

cudaError_t CudaDeviceSwitch::Use(int ordinal) {
  if (ordinal == current_) return cudaSuccess;
  const cudaError_t err = cudaSetDevice(ordinal);
  if (err == cudaSuccess) current_ = ordinal;
  return err;
}

}  // namespace gradsync::gpu
