// gs_register checks $WORLD_SIZE (torchrun's) against the gradsync job's
// world size: real gradsyncd, real mlp_trainer processes through
// the C client (mlp_trainer exits 10 + gs_status). A launcher that counts a
// different world is refused with GS_ERR_INVALID_ARGUMENT naming both
// sizes; an equal one trains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

Process StartTrainerWithWorldSize(const Daemon& daemon, int local_rank,
                                  const std::string& world_size) {
  SpawnOptions options;
  options.env = {{"LOCAL_RANK", std::to_string(local_rank)}, {"WORLD_SIZE", world_size}};
  return Process::Spawn({Runfile("tests/testing/fault_trainer"), "--socket=" + daemon.socket(),
                         "--quiet", "--steps=3"},
                        daemon.dir() + "/trainer" + std::to_string(local_rank) + ".log", options);
}

TEST(LauncherWorldSizeTest, AMismatchIsRefusedAtRegisterNamingBothSizes) {
  Daemon daemon(2);
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) trainers.push_back(StartTrainerWithWorldSize(daemon, r, "4"));
  // The first trainer to get its reply refuses and leaves; the job then
  // fails for a trainer still waiting in Register (PEER_FAILED, naming the
  // one that left). Either way no trainer trains with the wrong world.
  int refused = 0;
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(60));
    ASSERT_TRUE(st.exited) << st.ToString();
    if (st.code == kExitPeerFailed) continue;
    ++refused;
    EXPECT_EQ(st.code, kExitInvalidArgument) << trainers[r].Log();
    EXPECT_THAT(trainers[r].Log(), HasSubstr("$WORLD_SIZE is 4"));
    EXPECT_THAT(trainers[r].Log(), HasSubstr("gradsync job has 2 trainers"));
  }
  EXPECT_GE(refused, 1);
}

TEST(LauncherWorldSizeTest, AMatchingWorldSizeTrains) {
  Daemon daemon(2);
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) trainers.push_back(StartTrainerWithWorldSize(daemon, r, "2"));
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << trainers[r].Log();
  }
}

TEST(LauncherWorldSizeTest, ANonNumericWorldSizeIsRefusedQuotingIt) {
  Daemon daemon(1);
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  Process trainer = StartTrainerWithWorldSize(daemon, 0, "two");
  const ExitStatus st = trainer.Wait(seconds(60));
  EXPECT_TRUE(st.exited) << st.ToString();
  EXPECT_EQ(st.code, kExitInvalidArgument) << trainer.Log();
  EXPECT_THAT(trainer.Log(), HasSubstr("$WORLD_SIZE is 'two', not an integer"));
}

}  // namespace
}  // namespace gradsync::testing
