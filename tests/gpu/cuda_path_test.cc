// The GPU data path on a real GPU: the release gradsyncd (CUDA + NCCL) and
// cuda_trainer processes through the exported C ABI, one and two trainers
// per GPU, flat-buffer and user-pointer modes. Skips (saying why) where no
// GPU is visible; on simulated devices the same path is gpu_path_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

void RunJob(int trainers, const std::string& mode) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    GTEST_SKIP() << "no visible GPU";
  }
  Daemon daemon(trainers, {"--backend=nccl", "--timeout-s=60", "--bucket-cap-mb=0.5",
                           "--first-bucket-cap-mb=0.1"});
  ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
  std::vector<Process> ps;
  for (int r = 0; r < trainers; ++r) {
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", std::to_string(r)}};
    ps.push_back(Process::Spawn({Runfile("tests/gpu/cuda_trainer"), "--socket=" + daemon.socket(),
                                 "--mode=" + mode},
                                absl::StrCat(daemon.dir(), "/trainer", r, ".log"), options));
  }
  for (int r = 0; r < trainers; ++r) {
    ExitStatus st = ps[r].Wait(seconds(120));
    EXPECT_TRUE(st.exited && st.code == 0) << "trainer " << r << "\n" << ps[r].Log()
                                           << "\ndaemon:\n" << daemon.process().Log();
  }
  EXPECT_NE(daemon.process().Log().find("backend=gpu-cuda"), std::string::npos)
      << daemon.process().Log();
}

TEST(CudaPath, OneTrainerFlatBuffer) { RunJob(1, "flat"); }
TEST(CudaPath, TwoTrainersFlatBuffer) { RunJob(2, "flat"); }
TEST(CudaPath, TwoTrainersUserPointer) { RunJob(2, "user"); }

}  // namespace
}  // namespace gradsync::testing
