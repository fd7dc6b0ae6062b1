// gs_broadcast with real daemons and trainer processes
// (tests/integration/broadcast_trainer.c): every trainer ends with the
// root's bytes, byte for byte, for 0 B, 1 B, an odd size and 100 MB (25
// pieces), on one node and across two nodes of two trainers each, from a
// root on either node; then an iteration still averages. And the misuses
// and faults: sizes or roots that differ, a trainer mid-iteration, a
// trainer killed while the others wait in the broadcast.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"
#include "tests/testing/files.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(120);
const std::string kSizes = "--sizes=0,1,4099,104857600";

Process StartBroadcaster(const Daemon& daemon, int local_rank,
                         const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile("tests/integration/broadcast_trainer"),
                                   "--socket=" + daemon.socket()};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions options;
  options.env = {{"LOCAL_RANK", std::to_string(local_rank)}};
  return Process::Spawn(
      argv, absl::StrCat(daemon.dir(), "/broadcaster", local_rank, ".", rand(), ".log"), options);
}

// Every trainer exits 0 having broadcast `bytes` (the largest size) and
// averaged an iteration after the broadcasts.
void ExpectAllSucceed(std::vector<Process>& ps, const std::string& logs,
                      const std::string& bytes = "104857600") {
  for (size_t r = 0; r < ps.size(); ++r) {
    const ExitStatus st = ps[r].Wait(kBound);
    EXPECT_TRUE(st.exited && st.code == 0) << "trainer " << r << " " << st.ToString() << "\n"
                                           << ps[r].Log() << "\n"
                                           << logs;
    EXPECT_NE(ps[r].Log().find("broadcast ok rank=" + std::to_string(r) + " bytes=" + bytes + " "),
              std::string::npos)
        << ps[r].Log();
    EXPECT_NE(ps[r].Log().find("iteration ok"), std::string::npos) << ps[r].Log();
  }
}

TEST(BroadcastOneNode, EveryTrainerGetsTheRootsBytes) {
  Daemon daemon(2, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) ps.push_back(StartBroadcaster(daemon, r, {kSizes, "--roots=0,1"}));
  ExpectAllSucceed(ps, daemon.process().Log());
}

// Back-to-back broadcasts of at most one piece (4 MiB) take one call each
// (the root fills the staging slot no trainer still reads before step 0,
// local.proto's fused_slot); between them broadcasts of 2 and 3 pieces take
// the plain steps and change which slot is free. Every trainer checks
// every call's bytes, a new pattern per call: a reader handed an earlier
// call's bytes, or a root that overwrote a slot still being read, fails.
const std::string kOnePieceAndMore = "--sizes=1,38640,4194304,4194305,0,12582912,7";

TEST(BroadcastOneNode, BackToBackBroadcastsOfOneOrMorePiecesEachDeliverTheirOwnBytes) {
  Daemon daemon(2, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(StartBroadcaster(daemon, r, {kOnePieceAndMore, "--roots=0,1", "--repeat=5"}));
  }
  ExpectAllSucceed(ps, daemon.process().Log(), "12582912");
}

ClusterOptions TwoNodes() {
  ClusterOptions options;
  options.local_size = 2;
  options.job_id = "bcastjob";
  options.flags = {"--timeout-s=60"};
  return options;
}

TEST(BroadcastTwoNodes, EveryTrainerOfEveryNodeGetsTheRootsBytes) {
  Cluster cluster(TwoNodes());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps;
  // Roots 0 (node 0) and 3 (node 1, local 1).
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) {
      ps.push_back(StartBroadcaster(cluster.node(n), r, {kSizes, "--roots=0,3"}));
    }
  }
  ExpectAllSucceed(ps, cluster.DaemonLogs());
}

// The same across nodes: a fused step 0 runs the agreement, then Gloo's
// broadcast of the slot, in one call.
TEST(BroadcastTwoNodes, BackToBackBroadcastsOfOneOrMorePiecesEachDeliverTheirOwnBytes) {
  Cluster cluster(TwoNodes());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) {
      ps.push_back(
          StartBroadcaster(cluster.node(n), r, {kOnePieceAndMore, "--roots=0,3", "--repeat=5"}));
    }
  }
  ExpectAllSucceed(ps, cluster.DaemonLogs(), "12582912");
}

TEST(BroadcastMisuse, DifferentSizesFailWithMismatchNamingBothTrainers) {
  Daemon daemon(2, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(StartBroadcaster(daemon, r, {"--sizes=100", "--size-plus-rank"}));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ps[r].Wait(kBound).code, kExitMismatch) << ps[r].Log();
    const std::string log = ps[r].Log();
    EXPECT_NE(log.find("trainers called gs_broadcast differently"), std::string::npos) << log;
    EXPECT_NE(log.find("bytes=100,"), std::string::npos) << log;
    EXPECT_NE(log.find("bytes=101,"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 0 (local 0"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 1 (local 1"), std::string::npos) << log;
  }
}

// Across nodes the daemons compare what their trainers passed before the
// first piece: node 1's size differs, every trainer gets MISMATCH naming
// both nodes and their sizes.
TEST(BroadcastMisuse, DifferentSizesAcrossNodesFailWithMismatchNamingBothNodes) {
  ClusterOptions options = TwoNodes();
  options.local_size = 1;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    ps.push_back(StartBroadcaster(cluster.node(n), 0, {"--sizes=100", "--size-plus-rank"}));
  }
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(ps[n].Wait(kBound).code, kExitMismatch) << ps[n].Log() << cluster.DaemonLogs();
    const std::string log = ps[n].Log();
    EXPECT_NE(log.find("nodes called gs_broadcast differently"), std::string::npos) << log;
    EXPECT_NE(log.find("bytes=100,"), std::string::npos) << log;
    EXPECT_NE(log.find("bytes=101,"), std::string::npos) << log;
    EXPECT_NE(log.find("node_rank=1"), std::string::npos) << log;
  }
}

TEST(BroadcastMisuse, DifferentRootsFailWithMismatchNamingBothTrainers) {
  Daemon daemon(2, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(StartBroadcaster(daemon, r, {"--sizes=100", "--root-is-rank"}));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ps[r].Wait(kBound).code, kExitMismatch) << ps[r].Log();
    const std::string log = ps[r].Log();
    EXPECT_NE(log.find("root_rank=0"), std::string::npos) << log;
    EXPECT_NE(log.find("root_rank=1"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 1 (local 1"), std::string::npos) << log;
  }
}

TEST(BroadcastMisuse, RootOutsideTheJobIsInvalidArgumentNamingTheCaller) {
  Daemon daemon(2, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) ps.push_back(StartBroadcaster(daemon, r, {"--sizes=8", "--roots=2"}));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ps[r].Wait(kBound).code, kExitInvalidArgument) << ps[r].Log();
    EXPECT_NE(ps[r].Log().find("root_rank=2): the job's ranks are 0..1"), std::string::npos)
        << ps[r].Log();
  }
}

// Rank 1 marked its gradient (it is in iteration 0) while rank 0
// broadcasts: both fail with STATE naming rank 1, whichever the daemon saw
// first; nobody hangs until the timeout.
TEST(BroadcastMisuse, TrainerMidIterationFailsTheBroadcastWithStateNamingIt) {
  Daemon daemon(2, {"--timeout-s=120"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r)
    ps.push_back(StartBroadcaster(daemon, r, {"--sizes=64", "--mark-first=1"}));
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = ps[r].Wait(seconds(60));  // well inside the 120 s timeout
    EXPECT_FALSE(st.timed_out) << "trainer " << r << " hung";
    EXPECT_EQ(st.code, kExitState) << ps[r].Log() << daemon.process().Log();
    EXPECT_NE(ps[r].Log().find("rank 1 (local 1"), std::string::npos) << ps[r].Log();
    EXPECT_NE(ps[r].Log().find("gs_broadcast runs between iterations"), std::string::npos)
        << ps[r].Log();
  }
}

// Rank 1 stops instead of broadcasting and is SIGKILLed while rank 0 waits
// in gs_broadcast: rank 0 gets PEER_FAILED naming rank 1, long before the
// daemon's timeout.
TEST(BroadcastFault, TrainerKilledDuringTheBroadcastFailsTheOthersNamingIt) {
  Daemon daemon(2, {"--timeout-s=120"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(StartBroadcaster(daemon, r, {"--sizes=1000", "--stop-before-broadcast=1"}));
  }
  ASSERT_TRUE(WaitStopped(ps[1], kBound)) << ps[1].Log();
  ps[1].Signal(SIGKILL);
  EXPECT_EQ(ps[1].Wait(kBound).code, SIGKILL);
  const ExitStatus st = ps[0].Wait(seconds(60));
  EXPECT_FALSE(st.timed_out) << "trainer 0 hung";
  EXPECT_EQ(st.code, kExitPeerFailed) << ps[0].Log() << daemon.process().Log();
  EXPECT_NE(ps[0].Log().find("gs_broadcast failed"), std::string::npos) << ps[0].Log();
  EXPECT_NE(ps[0].Log().find(absl::StrCat("rank 1 (local 1, pid ", ps[1].pid(), ")")),
            std::string::npos)
      << ps[0].Log();
}

// Across nodes: node 1's trainer marked its gradient (it is in iteration
// 0) while node 0's broadcasts. The two daemons' collectives differ in
// length, so the pair fails at once: PEER_FAILED on both nodes, well
// inside the timeout. (It names the Gloo worker and the generation, not the
// trainer: the broadcast is not part of the per-iteration agreement yet.)
TEST(BroadcastMisuse, TrainerMidIterationOnAnotherNodeFailsTheJob) {
  ClusterOptions options = TwoNodes();
  options.local_size = 1;
  options.flags = {"--timeout-s=120"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    ps.push_back(StartBroadcaster(cluster.node(n), 0, {"--sizes=64", "--mark-first=1"}));
  }
  for (int n = 0; n < 2; ++n) {
    const ExitStatus st = ps[n].Wait(seconds(60));  // well inside the 120 s timeout
    EXPECT_FALSE(st.timed_out) << "trainer " << n << " hung";
    EXPECT_EQ(st.code, kExitPeerFailed) << ps[n].Log() << cluster.DaemonLogs();
    EXPECT_NE(ps[n].Log().find("generation=1"), std::string::npos) << ps[n].Log();
  }
}

// Rank 1 stops (alive, its connection open) instead of broadcasting: rank
// 0 gets TIMEOUT naming it once the daemon's timeout passes.
TEST(BroadcastFault, TrainerThatNeverCallsIsNamedByTheTimeout) {
  Daemon daemon(2, {"--timeout-s=2"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(StartBroadcaster(daemon, r, {"--sizes=1000", "--stop-before-broadcast=1"}));
  }
  ASSERT_TRUE(WaitStopped(ps[1], kBound)) << ps[1].Log();
  const ExitStatus st = ps[0].Wait(kBound);
  EXPECT_EQ(st.code, kExitTimeout) << ps[0].Log() << daemon.process().Log();
  EXPECT_NE(ps[0].Log().find(absl::StrCat("rank 1 (local 1, pid ", ps[1].pid(),
                                          ") did not call gs_broadcast(bytes=1000, root_rank=0)")),
            std::string::npos)
      << ps[0].Log();
  ps[1].Signal(SIGKILL);
  ps[1].Wait(kBound);
}

// Across nodes: node 1's only trainer is killed while node 0's waits in the
// broadcast's agreement; node 0's trainer gets PEER_FAILED naming it.
TEST(BroadcastFault, TrainerKilledOnAnotherNodeFailsTheBroadcastNamingIt) {
  ClusterOptions options = TwoNodes();
  options.local_size = 1;
  options.flags = {"--timeout-s=120"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    ps.push_back(
        StartBroadcaster(cluster.node(n), 0, {"--sizes=1000", "--stop-before-broadcast=1"}));
  }
  ASSERT_TRUE(WaitStopped(ps[1], kBound)) << ps[1].Log();
  ps[1].Signal(SIGKILL);
  EXPECT_EQ(ps[1].Wait(kBound).code, SIGKILL);
  const ExitStatus st = ps[0].Wait(seconds(60));
  EXPECT_FALSE(st.timed_out) << "trainer 0 hung";
  EXPECT_EQ(st.code, kExitPeerFailed) << ps[0].Log() << cluster.DaemonLogs();
  EXPECT_NE(ps[0].Log().find(absl::StrCat("rank 1 (local 0, pid ", ps[1].pid(), ")")),
            std::string::npos)
      << ps[0].Log() << cluster.DaemonLogs();
}

}  // namespace
}  // namespace gradsync::testing
