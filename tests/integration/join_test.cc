// Uneven inputs (gs_join, DDP's Join) with real daemons and trainer
// processes: trainers that run out of data join, the others go on, and the
// weights of the trainer that ran longest equal what DDP's definition gives
// (`mlp_trainer --single --join-steps`: each step, the sum of the shard
// gradients of the ranks still running, divided by the world size or by how
// many still run), on one node and across two; and the misuses and faults
// around a join.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);
// fp32 training of 10 steps: the daemon sums the shards in another order
// than the reference; 1e-5 relative is far above that rounding and far
// below any change of divisor (a 3/2 factor in a step's update).
constexpr double kTolerance = 1e-5;

struct Case {
  std::vector<int> steps;  // per global rank
  bool divide_by_active;
  std::string name;
};

std::vector<std::string> CommonArgs(const Case& c) {
  std::vector<std::string> args = {"--batch=60", "--gate-every=3",
                                   "--join-steps=" + absl::StrJoin(c.steps, ",")};
  if (c.divide_by_active) args.push_back("--join-divide-by-active");
  return args;
}

// The trainer with the most steps (rank 0) against the reference.
void ExpectMatchesReference(const std::string& dir, const Case& c, const std::string& out0,
                            const std::string& logs) {
  const std::vector<double> expected = SingleProcessReference(dir, CommonArgs(c));
  ASSERT_FALSE(expected.empty());
  const std::vector<double> got = LoadWeights(out0);
  ASSERT_EQ(got.size(), expected.size()) << logs;
  EXPECT_LE(RelativeDifference(got, expected), kTolerance) << logs;
}

class JoinOneNodeTest : public ::testing::TestWithParam<Case> {};

TEST_P(JoinOneNodeTest, UnevenTrainersMatchDdpJoin) {
  const Case& c = GetParam();
  const int n = static_cast<int>(c.steps.size());
  Daemon daemon(n, {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001", "--timeout-s=30"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  std::vector<std::string> outs;
  for (int r = 0; r < n; ++r) {
    outs.push_back(absl::StrCat(daemon.dir(), "/weights", r, ".txt"));
    std::vector<std::string> args = CommonArgs(c);
    args.push_back(absl::StrCat("--shuffle-seed=", 21 + r));
    trainers.push_back(StartTrainer(daemon, r, args, outs.back()));
  }
  for (int r = 0; r < n; ++r) {
    ExitStatus st = trainers[r].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " code " << st.code << "\n"
                                           << trainers[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
  }
  const std::string log = daemon.process().Log();
  EXPECT_NE(log.find("event=all_joined"), std::string::npos) << log;
  ExpectMatchesReference(daemon.dir(), c, outs[0], log);
}

INSTANTIATE_TEST_SUITE_P(Join, JoinOneNodeTest,
                         ::testing::Values(Case{{10, 7, 3}, false, "divide_by_initial_world_size"},
                                           Case{{10, 7, 3}, true, "divide_by_active_trainers"}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Two daemons, two trainers each: node 1's trainers (ranks 2, 3) have both
// joined after 3 steps while node 0's go on to 10 and 8; node 1 keeps
// taking part in every collective with zeros.
class JoinTwoNodesTest : public ::testing::TestWithParam<Case> {};

// Two daemons, two trainers each, on loopback; `uneven_inputs` passes
// --uneven-inputs to both.
ClusterOptions TwoNodes(bool uneven_inputs) {
  ClusterOptions options;
  options.local_size = 2;
  options.job_id = "joinjob";
  options.flags = {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001", "--timeout-s=30"};
  if (uneven_inputs) options.flags.push_back("--uneven-inputs");
  return options;
}

TEST_P(JoinTwoNodesTest, OneNodeJoinsWhileTheOtherTrains) {
  const Case& c = GetParam();
  Cluster cluster(TwoNodes(/*uneven_inputs=*/true));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  auto logs = [&] { return cluster.DaemonLogs(); };

  std::vector<Process> trainers;
  std::vector<std::string> outs;
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) {
      outs.push_back(absl::StrCat(cluster.dir(), "/w", n, ".", r, ".txt"));
      std::vector<std::string> args = CommonArgs(c);
      args.push_back(absl::StrCat("--shuffle-seed=", 31 + 2 * n + r));
      trainers.push_back(StartTrainer(cluster.node(n), r, args, outs.back()));
    }
  }
  for (size_t t = 0; t < trainers.size(); ++t) {
    ExitStatus st = trainers[t].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << t << " code " << st.code << "\n"
                                           << trainers[t].Log() << "\n"
                                           << logs();
  }
  EXPECT_NE(cluster.node(1).process().Log().find("event=all_joined"), std::string::npos) << logs();
  ExpectMatchesReference(cluster.dir(), c, outs[0], logs());
}

INSTANTIATE_TEST_SUITE_P(
    Join, JoinTwoNodesTest,
    ::testing::Values(Case{{10, 8, 3, 2}, false, "divide_by_initial_world_size"},
                      Case{{10, 8, 3, 2}, true, "divide_by_active_trainers"},
                      // Node 1's local rank 0 joins before the first
                      // iteration: it observed no order to rebuild from,
                      // node 0's rank 0 did. Every node must still rebuild
                      // (or not) alike, from node 0's order.
                      Case{{10, 8, 0, 2}, false, "first_rank_of_a_node_joins_at_once"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Across nodes the per-iteration count exchange is opt-in: without
// --uneven-inputs a gs_join is refused (STATE, naming the trainer and the
// flag) instead of costing every multi-node job a collective per iteration.
TEST(JoinTwoNodes, WithoutUnevenInputsGsJoinIsRefusedNamingTheFlag) {
  Cluster cluster(TwoNodes(/*uneven_inputs=*/false));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> trainers;
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = {"--batch=60", "--join-steps=4,4,2,4"};
      args.push_back(absl::StrCat("--shuffle-seed=", 41 + 2 * n + r));
      trainers.push_back(StartTrainer(cluster.node(n), r, args, ""));
    }
  }
  // Rank 2 (node 1, local 0) joins after 2 steps.
  const ExitStatus st = trainers[2].Wait(kBound);
  const std::string log = trainers[2].Log();
  ASSERT_TRUE(st.exited) << st.ToString();
  EXPECT_EQ(st.code, kExitState) << log << cluster.DaemonLogs();
  EXPECT_NE(log.find("called gs_join"), std::string::npos) << log;
  EXPECT_NE(log.find("--uneven-inputs"), std::string::npos) << log;
  for (size_t t = 0; t < trainers.size(); ++t) {
    if (t == 2) continue;
    const ExitStatus other = trainers[t].Wait(kBound);
    EXPECT_TRUE(other.exited && other.code != 0) << "trainer " << t << "\n" << trainers[t].Log();
  }
}

// After gs_join returned, the trainer takes part in nothing: a second
// gs_join and a mark are refused, naming it.
TEST(JoinMisuse, CallsAfterJoinAreRefusedNamingTheTrainer) {
  for (const std::string what : {"join", "mark"}) {
    Daemon daemon(1, {"--timeout-s=30"});
    ASSERT_TRUE(daemon.WaitReady(seconds(10)));
    Process p = StartTrainer(daemon, 0, {"--join-steps=2", "--after-join=" + what}, "");
    EXPECT_EQ(p.Wait(kBound).code, kExitInvalidArgument) << what << "\n" << p.Log();
    EXPECT_NE(p.Log().find("rank 0 (local 0) after its gs_join"), std::string::npos) << what << "\n"
                                                                                     << p.Log();
  }
}

// A trainer killed after another joined: the survivors, the one blocked in
// gs_join included, fail with PEER_FAILED naming it instead of hanging.
TEST(JoinFault, TrainerKilledAfterAnotherJoinedFailsTheSurvivors) {
  Daemon daemon(3, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  std::vector<Process> ps;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> args = {"--join-steps=10,10,1", "--batch=60"};
    // Rank 1 stops itself in step 2's backward, after rank 2 joined.
    if (r == 1) args.push_back("--pause-at=backward");
    ps.push_back(StartTrainer(daemon, r, args, ""));
  }
  ASSERT_TRUE(WaitForLog(ps[1], "paused at backward", kBound)) << ps[1].Log();
  ASSERT_TRUE(WaitForLog(daemon.process(), "event=trainer_joined", kBound))
      << daemon.process().Log();
  ps[1].Signal(SIGKILL);
  EXPECT_EQ(ps[1].Wait(kBound).code, SIGKILL);
  for (int r : {0, 2}) {
    ExitStatus st = ps[r].Wait(seconds(30));  // the daemon's timeout is 60 s
    EXPECT_FALSE(st.timed_out) << "trainer " << r << " hung";
    EXPECT_EQ(st.code, kExitPeerFailed) << ps[r].Log();
    EXPECT_NE(ps[r].Log().find("local 1"), std::string::npos) << ps[r].Log();
  }
  EXPECT_NE(ps[2].Log().find("gs_join failed"), std::string::npos) << ps[2].Log();
}

}  // namespace
}  // namespace gradsync::testing
