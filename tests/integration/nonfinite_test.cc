// Non-finite gradients (--nonfinite) with real daemons and trainer
// processes: one trainer writes a NaN (or Inf) into fc1.weight[5] at step 2
// (tests/testing/fault_trainer --poison), on one node of 2 trainers and in a job of
// 2 nodes x 2 trainers. error: every trainer fails with INVALID_ARGUMENT
// naming the culprit trainer (rank, local rank, pid, node, host), the
// tensor, the index and the value; skip: every trainer skips step 2's
// update, so every replica is equal and equals a single process that
// skipped that step; off: the NaN reaches every replica's weights.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"
#include "tests/integration/nonfinite_culprit.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);
constexpr int kPoisonStep = 2;

std::vector<std::string> TrainArgs(int poison_rank, const std::string& value = "nan") {
  return {"--steps=5", "--batch=60", "--fp64",
          absl::StrCat("--poison=", poison_rank, ":", kPoisonStep, ":", value)};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Rank 1 of one node's 2 trainers writes the NaN; their weights files go
// to `outs`.
std::vector<Process> StartOneNodeTrainers(const Daemon& daemon, std::vector<std::string>* outs) {
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    outs->push_back(absl::StrCat(daemon.dir(), "/w", r, ".txt"));
    trainers.push_back(StartTrainer(daemon, r, TrainArgs(1), outs->back()));
  }
  return trainers;
}

// skip and off: every trainer trains to the end. `daemon_logs` is read
// after a trainer's wait, for a failure's message.
void ExpectEveryTrainerFinishes(std::vector<Process>& trainers,
                                const std::function<std::string()>& daemon_logs) {
  for (size_t t = 0; t < trainers.size(); ++t) {
    const ExitStatus st = trainers[t].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << t << "\n"
                                           << trainers[t].Log() << daemon_logs();
  }
}

// skip: all replicas equal each other and the reference that skipped the step.
void ExpectSkippedReplicas(const std::string& dir, const std::vector<std::string>& outs,
                           const std::vector<std::string>& args, const std::string& logs) {
  const std::vector<double> expected = SingleProcessReference(dir, args);
  ASSERT_FALSE(expected.empty());
  const std::vector<double> first = LoadWeights(outs[0]);
  ASSERT_EQ(first.size(), expected.size()) << logs;
  for (const std::string& out : outs) {
    EXPECT_EQ(LoadWeights(out), first) << out << "\n" << logs;
  }
  EXPECT_LE(RelativeDifference(first, expected), 1e-12) << logs;
  // Not a reference that applied the step: the skip is visible.
  std::vector<std::string> applied = args;
  applied.back() = "--steps=5";  // no --poison: the single process applies every step
  const std::vector<double> all_steps = SingleProcessReference(dir, applied);
  EXPECT_GT(RelativeDifference(first, all_steps), 1e-6) << logs;
}

// Two nodes, --nonfinite=skip: `node` names its trainer in the skip event;
// the other knows only that another node's was it.
void ExpectSkipNamed(Cluster& cluster, int node, const std::string& culprit) {
  const std::string skipped = absl::StrCat("event=nonfinite_step_skipped iteration=", kPoisonStep);
  EXPECT_NE(cluster.node(node).process().Log().find(absl::StrCat(skipped, " culprit=\"", culprit)),
            std::string::npos)
      << cluster.DaemonLogs();
  EXPECT_NE(cluster.node(1 - node).process().Log().find(
                absl::StrCat(skipped, " culprit=\"another node\"")),
            std::string::npos)
      << cluster.DaemonLogs();
}

void ExpectNanWeights(const std::vector<std::string>& outs, const std::string& logs) {
  for (const std::string& out : outs) {
    const std::string text = ReadFile(out);
    EXPECT_NE(text.find("nan"), std::string::npos) << out << ":\n" << text << logs;
  }
}

TEST(NonFiniteOneNodeTest, ErrorNamesTheTrainerTensorIndexAndValue) {
  Daemon daemon(2, {"--timeout-s=30"});  // --nonfinite=error is the default
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) trainers.push_back(StartTrainer(daemon, r, TrainArgs(1), ""));
  ExpectEveryTrainerFailsNaming(
      trainers,
      {NonFiniteCulprit(1, 1, trainers[1], 0), NonFiniteElement(0, "fc1.weight", 5, "nan"),
       absl::StrCat("iteration ", kPoisonStep, ":")},
      kBound, [&] { return daemon.process().Log(); });
}

TEST(NonFiniteOneNodeTest, SkipKeepsReplicasEqualToAReferenceThatSkipped) {
  Daemon daemon(2, {"--timeout-s=30", "--nonfinite=skip"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<std::string> outs;
  std::vector<Process> trainers = StartOneNodeTrainers(daemon, &outs);
  ASSERT_NO_FATAL_FAILURE(
      ExpectEveryTrainerFinishes(trainers, [&] { return daemon.process().Log(); }));
  EXPECT_NE(trainers[0].Log().find("step 2 skipped"), std::string::npos) << trainers[0].Log();
  const std::string log = daemon.process().Log();
  EXPECT_NE(log.find(absl::StrCat("event=nonfinite_step_skipped iteration=", kPoisonStep)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(absl::StrCat("rank 1 (local 1, pid ", trainers[1].pid(), ")")),
            std::string::npos)
      << log;
  ExpectSkippedReplicas(daemon.dir(), outs, TrainArgs(1), log);
}

TEST(NonFiniteOneNodeTest, OffLetsTheNanThrough) {
  Daemon daemon(2, {"--timeout-s=30", "--nonfinite=off"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<std::string> outs;
  std::vector<Process> trainers = StartOneNodeTrainers(daemon, &outs);
  ASSERT_NO_FATAL_FAILURE(
      ExpectEveryTrainerFinishes(trainers, [&] { return daemon.process().Log(); }));
  ExpectNanWeights(outs, daemon.process().Log());
}

TEST(NonFiniteOneNodeTest, BadFlagIsRefusedNamingIt) {
  Daemon daemon(1, {"--nonfinite=maybe"});
  const ExitStatus st = daemon.process().Wait(seconds(10));
  EXPECT_TRUE(st.exited && st.code != 0) << st.ToString();
  EXPECT_NE(daemon.process().Log().find("--nonfinite maybe must be error, skip or off"),
            std::string::npos)
      << daemon.process().Log();
}

ClusterOptions TwoByTwo(const std::string& mode, std::vector<std::string> extra = {}) {
  ClusterOptions options;
  options.nodes = 2;
  options.local_size = 2;
  options.job_id = "nonfinite";
  options.flags = {"--timeout-s=30", "--nonfinite=" + mode};
  options.flags.insert(options.flags.end(), extra.begin(), extra.end());
  return options;
}

// Rank 3 (node 1, local 1) writes the NaN. Node 1's trainers get the
// culprit from their own daemon; node 0's from the leader's report of node
// 1's failure, which names the node it came from.
TEST(NonFiniteTwoNodesTest, ErrorNamesTheCulpritOnEveryNode) {
  Cluster cluster(TwoByTwo("error"));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(TrainArgs(3), &outs);
  ASSERT_EQ(trainers.size(), 4u);
  const std::vector<std::string> logs = ExpectEveryTrainerFailsNaming(
      trainers,
      {NonFiniteCulprit(3, 1, trainers[3], 1), NonFiniteElement(0, "fc1.weight", 5, "nan")}, kBound,
      [&] { return cluster.DaemonLogs(); });
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_NE(logs[t].find("the leader reports: node_rank=1"), std::string::npos) << logs[t];
  }
}

TEST(NonFiniteTwoNodesTest, SkipKeepsEveryReplicaEqual) {
  Cluster cluster(TwoByTwo("skip"));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(TrainArgs(3), &outs);
  ASSERT_NO_FATAL_FAILURE(
      ExpectEveryTrainerFinishes(trainers, [&] { return cluster.DaemonLogs(); }));
  ExpectSkipNamed(cluster, /*node=*/1,
                  absl::StrCat("rank 3 (local 1, pid ", trainers[3].pid(), ")"));
  ExpectSkippedReplicas(cluster.dir(), outs, TrainArgs(3), cluster.DaemonLogs());
}

TEST(NonFiniteTwoNodesTest, OffLetsTheNanThrough) {
  Cluster cluster(TwoByTwo("off"));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(TrainArgs(3), &outs);
  ASSERT_NO_FATAL_FAILURE(
      ExpectEveryTrainerFinishes(trainers, [&] { return cluster.DaemonLogs(); }));
  ExpectNanWeights(outs, cluster.DaemonLogs());
}

// 2 nodes x 1 trainer, fc1.weight 512 KiB of fp64: the bucket is averaged
// inside Gloo's ring, which tests each node's own input in the chunk that
// node reduces, while the daemon scans only the rest. A NaN low in the
// tensor falls in node 0's chunk, one high in node 1's: from either
// trainer, in either chunk, the culprit is named exactly as before, by its
// own node, and the other node's trainers learn it from the leader.
constexpr size_t kRingW1Elements = 256 * 256;

std::vector<std::string> RingTrainArgs(int poison_rank, size_t index) {
  return {"--steps=5",    "--batch=60",
          "--fp64",       "--dim=256",
          "--hidden=256", absl::StrCat("--poison=", poison_rank, ":", kPoisonStep, ":nan:", index)};
}

class NonFiniteInRingTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(NonFiniteInRingTest, ErrorNamesTheCulpritOnEveryNode) {
  const auto [rank, index] = GetParam();
  ClusterOptions options = TwoByTwo("error");
  options.local_size = 1;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(RingTrainArgs(rank, index), &outs);
  ASSERT_EQ(trainers.size(), 2u);
  const std::vector<std::string> logs =
      ExpectEveryTrainerFailsNaming(trainers,
                                    {NonFiniteCulprit(rank, 0, trainers[rank], rank),
                                     NonFiniteElement(0, "fc1.weight", index, "nan")},
                                    kBound, [&] { return cluster.DaemonLogs(); });
  for (size_t t = 0; t < logs.size(); ++t) {
    if (static_cast<int>(t) == rank) continue;
    EXPECT_NE(logs[t].find(absl::StrCat("the leader reports: node_rank=", rank)), std::string::npos)
        << logs[t];
  }
}

INSTANTIATE_TEST_SUITE_P(EitherNodeEitherChunk, NonFiniteInRingTest,
                         ::testing::Combine(::testing::Values(0, 1),
                                            ::testing::Values(size_t{5}, kRingW1Elements - 3)));

// skip, the NaN in node 0's input within node 1's chunk: every node skips
// the step, node 0 names its trainer, and every replica equals a single
// process that skipped it.
TEST(NonFiniteInRingSkipTest, SkipKeepsEveryReplicaEqual) {
  ClusterOptions options = TwoByTwo("skip");
  options.local_size = 1;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::string> args = RingTrainArgs(0, kRingW1Elements - 3);
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  ASSERT_NO_FATAL_FAILURE(
      ExpectEveryTrainerFinishes(trainers, [&] { return cluster.DaemonLogs(); }));
  ExpectSkipNamed(cluster, /*node=*/0,
                  absl::StrCat("rank 0 (local 0, pid ", trainers[0].pid(), ")"));
  ExpectSkippedReplicas(cluster.dir(), outs, args, cluster.DaemonLogs());
}

// 2 x 2 with the same large bucket: the local sum's fused check names the
// trainer (rank 3, node 1) in node 0's chunk.
TEST(NonFiniteInRingTest2x2, ErrorNamesTheCulpritOnEveryNode) {
  Cluster cluster(TwoByTwo("error"));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(RingTrainArgs(3, 5), &outs);
  ASSERT_EQ(trainers.size(), 4u);
  ExpectEveryTrainerFailsNaming(
      trainers,
      {NonFiniteCulprit(3, 1, trainers[3], 1), NonFiniteElement(0, "fc1.weight", 5, "nan")}, kBound,
      [&] { return cluster.DaemonLogs(); });
}

// An Inf in fp32 crossing nodes as bf16 (--wire-dtype=bf16): it stays Inf
// on the wire, and node 0's trainers still learn of it.
TEST(NonFiniteTwoNodesTest, InfThroughTheBf16WireFailsEveryNode) {
  ClusterOptions options = TwoByTwo("error", {"--wire-dtype=bf16"});
  options.local_size = 1;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers =
      cluster.StartTrainers({"--steps=5", "--batch=60", "--poison=1:2:inf"}, &outs);
  ASSERT_EQ(trainers.size(), 2u);
  ExpectEveryTrainerFailsNaming(
      trainers,
      {NonFiniteCulprit(1, 0, trainers[1], 1), NonFiniteElement(0, "fc1.weight", 5, "inf")}, kBound,
      [&] { return cluster.DaemonLogs(); });
}

}  // namespace
}  // namespace gradsync::testing
