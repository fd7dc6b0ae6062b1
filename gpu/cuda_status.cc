#include "gpu/cuda_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace gradsync::gpu {
namespace {

constexpr char kPoisonedPayload[] = "type.gradsync.dev/cuda-context-poisoned";

}  // namespace

std::string DescribeCudaError(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

bool IsStickyCudaError(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

absl::Status CudaRuntimeError(cudaError_t err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", DescribeCudaError(err));
  if (IsStickyCudaError(err)) {
    absl::Status s = absl::InternalError(absl::StrCat(
        msg,
        "; the CUDA context is poisoned (sticky error): gradsyncd must exit and be restarted"));
    s.SetPayload(kPoisonedPayload, absl::Cord("1"));
    return s;
  }
  switch (err) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(msg);
    case cudaErrorMemoryAllocation:
    case cudaErrorMapBufferObjectFailed:
    case cudaErrorTooManyPeers:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

bool IsCudaContextPoisoned(const absl::Status& status) {
  return status.GetPayload(kPoisonedPayload).has_value();
}

}  // namespace gradsync::gpu
