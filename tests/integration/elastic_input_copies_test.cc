// The copies of each local trainer's input that an elastic CPU job keeps
// across nodes (so that a trainer's death mid-backward leaves its node in)
// follow the world: 2 nodes x 2 real trainers (fp64, --min-nodes 1,
// --max-nodes 2, one bucket); node 1's daemon and trainers are SIGKILLed
// in iteration 2 while node 0's are held mid-backward. Node 0 re-forms alone and logs
// that it stopped (and freed) the copies: a one-node world has no other
// node to redo with. A replacement node 1 then joins the running job at
// iteration m and node 0 logs that it takes them again. Every trainer ends
// with GS_OK and the weights of one process that averages iterations 0-1
// over all 4 trainers' shards, 2..m-1 over node 0's and m on over all 4.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr int kLocal = 2;
constexpr int kSteps = 8;
constexpr int kKilledStep = 2;  // fault_trainer --pause-at pauses in step 2
constexpr auto kBound = seconds(60);

struct Trainer {
  std::string out;
  Process process;
};

ClusterOptions TwoNodeJob() {
  ClusterOptions options;
  options.nodes = 2;
  options.local_size = kLocal;
  options.job_id = "elastic";
  options.token = "elastic-token";
  // One bucket (the default caps): nothing of iteration 2 is summed when
  // node 1 dies, so the one-node redo sums the trainers' inputs afresh.
  options.flags = {"--timeout-s=20", "--min-nodes=1", "--max-nodes=2"};
  return options;
}

std::vector<std::string> TrainArgs(const std::string& pause) {
  std::vector<std::string> args = {absl::StrCat("--steps=", kSteps), "--batch=60", "--fp64",
                                   "--catch-up"};
  if (!pause.empty()) args.push_back("--pause-at=" + pause);
  return args;
}

void StartNodeTrainers(Cluster& cluster, int node, const std::string& pause, const char* tag,
                       std::vector<Trainer>* trainers) {
  for (int r = 0; r < kLocal; ++r) {
    const std::string out = absl::StrCat(cluster.dir(), "/", tag, node, "_", r);
    trainers->push_back({out, StartTrainer(cluster.node(node), r, TrainArgs(pause), out)});
  }
}

// Where `line` first stands in node n's log (npos: nowhere).
size_t LogAt(Cluster& cluster, int n, const std::string& line) {
  return cluster.node(n).process().Log().find(line);
}

// Every trainer of both nodes paused mid-backward in iteration 2; then node
// 1 SIGKILLed and node 0 re-formed alone, its trainers still held.
void KillNodeOneWhileNodeZeroWaits(Cluster& cluster, std::vector<Trainer>* trainers) {
  StartNodeTrainers(cluster, 0, "backward", "w", trainers);
  StartNodeTrainers(cluster, 1, "backward", "w", trainers);
  for (Trainer& t : *trainers) {
    ASSERT_TRUE(WaitForLog(t.process, "mlp_trainer: paused at backward", kBound) &&
                WaitStopped(t.process, kBound))
        << t.process.Log() << cluster.DaemonLogs();
  }
  cluster.node(1).process().Signal(SIGKILL);
  for (int i = kLocal; i < 2 * kLocal; ++i) (*trainers)[i].process.Signal(SIGKILL);
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_reformed", kBound))
      << cluster.DaemonLogs();
}

// A replacement node 1 joins; node 0's trainers go on once it read the
// grow entry. Returns the iteration the replacements started at.
int JoinReplacementNodeOne(Cluster& cluster, std::vector<Trainer>* trainers,
                           std::vector<Trainer>* replacements) {
  EXPECT_TRUE(cluster.StartNode(1)) << cluster.DaemonLogs();
  StartNodeTrainers(cluster, 1, "", "replacement", replacements);
  EXPECT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_grow_read", kBound))
      << cluster.DaemonLogs();
  for (int i = 0; i < kLocal; ++i) (*trainers)[i].process.Signal(SIGCONT);
  const std::string joined = "mlp_trainer: joined the running job at iteration ";
  EXPECT_TRUE(WaitForLog((*replacements)[0].process, joined, kBound))
      << (*replacements)[0].process.Log() << cluster.DaemonLogs();
  const std::string log = (*replacements)[0].process.Log();
  const size_t at = log.find(joined);
  return at == std::string::npos ? -1 : std::atoi(log.c_str() + at + joined.size());
}

void ExpectTrainedLikeTheReference(Cluster& cluster, std::vector<Trainer*> everyone, int m) {
  const std::vector<double> reference = SingleProcessReference(
      cluster.dir(),
      {absl::StrCat("--steps=", kSteps), "--batch=60", "--fp64",
       absl::StrCat("--join-steps=", kSteps, ",", kSteps, ",", kKilledStep, ",", kKilledStep),
       "--join-divide-by-active", absl::StrCat("--rejoin-at=", m)});
  ASSERT_FALSE(reference.empty());
  for (Trainer* t : everyone) {
    const ExitStatus st = t->process.Wait(kBound);
    ASSERT_TRUE(st.exited) << st.ToString() << t->process.Log() << cluster.DaemonLogs();
    ASSERT_EQ(st.code, 0) << t->process.Log() << cluster.DaemonLogs();
    EXPECT_LT(RelativeDifference(LoadWeights(t->out), reference), 1e-12) << t->out;
  }
}

TEST(ElasticInputCopies, StopWhenTheJobShrinksToOneNodeAndStartAgainWhenANodeJoins) {
  Cluster cluster(TwoNodeJob());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  ASSERT_NO_FATAL_FAILURE(KillNodeOneWhileNodeZeroWaits(cluster, &trainers));
  const std::string stopped =
      absl::StrCat("event=trainer_input_copies_stopped iteration=", kKilledStep,
                   " nodes=1 trainers=2 arena_bytes=");
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), stopped, kBound)) << cluster.DaemonLogs();
  const int m = JoinReplacementNodeOne(cluster, &trainers, &replacements);
  ASSERT_GT(m, kKilledStep) << cluster.DaemonLogs();
  ASSERT_LT(m, kSteps) << "node 0 finished before node 1 joined";
  std::vector<Trainer*> everyone = {&trainers[0], &trainers[1], &replacements[0], &replacements[1]};
  ASSERT_NO_FATAL_FAILURE(ExpectTrainedLikeTheReference(cluster, everyone, m));
  // Taken again by the grown world, after the stop.
  const size_t started_at = LogAt(cluster, 0, "event=trainer_input_copies_started ");
  ASSERT_NE(started_at, std::string::npos) << cluster.DaemonLogs();
  const std::string log = cluster.node(0).process().Log();
  const std::string started = log.substr(started_at, log.find('\n', started_at) - started_at);
  EXPECT_NE(started.find(" nodes=2 trainers=2 arena_bytes="), std::string::npos) << started;
  EXPECT_LT(LogAt(cluster, 0, stopped), started_at) << cluster.DaemonLogs();
  EXPECT_LT(LogAt(cluster, 0, "event=job_growing"), started_at) << cluster.DaemonLogs();
  // Neither before the shrink nor on the joiner, which started across nodes.
  EXPECT_EQ(LogAt(cluster, 1, "event=trainer_input_copies_"), std::string::npos)
      << cluster.DaemonLogs();
}

// The same shrink with the first-marked tensor in a bucket of its own
// (--first-bucket-cap-mb tiny): both nodes reduce that bucket in
// iteration 2 and write its average into their trainers' arenas before
// node 1 dies. Node 0 alone then redoes the iteration: that bucket from
// the sum it kept (its arenas hold the two-node average), the others from
// the trainers' inputs. Every step equals one process averaging
// iterations 0-1 over 4 trainers and 2-7 over node 0's 2.
TEST(ElasticInputCopies, ABucketAveragedBeforeTheShrinkToOneNodeIsRedoneFromItsKeptSum) {
  ClusterOptions options = TwoNodeJob();
  options.flags.push_back("--first-bucket-cap-mb=0.000001");
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  StartNodeTrainers(cluster, 0, "backward", "w", &trainers);
  StartNodeTrainers(cluster, 1, "backward", "w", &trainers);
  for (Trainer& t : trainers) {
    ASSERT_TRUE(WaitForLog(t.process, "mlp_trainer: paused at backward", kBound) &&
                WaitStopped(t.process, kBound))
        << t.process.Log() << cluster.DaemonLogs();
  }
  // Bucket 0 of iteration 2 reduced on node 0 (a third time) before the kill.
  bool reduced = false;
  for (int i = 0; i < 600 && !reduced; ++i) {
    const absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
    reduced =
        stats.ok() && stats->buckets_size() > 1 && stats->buckets(0).count() == kKilledStep + 1;
    if (!reduced) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(reduced) << cluster.DaemonLogs();
  cluster.node(1).process().Signal(SIGKILL);
  for (int i = kLocal; i < 2 * kLocal; ++i) trainers[i].process.Signal(SIGKILL);
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(),
                         absl::StrCat("event=iteration_redo iteration=", kKilledStep,
                                      " world_size=2 nodes=1 node_index=0 kept_buckets=1"),
                         kBound))
      << cluster.DaemonLogs();
  for (int i = 0; i < kLocal; ++i) trainers[i].process.Signal(SIGCONT);
  const std::vector<double> reference = SingleProcessReference(
      cluster.dir(),
      {absl::StrCat("--steps=", kSteps), "--batch=60", "--fp64",
       absl::StrCat("--join-steps=", kSteps, ",", kSteps, ",", kKilledStep, ",", kKilledStep),
       "--join-divide-by-active"});
  ASSERT_FALSE(reference.empty());
  for (int i = 0; i < kLocal; ++i) {
    const ExitStatus st = trainers[i].process.Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << trainers[i].process.Log() << cluster.DaemonLogs();
    EXPECT_LT(RelativeDifference(LoadWeights(trainers[i].out), reference), 1e-12)
        << trainers[i].out;
  }
}

}  // namespace
}  // namespace gradsync::testing
