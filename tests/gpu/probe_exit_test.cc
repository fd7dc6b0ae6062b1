// nccl_probe's exit status (gpu/probe_exit): no device needed.
#include "gpu/probe_exit.h"

#include "gtest/gtest.h"

namespace gradsync::gpu {
namespace {

ProbeFindings Found(bool driver, cudaError_t err, int devices, bool nccl) {
  ProbeFindings f;
  f.driver_loaded = driver;
  f.device_count_error = err;
  f.device_count = devices;
  f.nccl_usable = nccl;
  return f;
}

TEST(ProbeExitTest, AGpuAndNcclIsUsable) {
  EXPECT_EQ(ProbeExitCode(Found(true, cudaSuccess, 2, true)), kProbeUsable);
  EXPECT_EQ(static_cast<int>(kProbeUsable), 0);
}

TEST(ProbeExitTest, NoDriverOrNoDeviceIsNoGpu) {
  // Without libcuda.so.1 the runtime says cudaErrorInsufficientDriver too.
  EXPECT_EQ(ProbeExitCode(Found(false, cudaErrorInsufficientDriver, 0, true)), kProbeNoGpu);
  EXPECT_EQ(ProbeExitCode(Found(true, cudaErrorNoDevice, 0, true)), kProbeNoGpu);
  EXPECT_EQ(ProbeExitCode(Found(true, cudaSuccess, 0, true)), kProbeNoGpu);
  EXPECT_EQ(ProbeExitCode(Found(true, cudaErrorStubLibrary, 0, true)), kProbeNoGpu);
  // A machine without a GPU is fine for the CPU path whether NCCL is there.
  EXPECT_EQ(ProbeExitCode(Found(true, cudaErrorNoDevice, 0, false)), kProbeNoGpu);
  EXPECT_EQ(static_cast<int>(kProbeNoGpu), 2);
}

TEST(ProbeExitTest, AnInstalledDriverThatFailsIsADriverErrorNotFine) {
  for (cudaError_t err :
       {cudaErrorInsufficientDriver, cudaErrorInitializationError, cudaErrorDevicesUnavailable,
        cudaErrorSystemNotReady, cudaErrorSystemDriverMismatch, cudaErrorCompatNotSupportedOnDevice,
        cudaErrorUnknown}) {
    EXPECT_EQ(ProbeExitCode(Found(true, err, 0, true)), kProbeDriverError) << err;
    EXPECT_EQ(ProbeExitCode(Found(true, err, 0, false)), kProbeDriverError) << err;
  }
  EXPECT_EQ(static_cast<int>(kProbeDriverError), 3);
}

TEST(ProbeExitTest, AGpuWithoutNccl) {
  EXPECT_EQ(ProbeExitCode(Found(true, cudaSuccess, 1, false)), kProbeNoNccl);
  EXPECT_EQ(static_cast<int>(kProbeNoNccl), 4);
}

}  // namespace
}  // namespace gradsync::gpu
