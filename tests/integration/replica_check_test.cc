// gradsyncd --check-replicas-every with real daemons and trainer processes
// (tests/integration/replica_trainer.c): replicas that stay equal pass
// every check; one trainer whose parameter drifted fails the job with
// MISMATCH naming the tensor and the trainers on each side, on every
// trainer; across two nodes of two trainers each the same, on every node:
// a replica drifted on node 1 (alone, or with its whole node) is named on
// both nodes.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"
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

ClusterOptions TwoNodesOfTwo() {
  ClusterOptions options;
  options.local_size = 2;
  options.job_id = "replicajob";
  options.flags = {"--timeout-s=30", "--check-replicas-every=2"};
  return options;
}

// Node-major: trainers of node 0 (ranks 0, 1), then node 1 (ranks 2, 3).
std::vector<Process> StartOnTwoNodes(Cluster& cluster, const std::vector<std::string>& args) {
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) ps.push_back(StartReplica(cluster.node(n), r, args));
  }
  return ps;
}

TEST(ReplicaCheckTwoNodes, EqualReplicasPassEveryCheckOnEveryNode) {
  Cluster cluster(TwoNodesOfTwo());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps = StartOnTwoNodes(cluster, {"--steps=7"});
  for (int rank = 0; rank < 4; ++rank) {
    const ExitStatus st = ps[rank].Wait(kBound);
    const std::string log = ps[rank].Log();
    ASSERT_TRUE(st.exited && st.code == 0) << "rank " << rank << " " << st.ToString() << "\n"
                                           << log << "\n"
                                           << cluster.DaemonLogs();
    for (int it : {2, 4, 6}) {
      EXPECT_NE(log.find(absl::StrCat("check ok rank=", rank, " iteration=", it, "\n")),
                std::string::npos)
          << log;
    }
    EXPECT_EQ(Count(log, "check ok"), 3u) << log;
  }
  for (int n = 0; n < 2; ++n) {
    const std::string log = cluster.node(n).process().Log();
    EXPECT_EQ(Count(log, "event=replicas_equal"), 3u) << log;
    EXPECT_EQ(Count(log, "trainers=2 tensors=3 nodes=2"), 3u) << log;
  }
}

// Every trainer of both nodes exits with MISMATCH naming fc.weight after
// iteration 4, rank 0 on node 0 (the reference) and `culprit` on node 1,
// and no other trainer; the check after iteration 2 passed.
void ExpectNamedOnEveryNode(std::vector<Process>& ps, const std::string& culprit,
                            const std::string& logs) {
  for (int rank = 0; rank < 4; ++rank) {
    const ExitStatus st = ps[rank].Wait(kBound);
    const std::string log = ps[rank].Log();
    ASSERT_TRUE(st.exited) << st.ToString() << "\n" << log;
    EXPECT_EQ(st.code, kExitMismatch) << "rank " << rank << "\n" << log << "\n" << logs;
    EXPECT_NE(log.find(absl::StrCat("check ok rank=", rank, " iteration=2\n")), std::string::npos)
        << log;
    EXPECT_NE(log.find("replicas differ after iteration 4: tensor 'fc.weight' (index 1)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("on rank 0 (local 0, pid"), std::string::npos) << log;
    EXPECT_NE(log.find(") on node 0 but "), std::string::npos) << log;
    const size_t at = log.find(" but 0x");
    ASSERT_NE(at, std::string::npos) << log;
    const size_t named = log.find(" on " + culprit, at);
    EXPECT_NE(named, std::string::npos) << log;
    EXPECT_EQ(log.find(") on node 1;", named), log.find(") on node", named)) << log;
    for (const char* other : {"rank 1 (local 1", "rank 2 (local 0", "rank 3 (local 1"}) {
      if (culprit.find(other) == std::string::npos) {
        EXPECT_EQ(log.find(other), std::string::npos) << other << "\n" << log;
      }
    }
    EXPECT_EQ(log.find("iteration=4"), std::string::npos) << log;
  }
}

// Rank 3 (node 1, local 1) drifts: node 1's own trainers differ, and both
// nodes name it against rank 0. Rank 1 (node 0) drifts too, in a later
// tensor (fc.bias): the job's first differing tensor is node 1's.
TEST(ReplicaCheckTwoNodes, ReplicaDriftedOnNodeOneIsNamedOnBothNodes) {
  Cluster cluster(TwoNodesOfTwo());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps =
      StartOnTwoNodes(cluster, {"--steps=8", "--drift-rank=3", "--drift-rank=1:2", "--drift-at=3"});
  ExpectNamedOnEveryNode(ps, "rank 3 (local 1, pid", cluster.DaemonLogs());
}

// Both trainers of node 1 drift alike: each node's trainers agree, the
// nodes do not; the lowest rank of node 1 is named.
TEST(ReplicaCheckTwoNodes, NodeWhoseReplicasDriftedAlikeIsNamedOnBothNodes) {
  Cluster cluster(TwoNodesOfTwo());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps =
      StartOnTwoNodes(cluster, {"--steps=8", "--drift-rank=2", "--drift-rank=3", "--drift-at=3"});
  ExpectNamedOnEveryNode(ps, "rank 2 (local 0, pid", cluster.DaemonLogs());
}

// The nodes compare together, so they must check at the same iterations:
// node 1 running another N fails the job at start on both nodes with
// MISMATCH naming both values.
TEST(ReplicaCheckTwoNodes, DifferentIntervalsOnTwoNodesAreAMismatchNamingBoth) {
  ClusterOptions options = TwoNodesOfTwo();
  options.flags = {"--timeout-s=30"};
  options.node_flags = {{"--check-replicas-every=2"}, {"--check-replicas-every=3"}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps = StartOnTwoNodes(cluster, {"--steps=4"});
  for (int rank = 0; rank < 4; ++rank) {
    const ExitStatus st = ps[rank].Wait(kBound);
    const std::string log = ps[rank].Log();
    ASSERT_TRUE(st.exited) << st.ToString() << "\n" << log;
    EXPECT_EQ(st.code, kExitMismatch) << log << "\n" << cluster.DaemonLogs();
    EXPECT_NE(log.find("--check-replicas-every differs between nodes: node 0 runs "
                       "--check-replicas-every=2 but node 1 runs --check-replicas-every=3"),
              std::string::npos)
        << log;
  }
}

// Rank 3 (node 1) is killed instead of checking: node 0's trainers, whose
// daemon already waits in the comparison across nodes, and rank 2 fail with
// PEER_FAILED naming it, long before the timeout.
TEST(ReplicaCheckTwoNodes, TrainerKilledBeforeItsCheckFailsEveryNodeNamingIt) {
  ClusterOptions options = TwoNodesOfTwo();
  options.flags = {"--timeout-s=120", "--check-replicas-every=2"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps = StartOnTwoNodes(cluster, {"--steps=4", "--stop-before-check=3"});
  ASSERT_TRUE(WaitStopped(ps[3], kBound)) << ps[3].Log();
  ps[3].Signal(SIGKILL);
  EXPECT_EQ(ps[3].Wait(kBound).code, SIGKILL);
  for (int rank = 0; rank < 3; ++rank) {
    const ExitStatus st = ps[rank].Wait(seconds(60));
    const std::string log = ps[rank].Log();
    ASSERT_TRUE(st.exited) << "rank " << rank << " hung: " << st.ToString() << "\n" << log;
    EXPECT_EQ(st.code, kExitPeerFailed) << log << "\n" << cluster.DaemonLogs();
    EXPECT_NE(log.find("gs_check_replicas failed"), std::string::npos) << log;
    EXPECT_NE(log.find(absl::StrCat("rank 3 (local 1, pid ", ps[3].pid(), ")")), std::string::npos)
        << log << "\n"
        << cluster.DaemonLogs();
  }
}

}  // namespace
}  // namespace gradsync::testing
