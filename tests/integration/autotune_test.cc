// --autotune across two real daemons with two real trainers each: the
// leader tries candidate caps, every node re-plans to each candidate and to
// the choice at the same iteration, and training ends bit for bit where the
// same job with fixed caps ends (bucket boundaries change which collective
// carries a value, never how it is summed).

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/plan_decisions.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

// 2 x 1 MiB-ish fp64 layers: caps from 0.25 MiB up give different plans.
const std::vector<std::string> kModel = {"--dim=64", "--hidden=2048", "--fp64", "--batch=60",
                                         "--shuffle-seed=7"};

struct JobRun {
  std::vector<std::vector<double>> weights;  // per trainer, node-major
  std::vector<std::string> logs;             // per daemon
  v1::Stats leader_stats;
  std::string all_logs;
};

// Two daemons x two trainers, `steps` steps, the daemons given `extra`.
JobRun RunJob(const std::vector<std::string>& extra, int steps) {
  JobRun run;
  ClusterOptions options;
  options.local_size = 2;
  options.job_id = "autotune";
  options.flags = {"--timeout-s=30"};
  options.flags.insert(options.flags.end(), extra.begin(), extra.end());
  Cluster cluster(options);
  EXPECT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> args = kModel;
  args.push_back(absl::StrCat("--steps=", steps));
  args.push_back("--sleep-ms=15");  // a realistic step: a few hundred iterations take seconds
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  run.all_logs = cluster.DaemonLogs();
  for (auto& t : trainers) {
    const ExitStatus st = t.Wait(seconds(240));
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << run.all_logs;
  }
  const absl::StatusOr<v1::Stats> stats = GetStats(cluster.port());
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok()) run.leader_stats = *stats;
  run.all_logs.clear();
  for (int n = 0; n < 2; ++n) {
    run.logs.push_back(cluster.node(n).process().Log());
    run.all_logs += "---- node\n" + run.logs.back();
  }
  for (const std::string& out : outs) run.weights.push_back(LoadWeights(out));
  return run;
}

TEST(Autotune, EveryNodeAppliesEachCandidateAndTheChoiceAtTheSameIterationAndTrainsLikeFixedCaps) {
  const int steps = 400;
  const JobRun tuned = RunJob({"--autotune"}, steps);
  const JobRun fixed = RunJob({}, steps);
  ASSERT_EQ(tuned.weights.size(), 4u);
  ASSERT_EQ(fixed.weights.size(), 4u);

  // The leader tried every candidate, scored each, and chose.
  const v1::Stats& s = tuned.leader_stats;
  EXPECT_EQ(s.autotune_state(), "chosen") << tuned.all_logs;
  ASSERT_GE(s.autotune_candidates_size(), 3) << tuned.all_logs;
  ASSERT_GE(s.autotune_choice(), 0);
  ASSERT_LT(s.autotune_choice(), s.autotune_candidates_size());
  for (const v1::AutotuneCandidate& c : s.autotune_candidates()) {
    EXPECT_EQ(c.scored_iterations(), 3u) << c.ShortDebugString();
    EXPECT_GT(c.median_step_s(), 0) << c.ShortDebugString();
  }
  EXPECT_NE(tuned.logs[0].find("event=autotune_chosen"), std::string::npos) << tuned.all_logs;
  EXPECT_EQ(fixed.leader_stats.autotune_state(), "");  // off by default

  // Both nodes made the same plan decisions at the same iterations...
  const std::vector<std::string> node0 = PlanDecisions(tuned.logs[0]);
  const std::vector<std::string> node1 = PlanDecisions(tuned.logs[1]);
  EXPECT_EQ(node0, node1) << tuned.all_logs;
  // ...one per candidate and one for the choice, each where the leader
  // placed it (besides the order rebuild).
  std::vector<uint64_t> placed;
  for (const v1::AutotuneCandidate& c : s.autotune_candidates()) placed.push_back(c.at_iteration());
  placed.push_back(s.autotune_chosen_at_iteration());
  for (size_t i = 0; i < placed.size(); ++i) {
    const std::string at = absl::StrCat("iteration=", placed[i], " config_version=", i + 1, " ");
    bool found = false;
    for (const std::string& d : node0) found = found || d.rfind(at, 0) == 0;
    EXPECT_TRUE(found) << "no plan decision '" << at << "' on node 0:\n" << tuned.all_logs;
  }
  size_t config_decisions = 0;
  for (const std::string& d : node0)
    config_decisions += d.find("config_version=0 ") == std::string::npos;
  EXPECT_EQ(config_decisions, placed.size()) << tuned.all_logs;
  // Candidates of different caps gave different plans (this model has two
  // distinct ones between 0.25 and 4 MiB): it really re-planned.
  std::map<std::string, int> fingerprints;
  for (const std::string& d : node0) ++fingerprints[d.substr(d.find("fingerprint="))];
  EXPECT_GE(fingerprints.size(), 2u) << tuned.all_logs;

  // Training: bit for bit what fixed caps give, on every trainer.
  for (size_t i = 0; i < tuned.weights.size(); ++i) {
    ASSERT_FALSE(tuned.weights[i].empty());
    EXPECT_EQ(tuned.weights[i], fixed.weights[0]) << "trainer " << i;
    EXPECT_EQ(fixed.weights[i], fixed.weights[0]) << "trainer " << i;
  }
}

// The first member tunes for every node: a node given --autotune among
// nodes without it would report a tuner that never tunes, so the job is
// refused when it forms, on every node alike.
TEST(Autotune, NodesGivenDifferentAutotuneAreRefusedWhenTheJobFormsNamingTheNodeAndBothValues) {
  ClusterOptions options;
  options.job_id = "autotune-mismatch";
  options.flags = {"--timeout-s=30"};
  options.node_flags = {{}, {"--autotune"}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers({"--steps=3", "--batch=60"}, &outs);
  ASSERT_EQ(trainers.size(), 2u);
  for (Process& p : trainers) {
    const ExitStatus st = p.Wait(seconds(60));
    ASSERT_TRUE(st.exited) << st.ToString() << p.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitMismatch) << p.Log() << cluster.DaemonLogs();
    EXPECT_NE(p.Log().find("--autotune differs between nodes: node 0 runs --autotune=off but "
                           "node 1 runs --autotune=on"),
              std::string::npos)
        << p.Log();
  }
}

}  // namespace
}  // namespace gradsync::testing
