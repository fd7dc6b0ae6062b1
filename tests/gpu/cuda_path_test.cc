// The GPU data path on a real GPU: the release gradsyncd (CUDA + NCCL) and
// cuda_trainer processes through the exported C ABI — 1, 2 and 4 trainers
// sharing one GPU (the device-side local sum, then one NCCL rank), the
// flat-buffer and user-pointer modes, fp32 and bf16; and a trainer
// SIGKILLed mid-iteration, reported to its peers by name. Skips (saying why)
// where no GPU is visible; on simulated devices the same path is
// gpu_path_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/gpu/gpu_presence.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

std::vector<Process> StartTrainers(const Daemon& daemon, int trainers,
                                   const std::vector<std::string>& flags) {
  std::vector<Process> ps;
  for (int r = 0; r < trainers; ++r) {
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", std::to_string(r)}};
    std::vector<std::string> argv = {Runfile("tests/gpu/cuda_trainer"),
                                     "--socket=" + daemon.socket()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ps.push_back(Process::Spawn(argv, absl::StrCat(daemon.dir(), "/trainer", r, ".log"), options));
  }
  return ps;
}

Daemon GpuDaemon(int trainers) {
  return Daemon(trainers, {"--backend=nccl", "--timeout-s=60", "--bucket-cap-mb=0.5",
                           "--first-bucket-cap-mb=0.1"});
}

// (trainers sharing the GPU, "flat" | "user", "fp32" | "bf16")
class CudaPathTest : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(CudaPathTest, EveryTrainerHoldsTheAverageAfterEveryStep) {
  GS_SKIP_UNLESS_GPU();
  const auto& [trainers, mode, dtype] = GetParam();
  Daemon daemon = GpuDaemon(trainers);
  ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
  std::vector<Process> ps = StartTrainers(daemon, trainers, {"--mode=" + mode, "--dtype=" + dtype});
  for (int r = 0; r < trainers; ++r) {
    ExitStatus st = ps[r].Wait(seconds(120));
    EXPECT_TRUE(st.exited && st.code == 0) << "trainer " << r << "\n" << ps[r].Log()
                                           << "\ndaemon:\n" << daemon.process().Log();
    EXPECT_NE(ps[r].Log().find(absl::StrCat("world ", trainers)), std::string::npos)
        << ps[r].Log();
  }
  EXPECT_NE(daemon.process().Log().find("backend=gpu-cuda"), std::string::npos)
      << daemon.process().Log();
}

INSTANTIATE_TEST_SUITE_P(
    SharingOneGpu, CudaPathTest,
    ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values("flat", "user"),
                       ::testing::Values("fp32", "bf16")),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param), "Trainers_", std::get<1>(info.param), "_",
                          std::get<2>(info.param));
    });

TEST(CudaPathFaultTest, TrainerKilledMidIterationIsReportedToItsPeerByName) {
  GS_SKIP_UNLESS_GPU();
  Daemon daemon = GpuDaemon(2);
  ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
  std::vector<Process> ps;
  {
    std::vector<Process> survivor = StartTrainers(daemon, 1, {"--steps=5"});
    ps.push_back(std::move(survivor[0]));
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", "1"}};
    ps.push_back(Process::Spawn({Runfile("tests/gpu/cuda_trainer"), "--socket=" + daemon.socket(),
                                 "--steps=5", "--die-at-step=2"},
                                absl::StrCat(daemon.dir(), "/trainer1.log"), options));
  }
  ExitStatus dead = ps[1].Wait(seconds(120));
  EXPECT_TRUE(!dead.exited && !dead.timed_out && dead.code == SIGKILL)
      << dead.ToString() << "\n" << ps[1].Log();
  ExitStatus st = ps[0].Wait(seconds(120));
  ASSERT_TRUE(st.exited) << ps[0].Log();
  EXPECT_EQ(st.code, 2) << ps[0].Log();  // a call failed
  EXPECT_NE(ps[0].Log().find("error code=4"), std::string::npos) << ps[0].Log();  // PEER_FAILED
  EXPECT_NE(ps[0].Log().find("rank 1 (local 1"), std::string::npos) << ps[0].Log();
  // The daemon keeps serving: a fresh job on the same GPU trains.
  std::vector<Process> next = StartTrainers(daemon, 2, {"--steps=2"});
  for (int r = 0; r < 2; ++r) {
    ExitStatus s = next[r].Wait(seconds(120));
    EXPECT_TRUE(s.exited && s.code == 0) << next[r].Log() << "\ndaemon:\n" << daemon.process().Log();
  }
}

}  // namespace
}  // namespace gradsync::testing
