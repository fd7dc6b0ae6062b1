// --autotune on a job whose rendezvous lives in etcd (real gradsyncd
// daemons and trainers, a real etcd member on a loopback port): no node
// leads, so the generation's first member tunes and appends its candidates
// and its choice to the job's config log in etcd; every node re-plans to
// each at the same iteration and training equals one process on the whole
// batch. Node 0 SIGKILLed while its candidates run: the survivors re-form,
// the new first member tunes afresh and every survivor applies its choice
// alike, still training like the reference; a node killed after the choice
// took effect: the survivors keep it.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/plan_decisions.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

// A hang check, not a performance bound: a few hundred iterations and
// every node's re-plans on a loaded 2-core machine.
constexpr auto kBound = seconds(240);
constexpr char kToken[] = "etcd-tune-s3cret";

#define SKIP_WITHOUT_ETCD()                         \
  do {                                              \
    const std::string reason = EtcdMissingReason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;    \
  } while (0)

// 2 x 1 MiB-ish fp64 layers: caps from 0.25 MiB up give different plans.
std::vector<std::string> ModelArgs(int steps) {
  return {"--dim=64", "--hidden=2048", "--fp64", "--batch=60", absl::StrCat("--steps=", steps)};
}

ClusterOptions TunedOnEtcd(const EtcdCluster& etcd, int nodes, int local,
                           std::vector<std::string> extra = {}) {
  ClusterOptions options;
  options.nodes = nodes;
  options.local_size = local;
  options.job_id = "etcdtune";
  options.token = kToken;
  options.rendezvous = absl::StrCat("etcd://", etcd.endpoints()[0], "/gradsync-tune");
  options.flags = {"--autotune"};
  options.flags.insert(options.flags.end(), extra.begin(), extra.end());
  return options;
}

// The config versions `stats` says the tuner placed (its candidates, then
// its choice, versions 1, 2, ... of its generation's log), each found as a
// plan decision at that iteration in `decisions`; "" when all are.
std::string MissingPlacements(const v1::Stats& stats, const std::vector<std::string>& decisions) {
  std::vector<uint64_t> placed;
  for (const v1::AutotuneCandidate& c : stats.autotune_candidates())
    placed.push_back(c.at_iteration());
  placed.push_back(stats.autotune_chosen_at_iteration());
  std::string missing;
  for (size_t i = 0; i < placed.size(); ++i) {
    const std::string at = absl::StrCat("iteration=", placed[i], " config_version=", i + 1, " ");
    bool found = false;
    for (const std::string& d : decisions) found = found || d.rfind(at, 0) == 0;
    if (!found) absl::StrAppend(&missing, "'", at, "' ");
  }
  return missing;
}

// Every candidate scored, one chosen.
void ExpectChosen(const v1::Stats& s, const std::string& logs) {
  EXPECT_EQ(s.autotune_state(), "chosen") << logs;
  ASSERT_GE(s.autotune_candidates_size(), 3) << logs;
  ASSERT_GE(s.autotune_choice(), 0) << logs;
  ASSERT_LT(s.autotune_choice(), s.autotune_candidates_size());
  for (const v1::AutotuneCandidate& c : s.autotune_candidates()) {
    EXPECT_EQ(c.scored_iterations(), 3u) << c.ShortDebugString();
    EXPECT_GT(c.median_step_s(), 0) << c.ShortDebugString();
  }
}

absl::StatusOr<v1::Stats> NodeStats(Cluster& cluster, int n) {
  return GetStats(cluster.node(n).ListenPort(seconds(10)), kToken);
}

TEST(EtcdAutotune, TwoNodesApplyEveryCandidateAndTheChoiceAtTheSameIterationAndTrainExactly) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  Cluster cluster(TunedOnEtcd(etcd, 2, 2, {"--timeout-s=30"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> args = ModelArgs(400);
  args.push_back("--shuffle-seed=7");
  std::vector<std::string> run_args = args;
  run_args.push_back("--sleep-ms=15");  // a realistic step: a few hundred take seconds
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(run_args, &outs);
  for (Process& t : trainers) {
    const ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs() << etcd.Logs();
  }
  const std::string logs = cluster.DaemonLogs();

  // Node 0, the generation's first member, tuned; node 1 says so.
  absl::StatusOr<v1::Stats> tuner = NodeStats(cluster, 0);
  ASSERT_TRUE(tuner.ok()) << tuner.status();
  ExpectChosen(*tuner, logs);
  absl::StatusOr<v1::Stats> other = NodeStats(cluster, 1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->autotune_state(),
            "node_rank=0 tunes (the first member of generation 1); this node applies its choices");
  EXPECT_EQ(other->autotune_choice(), -1);

  // Both nodes made the same plan decisions at the same iterations: one per
  // candidate and one for the choice, where the tuner placed them.
  const std::vector<std::string> node0 = PlanDecisions(cluster.node(0).process().Log());
  const std::vector<std::string> node1 = PlanDecisions(cluster.node(1).process().Log());
  EXPECT_EQ(node0, node1) << logs;
  EXPECT_EQ(MissingPlacements(*tuner, node0), "") << logs;
  size_t config_decisions = 0;
  for (const std::string& d : node0) config_decisions += d.find("config_version=0 ") == d.npos;
  EXPECT_EQ(config_decisions, static_cast<size_t>(tuner->autotune_candidates_size()) + 1) << logs;

  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  const std::vector<double> first = LoadWeights(outs[0]);
  for (const std::string& out : outs) {
    const std::vector<double> got = LoadWeights(out);
    EXPECT_LE(RelativeDifference(got, expected), 1e-12) << out;
    EXPECT_EQ(got, first) << out << " differs from node 0's trainer 0";
  }
}

// The iteration the survivors redid (Job::Reform's log line): the dead
// node's trainer contributed every iteration before it; -1 when absent.
int RedoneIteration(const std::string& log) {
  static const std::regex kReforming(
      "event=job_reforming job=\\d+ generation=\\d+ iteration=(\\d+)");
  std::smatch m;
  if (!std::regex_search(log, m, kReforming)) return -1;
  return std::stoi(m[1].str());
}

const std::vector<std::string>& ElasticFlags() {
  static const std::vector<std::string> flags = {"--timeout-s=5", "--min-nodes=2", "--max-nodes=3"};
  return flags;
}

// The embedded leader's counterpart of TunedOnEtcd.
ClusterOptions TunedOnTheLeader(int nodes, int local, std::vector<std::string> extra) {
  ClusterOptions options;
  options.nodes = nodes;
  options.local_size = local;
  options.job_id = "leadertune";
  options.token = kToken;
  options.flags = {"--autotune"};
  options.flags.insert(options.flags.end(), extra.begin(), extra.end());
  return options;
}

// 3 nodes x 1 trainer of an elastic job, tuning, on etcd (or, without
// one, on the embedded leader).
struct ElasticRun {
  explicit ElasticRun(const EtcdCluster& etcd) : cluster(TunedOnEtcd(etcd, 3, 1, ElasticFlags())) {}
  ElasticRun() : cluster(TunedOnTheLeader(3, 1, ElasticFlags())) {}
  Cluster cluster;
  std::vector<std::string> outs;
  std::vector<Process> trainers;
};

void StartElastic(ElasticRun& run, int steps) {
  ASSERT_TRUE(run.cluster.Start()) << run.cluster.DaemonLogs();
  std::vector<std::string> args = ModelArgs(steps);
  args.push_back("--sleep-ms=15");  // a realistic step: a few hundred take seconds
  run.trainers = run.cluster.StartTrainers(args, &run.outs);
}

// SIGKILLs node `victim`'s daemon and trainer; the others finish with GS_OK,
// decided every plan alike, and end with the weights of one process in
// which the victim's trainer stopped at the iteration the survivors redid.
void KillAndExpectSurvivorsTrainExactly(ElasticRun& run, int victim, int steps) {
  Cluster& cluster = run.cluster;
  cluster.node(victim).process().Signal(SIGKILL);
  run.trainers[victim].Signal(SIGKILL);
  cluster.node(victim).process().Wait(seconds(10));
  std::vector<int> survivors;
  for (int n = 0; n < 3; ++n) {
    if (n == victim) continue;
    survivors.push_back(n);
    const ExitStatus st = run.trainers[n].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0)
        << "node " << n << ": " << run.trainers[n].Log() << cluster.DaemonLogs();
  }
  const std::string log_a = cluster.node(survivors[0]).process().Log();
  const std::string log_b = cluster.node(survivors[1]).process().Log();
  EXPECT_EQ(PlanDecisions(log_a), PlanDecisions(log_b)) << cluster.DaemonLogs();
  const int redone = RedoneIteration(log_a);
  ASSERT_GT(redone, 0) << cluster.DaemonLogs();
  EXPECT_EQ(redone, RedoneIteration(log_b)) << cluster.DaemonLogs();
  std::vector<std::string> join_steps(3, absl::StrCat(steps));
  join_steps[victim] = absl::StrCat(redone);
  std::vector<std::string> reference_args = ModelArgs(steps);
  reference_args.push_back("--join-steps=" + absl::StrJoin(join_steps, ","));
  reference_args.push_back("--join-divide-by-active");
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(expected.empty());
  const std::vector<double> first = LoadWeights(run.outs[survivors[0]]);
  EXPECT_LE(RelativeDifference(first, expected), 1e-12) << run.outs[survivors[0]];
  EXPECT_EQ(LoadWeights(run.outs[survivors[1]]), first)
      << "node " << survivors[1] << " ended with other weights than node " << survivors[0];
}

// Node 0 (the tuner) SIGKILLed once its first candidate runs. Nodes 1 and
// 2 re-form generation 2; node 1, its first member, tunes afresh there and
// both apply its candidates and its choice at the same iterations; both
// end with the reference's weights.
TEST(EtcdAutotune, TunerKilledMidTuningTheNewFirstMemberTunesAfreshAndSurvivorsTrainExactly) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  constexpr int kSteps = 700;
  ElasticRun run(etcd);
  StartElastic(run, kSteps);
  if (::testing::Test::HasFatalFailure()) return;
  Cluster& cluster = run.cluster;
  // The first candidate re-planned node 1: tuning is under way.
  ASSERT_TRUE(WaitForLog(cluster.node(1).process(), "config_version=1 buckets=", kBound))
      << cluster.DaemonLogs();
  KillAndExpectSurvivorsTrainExactly(run, /*victim=*/0, kSteps);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string logs = cluster.DaemonLogs();
  EXPECT_NE(cluster.node(1).process().Log().find(
                "event=autotune_seat generation=2 tuner_node_rank=1 here=true resumed=true "
                "restarted=true"),
            std::string::npos)
      << logs;
  EXPECT_NE(cluster.node(2).process().Log().find(
                "event=autotune_seat generation=2 tuner_node_rank=1 here=false"),
            std::string::npos)
      << logs;

  absl::StatusOr<v1::Stats> tuner = NodeStats(cluster, 1);
  ASSERT_TRUE(tuner.ok()) << tuner.status();
  ExpectChosen(*tuner, logs);
  EXPECT_EQ(tuner->generation(), 2u);
  // Generation 2's log: every candidate and the choice where node 1 placed them.
  EXPECT_EQ(MissingPlacements(*tuner, PlanDecisions(cluster.node(1).process().Log())), "") << logs;
  absl::StatusOr<v1::Stats> other = NodeStats(cluster, 2);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->autotune_state(),
            "node_rank=1 tunes (the first member of generation 2); this node applies its choices");
}

// The choice took effect on every node, then node 2 SIGKILLed: the
// survivors keep it (node 0 tunes nothing more) and train exactly.
TEST(EtcdAutotune, NodeKilledAfterTheChoiceTookEffectTheSurvivorsKeepIt) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  constexpr int kSteps = 500;
  ElasticRun run(etcd);
  StartElastic(run, kSteps);
  if (::testing::Test::HasFatalFailure()) return;
  Cluster& cluster = run.cluster;
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=autotune_in_effect", kBound))
      << cluster.DaemonLogs();
  absl::StatusOr<v1::Stats> before = NodeStats(cluster, 0);
  ASSERT_TRUE(before.ok()) << before.status();
  KillAndExpectSurvivorsTrainExactly(run, /*victim=*/2, kSteps);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string logs = cluster.DaemonLogs();
  const std::string log0 = cluster.node(0).process().Log();
  EXPECT_NE(log0.find("event=autotune_kept generation=2"), std::string::npos) << logs;
  EXPECT_EQ(log0.find("event=autotune_candidate", log0.find("event=autotune_kept")),
            std::string::npos)
      << "node 0 tuned again after the re-formation\n"
      << logs;
  absl::StatusOr<v1::Stats> after = NodeStats(cluster, 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->generation(), 2u);
  EXPECT_EQ(after->autotune_state(), "chosen");
  EXPECT_EQ(after->autotune_choice(), before->autotune_choice());
  EXPECT_EQ(after->autotune_chosen_at_iteration(), before->autotune_chosen_at_iteration());
  // No config version in generation 2: the survivors run the choice as it was.
  for (const std::string& d : PlanDecisions(log0)) {
    const uint64_t at = std::stoull(d.substr(d.find('=') + 1));
    if (at > after->autotune_chosen_at_iteration()) {
      EXPECT_NE(d.find("config_version=0 "), std::string::npos) << d << "\n" << logs;
    }
  }
  absl::StatusOr<v1::Stats> other = NodeStats(cluster, 1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->autotune_state(),
            "node_rank=0 tunes (the first member of generation 2); this node applies its choices");
}

// The same on the embedded leader, where node 0 always tunes: node 2
// SIGKILLed once the first candidate runs; node 0 tunes afresh in the
// survivors' generation (its candidates of the old one are gone on every
// node alike), and the survivors train exactly.
TEST(EtcdAutotune, OnTheEmbeddedLeaderANodeKilledMidTuningNodeZeroTunesAfresh) {
  constexpr int kSteps = 700;
  ElasticRun run;
  StartElastic(run, kSteps);
  if (::testing::Test::HasFatalFailure()) return;
  Cluster& cluster = run.cluster;
  ASSERT_TRUE(WaitForLog(cluster.node(1).process(), "config_version=1 buckets=", kBound))
      << cluster.DaemonLogs();
  KillAndExpectSurvivorsTrainExactly(run, /*victim=*/2, kSteps);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string logs = cluster.DaemonLogs();
  absl::StatusOr<v1::Stats> tuner = GetStats(cluster.port(), kToken);
  ASSERT_TRUE(tuner.ok()) << tuner.status();
  ExpectChosen(*tuner, logs);
  ASSERT_GE(tuner->generation(), 2u);
  const std::string seat =
      absl::StrCat("event=autotune_seat generation=", tuner->generation(), " tuner_node_rank=0");
  EXPECT_NE(cluster.node(0).process().Log().find(
                absl::StrCat(seat, " here=true resumed=true restarted=true")),
            std::string::npos)
      << logs;
  EXPECT_NE(cluster.node(1).process().Log().find(absl::StrCat(seat, " here=false")),
            std::string::npos)
      << logs;
  EXPECT_EQ(MissingPlacements(*tuner, PlanDecisions(cluster.node(0).process().Log())), "") << logs;
}

}  // namespace
}  // namespace gradsync::testing
