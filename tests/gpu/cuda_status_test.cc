// CUDA runtime errors as statuses (gpu/cuda_status): no device needed, the
// runtime's error names are a table lookup.
#include "gpu/cuda_status.h"

#include "gtest/gtest.h"

namespace gradsync::gpu {
namespace {

TEST(CudaStatusTest, StickyErrorsAreMarkedPoisonedAndNameTheCall) {
  const absl::Status s =
      CudaRuntimeError(cudaErrorIllegalAddress, "nccl allreduce: cudaEventQuery");
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(IsCudaContextPoisoned(s)) << s;
  EXPECT_NE(s.message().find("nccl allreduce: cudaEventQuery"), std::string::npos) << s;
  EXPECT_NE(s.message().find("cudaErrorIllegalAddress"), std::string::npos) << s;
  EXPECT_TRUE(IsCudaContextPoisoned(CudaRuntimeError(cudaErrorLaunchFailure, "x")));
}

TEST(CudaStatusTest, OtherErrorsAreNotPoisoned) {
  const absl::Status bad = CudaRuntimeError(cudaErrorInvalidValue, "cudaMemcpyAsync");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IsCudaContextPoisoned(bad));
  EXPECT_NE(bad.message().find("cudaMemcpyAsync: cudaErrorInvalidValue"), std::string::npos) << bad;
  const absl::Status oom = CudaRuntimeError(cudaErrorMemoryAllocation, "cudaMalloc(8 bytes)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsCudaContextPoisoned(oom));
  EXPECT_FALSE(IsCudaContextPoisoned(absl::InternalError("cudaErrorIllegalAddress in text only")));
}

}  // namespace
}  // namespace gradsync::gpu
