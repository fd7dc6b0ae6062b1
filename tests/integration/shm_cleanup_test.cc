// The harness removes what its daemons left in /dev/shm: a daemon killed
// with SIGKILL cannot remove its segments, no later daemon sweeps a test's
// private prefix, and thousands of leftovers slow every daemon's start-up
// sweep and fill /dev/shm. Real daemons, trainers and shared memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "tests/integration/harness.h"
#include "tests/testing/shm_entries.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr auto kBound = seconds(30);

// Two trainers stopped at backward on `daemon`: registered, so the daemon
// created a segment for each next to its node segment.
std::vector<Process> TrainersStoppedAtBackward(Daemon& daemon) {
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(StartTrainer(daemon, r, {"--steps=3", "--pause-at=backward"}, ""));
  }
  for (Process& t : trainers) {
    EXPECT_TRUE(WaitStopped(t, kBound)) << t.Log() << daemon.process().Log();
  }
  return trainers;
}

TEST(ShmCleanupTest, ASigkilledDaemonAndItsTrainersLeaveNoSegmentOfTheTestsPrefix) {
  std::string prefix;
  {
    Daemon daemon(2, {"--timeout-s=20"});
    prefix = daemon.shm_prefix();
    ASSERT_TRUE(daemon.WaitReady(kBound)) << daemon.process().Log();
    std::vector<Process> trainers = TrainersStoppedAtBackward(daemon);
    daemon.process().Signal(SIGKILL);
    daemon.process().Wait(kBound);
    for (Process& t : trainers) ASSERT_TRUE(t.Kill().ok());
    // The kills left the node segment and one per trainer behind...
    EXPECT_THAT(ShmEntriesOfPrefix(prefix), SizeIs(3))
        << absl::StrJoin(ShmEntriesOfPrefix(prefix), " ");
  }
  // ...and the harness' teardown removed every one of them.
  EXPECT_THAT(ShmEntriesOfPrefix(prefix), IsEmpty())
      << "left after teardown: " << absl::StrJoin(ShmEntriesOfPrefix(prefix), " ");
}

TEST(ShmCleanupTest, TeardownKeepsTheSegmentsOfADaemonWhosePrefixExtendsItsOwn) {
  auto killed = std::make_unique<Daemon>(1, std::vector<std::string>{"--timeout-s=20"});
  // "<prefix>0" starts with the killed daemon's prefix: only the dot after
  // a prefix tells the two apart.
  Daemon live(2, {"--timeout-s=20", "--shm-prefix=" + killed->shm_prefix() + "0"});
  ASSERT_TRUE(killed->WaitReady(kBound)) << killed->process().Log();
  ASSERT_TRUE(live.WaitReady(kBound)) << live.process().Log();
  const std::vector<std::string> before = ShmEntriesOfPrefix(live.shm_prefix());
  ASSERT_THAT(before, SizeIs(1)) << "the live daemon's node segment";
  killed->process().Signal(SIGKILL);
  killed->process().Wait(kBound);
  const std::string killed_prefix = killed->shm_prefix();
  killed.reset();
  EXPECT_THAT(ShmEntriesOfPrefix(killed_prefix), IsEmpty());
  EXPECT_EQ(ShmEntriesOfPrefix(live.shm_prefix()), before);
  // It still serves a job through the segment it kept.
  ExpectTrains(live, 2, "the daemon beside the killed one");
}

}  // namespace
}  // namespace gradsync::testing
