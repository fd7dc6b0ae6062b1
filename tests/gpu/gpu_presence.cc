#include "tests/gpu/gpu_presence.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda_runtime_api.h"

namespace gradsync::testing {

GpuPresence ProbeGpu(std::string* why) {
  // No driver library at all: a machine without a GPU (CI, a laptop).
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    *why = "no CUDA driver on this machine (libcuda.so.1 does not load)";
    return GpuPresence::kAbsent;
  }
  dlclose(driver);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return GpuPresence::kPresent;
  if (e == cudaSuccess || e == cudaErrorNoDevice) {
    *why = "the CUDA driver sees no device (CUDA_VISIBLE_DEVICES, or no GPU)";
    return GpuPresence::kAbsent;
  }
  // The toolkit's link stub stands in for a driver on build machines.
  if (e == cudaErrorStubLibrary) {
    *why = "only the CUDA toolkit's stub libcuda is here, no driver";
    return GpuPresence::kAbsent;
  }
  *why =
      absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  return GpuPresence::kBroken;
}

bool GpuRequired() {
  const char* v = std::getenv("GRADSYNC_REQUIRE_GPU");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

}  // namespace gradsync::testing
