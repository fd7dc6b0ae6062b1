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

const CudaDeviceOps& RuntimeCudaDeviceOps() {
  static const CudaDeviceOps ops = {
      [](int* ordinal) { return cudaGetDevice(ordinal); },
      [](int ordinal) { return cudaSetDevice(ordinal); },
      ThreadHasCudaContext,
  };
  return ops;
}

CudaDeviceSwitch::CudaDeviceSwitch(const CudaDeviceOps& ops) : ops_(ops) {
  // Without a context cudaGetDevice says 0 whatever will run: nothing is
  // known current, and nothing is restored.
  restore_ = ops_.thread_has_context() && ops_.get_device(&saved_) == cudaSuccess;
  if (!restore_) saved_ = -1;
  current_ = saved_;
}

CudaDeviceSwitch::~CudaDeviceSwitch() {
  if (restore_ && current_ != saved_) ops_.set_device(saved_);
}

cudaError_t CudaDeviceSwitch::Use(int ordinal) {
  if (current_ >= 0 && ordinal == current_) return cudaSuccess;
  const cudaError_t err = ops_.set_device(ordinal);
  if (err == cudaSuccess) current_ = ordinal;
  return err;
}

}  // namespace gradsync::gpu
