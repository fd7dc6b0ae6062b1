// gradsyncd --check-replicas-every with real daemons and trainer processes
// (tests/integration/replica_trainer.c): replicas that stay equal pass
// every check; one trainer whose parameter drifted fails the job with
// MISMATCH naming the tensor and the trainers on each side, on every
// trainer; the flag is refused on a multi-node job at start.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);

Process StartReplica(const Daemon& daemon, int local_rank, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile("tests/integration/replica_trainer"),
                                   "--socket=" + daemon.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions options;
  options.env = {{"LOCAL_RANK", std::to_string(local_rank)}};
  return Process::Spawn(
      argv, absl::StrCat(daemon.dir(), "/replica", local_rank, ".", rand(), ".log"), options);
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(ReplicaCheck, EqualReplicasPassEveryCheck) {
  Daemon daemon(3, {"--timeout-s=30", "--check-replicas-every=2"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> ps;
  for (int r = 0; r < 3; ++r) ps.push_back(StartReplica(daemon, r, {"--steps=7"}));
  for (int r = 0; r < 3; ++r) {
    const ExitStatus st = ps[r].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " " << st.ToString() << "\n"
                                           << ps[r].Log() << "\n"
                                           << daemon.process().Log();
    const std::string log = ps[r].Log();
    for (int it : {2, 4, 6}) {
      EXPECT_NE(log.find(absl::StrCat("check ok rank=", r, " iteration=", it, "\n")),
                std::string::npos)
          << log;
    }
    EXPECT_EQ(Count(log, "check ok"), 3u) << log;
  }
  EXPECT_EQ(Count(daemon.process().Log(), "event=replicas_equal"), 3u) << daemon.process().Log();
}

// Rank 2's fc.weight drifts after step 3: the check after iteration 2
// passes, the one after iteration 4 fails every trainer with MISMATCH
// naming fc.weight, rank 0 (the reference) and rank 2.
TEST(ReplicaCheck, DriftedReplicaIsNamed) {
  Daemon daemon(3, {"--timeout-s=30", "--check-replicas-every=2"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> ps;
  for (int r = 0; r < 3; ++r) {
    ps.push_back(StartReplica(daemon, r, {"--steps=8", "--drift-rank=2", "--drift-at=3"}));
  }
  for (int r = 0; r < 3; ++r) {
    const ExitStatus st = ps[r].Wait(kBound);
    const std::string log = ps[r].Log();
    ASSERT_TRUE(st.exited) << st.ToString() << "\n" << log;
    EXPECT_EQ(st.code, kExitMismatch) << log << "\n" << daemon.process().Log();
    EXPECT_NE(log.find(absl::StrCat("check ok rank=", r, " iteration=2\n")), std::string::npos)
        << log;
    EXPECT_NE(log.find("replicas differ after iteration 4: tensor 'fc.weight' (index 1)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("on rank 0 (local 0, pid"), std::string::npos) << log;
    EXPECT_NE(log.find("on rank 2 (local 2, pid"), std::string::npos) << log;
    EXPECT_NE(log.find("on node 0"), std::string::npos) << log;
    EXPECT_EQ(log.find("rank 1 (local 1"), std::string::npos) << log;
    EXPECT_EQ(log.find("iteration=4"), std::string::npos) << log;
  }
}

// The flag is checked at start: a multi-node job is refused (exit 2) with a
// line naming the flag and saying it is one node only.
TEST(ReplicaCheck, MultiNodeJobIsRefusedAtStart) {
  Daemon daemon(1, {"--num-nodes=2", "--node-rank=1", "--leader=127.0.0.1:1", "--insecure",
                    "--check-replicas-every=2"});
  const ExitStatus st = daemon.process().Wait(seconds(30));
  const std::string log = daemon.process().Log();
  ASSERT_TRUE(st.exited) << st.ToString() << "\n" << log;
  EXPECT_EQ(st.code, 2) << log;
  EXPECT_NE(log.find("--check-replicas-every 2 is supported on one node only"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace gradsync::testing
