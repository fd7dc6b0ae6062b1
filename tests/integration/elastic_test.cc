// --min-nodes on a running job of real daemons and trainers: 3 nodes x 2
// trainers (tests/testing/fault_trainer, fp64), node 2 SIGKILLed (its daemon and
// its trainers) while iteration 2 is under way.
//
// Elastic (--min-nodes 2): the survivors re-form and redo iteration 2 over
// their 4 trainers; every survivor finishes with GS_OK and the weights of a
// single process that averages iterations 0-1 over all 6 trainers' shards
// and 2-7 over ranks 0-3's (fault_trainer --single --join-steps, DDP's Join
// with divide-by-active: the same sums). Killed mid-backward, with the
// victim inside the cross-node collective, and with the survivors inside it
// (their first buckets already averaged over 6 and written back, so the redo
// must come from the kept local sums). Each prints the time from the kill
// to the survivors' completion of the redone iteration. Killed after one
// survivor completed iteration 2 and before the other did (a test hook
// withholds node 1's final result): node 1 commits 2 from node 0, over 6.
//
// A trainer of an elastic job SIGKILLed (its node stays): after marking
// the iteration's gradients, the others finish with it counted in that
// iteration and gone from the next; after only its first mark, its node
// stays and every node redoes that iteration without it; a node whose
// trainers all died leaves while its daemon lives on and the other nodes
// train on. A trainer restarted with the dead one's local rank rejoins at
// an iteration boundary with its rank and catches up from the lowest live
// rank (rank 0's own death and restart too, and after a death
// mid-backward); one whose layout differs is refused.
// Node 0 (the leader) SIGKILLed ends the job naming it.
//
// gs_broadcast and gs_check_replicas after a re-formation run among the
// survivors: node 1 killed, a broadcast from rank 4 (node 2, now the
// second member) reaches every survivor's trainers, replica checks compare
// node 0's and node 2's. Every survivor's gs_job_info counts one
// membership change. A node killed while a broadcast is in flight (a test
// hook holds a piece on another node): the survivors finish it and train
// on, also when they stopped a step apart (4 nodes: the ones behind catch
// up from the root's slot); with the root on the dead node they fail
// naming it. A replacement node for the dead one, and a new rank
// below --max-nodes, join the running job at an iteration boundary, catch
// up from the lowest live rank and train with the others (on either
// rendezvous); a new rank joining after node 1's death takes the ranks
// node 1 left free, never a survivor's. A joiner that fails the grown
// generation (SIGKILLed before it publishes its records or before its Gloo
// mesh connects, or refused for another --check-replicas-every) is
// dropped: the members re-form without it and train on exactly, and the
// refused joiner's trainers get GS_ERR_MISMATCH naming it.
//
// Fixed (--min-nodes 3 = --num-nodes): a death ends every survivor with
// GS_ERR_PEER_FAILED naming node_rank=2 and --min-nodes.
//
// SIGTERM instead of SIGKILL (node 2's daemon only; its trainers resume
// and get the shutdown error): an elastic job's node leaves and the
// survivors re-form without it at once, as departed, never presumed dead;
// node 0 hosting the leader ends the job; a fixed job ends, naming it.
//
// elastic_etcd_test runs every case on an etcd rendezvous (a real etcd
// member; --rendezvous etcd://...) instead of the embedded leader, except
// the two that need the leader (config set, its death), plus what only
// etcd allows: node 0 SIGKILLed and the survivors train on, a replacement
// node 0 joining them and catching up from rank 2, one of three etcd
// members killed while the survivors re-form, one stopped and etcd's
// quorum lost for 3.5 s while they do (they retry and train on), and the
// catch-up root's node 0 killed during (or before) the catch-up of a
// restarted trainer or a joining node: the catch-up runs again from rank 2.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#ifdef GRADSYNC_ELASTIC_ON_ETCD
#include "tests/etcd/etcd_cluster.h"
#endif
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr int kTimeoutS = 5;
// A hang check, not a performance bound: the timeout, one more for the
// leader's abort to travel, and room for a loaded 2-core machine.
constexpr auto kErrorBound = seconds(2 * kTimeoutS + 20);
constexpr auto kStateBound = seconds(30);
constexpr int kNodes = 3, kLocal = 2, kVictimNode = 2;
constexpr int kSteps = 8;
// fault_trainer pauses in step 2 (kPauseStep): node 2 dies during it.
constexpr int kKilledStep = 2;

// Where node 2 dies. kBackward: every trainer has marked one gradient.
// kVictimInCollective: node 2's trainers marked all, so its daemon waits in
// the cross-node collective for the others, which are mid-backward.
// kSurvivorsInCollective: the survivors' trainers marked all and node 2's
// one gradient (the first bucket alone), so the survivors averaged that
// bucket over 6, wrote it back, and wait in the next bucket's collective.
enum class Stage { kBackward, kVictimInCollective, kSurvivorsInCollective };

const char* StageName(Stage stage) {
  switch (stage) {
    case Stage::kBackward:
      return "mid_backward";
    case Stage::kVictimInCollective:
      return "victim_mid_collective";
    case Stage::kSurvivorsInCollective:
      return "survivors_mid_collective";
  }
  return "?";
}

#ifdef GRADSYNC_ELASTIC_ON_ETCD
constexpr bool kOnEtcd = true;
// Every case skips where Debian's etcd is not installed, as tests/etcd do.
class EtcdInstalled : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::string reason = EtcdMissingReason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};
::testing::Environment* const kEtcdInstalled =
    ::testing::AddGlobalTestEnvironment(new EtcdInstalled);
// One etcd member for the whole binary; each test's job under a prefix of
// its own.
std::string TestRendezvous() {
  static EtcdCluster* const etcd = [] {
    auto* cluster = new EtcdCluster(1);
    const absl::Status started = cluster->Start();
    EXPECT_TRUE(started.ok()) << started << cluster->Logs();
    return cluster;
  }();
  return absl::StrCat("etcd://", etcd->endpoints()[0], "/",
                      ::testing::UnitTest::GetInstance()->current_test_info()->name());
}
#define SKIP_WITHOUT_ETCD()                         \
  do {                                              \
    const std::string reason = EtcdMissingReason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;    \
  } while (0)
#else
constexpr bool kOnEtcd = false;
std::string TestRendezvous() { return ""; }
#define SKIP_WITHOUT_ETCD() \
  do {                      \
  } while (0)
#endif

// The first bucket holds only the first gradient mlp_trainer marks (the
// 1-element gate), so a trainer paused after its first mark has completed
// it: that bucket's average is written back before node 2 dies.
ClusterOptions JobOptions(int min_nodes, int timeout_s = kTimeoutS) {
  ClusterOptions options;
  options.rendezvous = TestRendezvous();
  options.nodes = kNodes;
  options.local_size = kLocal;
  options.job_id = "elastic";
  options.token = "elastic-token";
  options.flags = {"--bucket-cap-mb=0.001",
                   "--first-bucket-cap-mb=0.000001",
                   absl::StrCat("--timeout-s=", timeout_s),
                   "--stall-threshold-s=1",
                   absl::StrCat("--min-nodes=", min_nodes),
                   absl::StrCat("--max-nodes=", kNodes)};
  return options;
}

const std::vector<std::string>& TrainArgs() {
  static const std::vector<std::string> args = {absl::StrCat("--steps=", kSteps), "--batch=60",
                                                "--fp64"};
  return args;
}

// The error a failed trainer printed (mlp_trainer's `error="..."`).
std::string TrainerError(const std::string& log) {
  const size_t at = log.find("error=\"");
  if (at == std::string::npos) return "(no error line)";
  const size_t start = at + 7;
  return log.substr(start, log.find("\"\n", start) - start);
}

std::string PauseFor(Stage stage, bool victim) {
  switch (stage) {
    case Stage::kBackward:
      return "backward";
    case Stage::kVictimInCollective:
      return victim ? "marked" : "backward";
    case Stage::kSurvivorsInCollective:
      return victim ? "backward" : "marked";
  }
  return "";
}

struct Trainer {
  int node;
  std::string pause;
  std::string out;
  Process process;
};

bool IsVictim(int node, const std::vector<int>& victims) {
  return std::find(victims.begin(), victims.end(), node) != victims.end();
}

void ResumeSurvivors(std::vector<Trainer>* trainers, const std::vector<int>& victims) {
  for (Trainer& t : *trainers) {
    if (!IsVictim(t.node, victims)) t.process.Signal(SIGCONT);
  }
}

// Starts every trainer paused as `stage` says and waits until all stopped
// and the daemons are where the stage needs them.
void RunUntilPaused(Cluster& cluster, Stage stage, std::vector<Trainer>* trainers,
                    const std::vector<int>& victims,
                    const std::vector<std::string>& extra_args = {}) {
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r) {
      const std::string pause = PauseFor(stage, IsVictim(n, victims));
      const std::string out = absl::StrCat(cluster.dir(), "/w", n, "_", r);
      std::vector<std::string> args = TrainArgs();
      args.push_back("--pause-at=" + pause);
      args.push_back("--print-loss");  // rank 0 prints each completed step
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      trainers->push_back({n, pause, out, StartTrainer(cluster.node(n), r, args, out)});
    }
  }
  for (Trainer& t : *trainers) {
    EXPECT_TRUE(WaitForLog(t.process, "mlp_trainer: paused at " + t.pause, kStateBound) &&
                WaitStopped(t.process, kStateBound))
        << t.process.Log() << cluster.DaemonLogs();
  }
  // The waiting daemons log nothing when they enter a collective; the
  // daemon still waiting for its paused trainers reports a stall.
  if (stage == Stage::kVictimInCollective) {
    EXPECT_TRUE(WaitForLog(cluster.node(0).process(), "event=stall", kStateBound))
        << cluster.DaemonLogs();
  } else if (stage == Stage::kSurvivorsInCollective) {
    EXPECT_TRUE(WaitForLog(cluster.node(kVictimNode).process(), "event=stall", kStateBound))
        << cluster.DaemonLogs();
  }
}

// RunUntilPaused, then SIGKILLs the victims' daemons and trainers and
// resumes the others. Returns the kill's time.
std::chrono::steady_clock::time_point RunUntilKilled(
    Cluster& cluster, Stage stage, std::vector<Trainer>* trainers,
    const std::vector<int>& victims = {kVictimNode}, bool resume = true,
    const std::vector<std::string>& extra_args = {}) {
  RunUntilPaused(cluster, stage, trainers, victims, extra_args);
  const auto killed_at = std::chrono::steady_clock::now();
  for (int n : victims) cluster.node(n).process().Signal(SIGKILL);
  for (Trainer& t : *trainers) {
    if (IsVictim(t.node, victims)) t.process.Signal(SIGKILL);
  }
  if (resume) ResumeSurvivors(trainers, victims);
  return killed_at;
}

// Each trainer's error line, for a failure's message: the first to fail
// is often not the one a test waits for first.
std::string AllTrainerErrors(std::vector<Trainer>& trainers) {
  std::string out;
  for (size_t i = 0; i < trainers.size(); ++i) {
    absl::StrAppend(&out, "trainer ", i, " (node ", trainers[i].node,
                    "): ", TrainerError(trainers[i].process.Log()), "\n");
  }
  return out;
}

// Each of `finishers` ends with GS_OK and the same weights, within 1e-12
// of `reference`; `all_errors` (every trainer's error line) is added to a
// failure's message.
void ExpectEndedAlikeAndLikeTheReference(Cluster& cluster, const std::vector<Trainer*>& finishers,
                                         const std::vector<double>& reference,
                                         const std::function<std::string()>& all_errors) {
  std::vector<double> first;
  for (Trainer* t : finishers) {
    const ExitStatus st = t->process.Wait(kErrorBound);
    ASSERT_TRUE(st.exited) << st.ToString() << t->process.Log() << cluster.DaemonLogs();
    ASSERT_EQ(st.code, 0) << "node " << t->node << ": " << TrainerError(t->process.Log()) << "\n"
                          << all_errors() << cluster.DaemonLogs();
    const std::vector<double> weights = LoadWeights(t->out);
    ASSERT_EQ(weights.size(), reference.size()) << t->out;
    if (first.empty()) first = weights;
    EXPECT_EQ(weights, first) << "node " << t->node << " ended with other weights";
    EXPECT_LT(RelativeDifference(weights, reference), 1e-12) << "node " << t->node;
  }
}

// Every survivor's trainer ends with GS_OK and the same weights as one
// process that averages iterations before the kill over all 6 shards and
// from it on over the survivors' ranks.
void ExpectSurvivorsTrainedLikeTheReference(Cluster& cluster, std::vector<Trainer>& trainers,
                                            int victim = kVictimNode) {
  std::vector<std::string> steps;
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r)
      steps.push_back(absl::StrCat(n == victim ? kKilledStep : kSteps));
  }
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", absl::StrJoin(steps, ",")));
  reference_args.push_back("--join-divide-by-active");
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> survivors;
  for (Trainer& t : trainers) {
    if (t.node != victim) survivors.push_back(&t);
  }
  ExpectEndedAlikeAndLikeTheReference(cluster, survivors, reference,
                                      [&] { return AllTrainerErrors(trainers); });
}

// Node 2's daemon is gone, so its listen port refuses connections: every
// survivor names it dead for that reason (the leader's probe, or etcd's
// record of a survivor's), without waiting out its silence; and each
// re-formation's reason names it and quotes the rendezvous's abort once
// (node 0 in ASurvivorWaiting... learns it from its heartbeat, whose
// explanation the re-formation used to explain again).
void ExpectDeathProvenByProbe(Cluster& cluster) {
  for (int n = 0; n < kNodes; ++n) {
    if (n == kVictimNode) continue;
    const std::string log = cluster.node(n).process().Log();
    const std::string dead =
        absl::StrCat("event=node_presumed_dead generation=1 node_rank=", kVictimNode, " host=");
    const size_t at = log.find(dead);
    ASSERT_NE(at, std::string::npos) << "node " << n << "\n" << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find("reason=\"connection refused\""), std::string::npos) << line;
    const size_t reforming = log.find("event=job_reforming");
    ASSERT_NE(reforming, std::string::npos) << log;
    const std::string reason = log.substr(reforming, log.find('\n', reforming) - reforming);
    const size_t refused = reason.find(" refuses connections");
    EXPECT_NE(refused, std::string::npos) << reason;
    EXPECT_EQ(reason.find(" refuses connections", refused + 1), std::string::npos) << reason;
    const std::string reports = absl::StrCat(kOnEtcd ? "etcd" : "the leader", " reports: ");
    const size_t first = reason.find(reports);
    EXPECT_TRUE(first == std::string::npos || reason.find(reports, first + 1) == std::string::npos)
        << reason;
  }
}

// `found_by_heartbeat`: node 0's trainers stay stopped until its daemon
// re-formed, so no collective of its own notices the death: node 1's
// does, the leader aborts the generation, and node 0 learns it from its
// heartbeat and re-forms while it waits for its trainers (a longer
// timeout, so that holding them is no stall).
void KillNodeTwoAndExpectSurvivorsTrainOn(Stage stage, bool found_by_heartbeat = false) {
  Cluster cluster(JobOptions(/*min_nodes=*/2, found_by_heartbeat ? 4 * kTimeoutS : kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  const auto killed_at =
      RunUntilKilled(cluster, stage, &trainers, {kVictimNode}, !found_by_heartbeat);
  if (found_by_heartbeat) {
    ResumeSurvivors(&trainers, {0, kVictimNode});  // node 1's
    EXPECT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_reformed", kErrorBound))
        << cluster.DaemonLogs();
    ResumeSurvivors(&trainers, {1, kVictimNode});  // node 0's
  }
  Trainer& rank0 = trainers[0];
  // mlp_trainer's rank 0 prints each completed step.
  const std::string redone = absl::StrCat("step   ", kKilledStep, "  loss");
  ASSERT_TRUE(WaitForLog(rank0.process, redone, kErrorBound))
      << rank0.process.Log() << cluster.DaemonLogs();
  const double redo_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();

  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers);
  if (::testing::Test::HasFatalFailure()) return;
  // gs_job_info after the redone iteration: one membership change, the
  // survivors' world, each trainer's own rank.
  for (size_t i = 0; i < trainers.size(); ++i) {
    if (trainers[i].node == kVictimNode) continue;
    const std::string changed =
        absl::StrCat("mlp_trainer: the job's members changed (1 times) by iteration ",
                     kKilledStep + 1, ": world size 4, rank ", i, "\n");
    EXPECT_NE(trainers[i].process.Log().find(changed), std::string::npos)
        << "trainer " << i << ": " << trainers[i].process.Log();
  }
  // The survivors' world: their 4 trainers (what gs_get_job_info reports
  // after each iteration is this divisor).
  absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->world_size(), 4) << cluster.DaemonLogs();
  EXPECT_GE(stats->generation(), 2u);
  for (int n = 0; n < kNodes; ++n) {
    if (n == kVictimNode) continue;
    EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
  }
  ExpectDeathProvenByProbe(cluster);
  std::printf(
      "elastic_job %s%s: SIGKILL of node 2 to the survivors' completion of the redone "
      "iteration %d: %.2f s\n",
      StageName(stage),
      found_by_heartbeat ? " (node 0 learns it from the leader, trainers held)" : "", kKilledStep,
      redo_s);
}

TEST(ElasticJob, NodeKilledMidBackwardSurvivorsRedoTheIterationAndTrainOn) {
  KillNodeTwoAndExpectSurvivorsTrainOn(Stage::kBackward);
}

TEST(ElasticJob, NodeKilledInsideTheCollectiveSurvivorsRedoTheIterationAndTrainOn) {
  KillNodeTwoAndExpectSurvivorsTrainOn(Stage::kVictimInCollective);
}

TEST(ElasticJob, SurvivorsInsideTheCollectiveRedoFromTheirKeptSumsAndTrainOn) {
  KillNodeTwoAndExpectSurvivorsTrainOn(Stage::kSurvivorsInCollective);
}

TEST(ElasticJob, ASurvivorWaitingForItsTrainersLearnsTheDeathFromTheLeaderAndRedoesToo) {
  KillNodeTwoAndExpectSurvivorsTrainOn(Stage::kBackward, /*found_by_heartbeat=*/true);
}

// Node 2 dies inside iteration 2's last collective after node 0 completed
// it and before node 1 did: node 1's daemon is given the test hook that
// withholds the last bucket's result (its arenas get NaN there, its
// collective fails) until node 2 is dead. The survivors stopped one
// iteration apart; they form the next generation anyway, node 0 broadcasts
// iteration 2's kept result, node 1 writes it back and completes 2 with
// its divisor (6, as node 0's trainers got it) and both train on over
// their 4 trainers: the reference averages iterations 0-2 over all 6.
TEST(ElasticJob, ANodeKilledInTheLastCollectiveAfterOneSurvivorCompletedItIsCommittedOnAll) {
  ScratchDir scratch("split");
  const std::string release = scratch.File("release");
  ClusterOptions options = JobOptions(/*min_nodes=*/2);
  options.node_env.resize(kNodes);
  options.node_env[1] = {{"GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_AT", absl::StrCat(kKilledStep)},
                         {"GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_UNTIL", release}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r) {
      const std::string out = absl::StrCat(cluster.dir(), "/w", n, "_", r);
      std::vector<std::string> args = TrainArgs();
      args.push_back("--print-loss");  // rank 0 prints each completed step
      trainers.push_back({n, "", out, StartTrainer(cluster.node(n), r, args, out)});
    }
  }
  const std::string withheld =
      absl::StrCat("event=test_final_result_withheld iteration=", kKilledStep);
  ASSERT_TRUE(WaitForLog(cluster.node(1).process(), withheld, kStateBound)) << cluster.DaemonLogs();
  // Node 0 completed the iteration node 1 is still in.
  const std::string completed = absl::StrCat("step   ", kKilledStep, "  loss");
  ASSERT_TRUE(WaitForLog(trainers[0].process, completed, kStateBound))
      << trainers[0].process.Log() << cluster.DaemonLogs();
  const auto killed_at = std::chrono::steady_clock::now();
  cluster.node(kVictimNode).process().Signal(SIGKILL);
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) t.process.Signal(SIGKILL);
  }
  cluster.node(kVictimNode).process().Wait(kStateBound);
  std::FILE* go = std::fopen(release.c_str(), "w");  // node 1's collective fails now
  ASSERT_NE(go, nullptr) << release;
  std::fclose(go);
  // The first iteration over the survivors completes once node 1 committed.
  const std::string next = absl::StrCat("step   ", kKilledStep + 1, "  loss");
  ASSERT_TRUE(WaitForLog(trainers[0].process, next, kErrorBound))
      << trainers[0].process.Log() << cluster.DaemonLogs();
  const double next_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();

  std::vector<std::string> steps;
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r) {
      steps.push_back(absl::StrCat(n == kVictimNode ? kKilledStep + 1 : kSteps));
    }
  }
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", absl::StrJoin(steps, ",")));
  reference_args.push_back("--join-divide-by-active");
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> survivors;
  for (Trainer& t : trainers) {
    if (t.node != kVictimNode) survivors.push_back(&t);
  }
  ExpectEndedAlikeAndLikeTheReference(cluster, survivors, reference,
                                      [&] { return AllTrainerErrors(trainers); });
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_NE(cluster.node(0).process().Log().find(absl::StrCat(
                "event=split_iteration_commit iteration=", kKilledStep, " from_node_rank=0")),
            std::string::npos)
      << cluster.DaemonLogs();
  EXPECT_NE(cluster.node(1).process().Log().find(absl::StrCat(
                "event=split_iteration_committed iteration=", kKilledStep, " divisor=6")),
            std::string::npos)
      << cluster.DaemonLogs();
  // One membership change, seen after the first iteration over the
  // survivors (the committed one was the old members').
  for (size_t i = 0; i < trainers.size(); ++i) {
    if (trainers[i].node == kVictimNode) continue;
    const std::string changed =
        absl::StrCat("mlp_trainer: the job's members changed (1 times) by iteration ",
                     kKilledStep + 2, ": world size 4, rank ", i, "\n");
    EXPECT_NE(trainers[i].process.Log().find(changed), std::string::npos)
        << "trainer " << i << ": " << trainers[i].process.Log();
  }
  std::printf(
      "elastic_job split_iteration: SIGKILL of node 2 (node 1 released once it was reaped) to "
      "the survivors' completion of iteration %d, after committing %d: %.2f s\n",
      kKilledStep + 1, kKilledStep, next_s);
}

// Node 2's daemon stopped with SIGTERM mid-backward (a scale-down): it
// leaves the job, its trainers (resumed after the signal) get the shutdown
// error naming SIGTERM, and the survivors re-form without it at once (the
// leader counts it out as departed, no silence waited out) and train like
// the reference.
// Every trainer paused mid-backward, `node`'s daemon gets SIGTERM and every
// trainer resumes: `node`'s get the shutdown error naming SIGTERM, and its
// daemon exits 0. Returns the signal's time.
std::chrono::steady_clock::time_point StopNodeWithSigterm(Cluster& cluster,
                                                          std::vector<Trainer>* trainers, int node,
                                                          Stage stage = Stage::kBackward) {
  RunUntilPaused(cluster, stage, trainers, {node});
  const auto stopped_at = std::chrono::steady_clock::now();
  cluster.node(node).process().Signal(SIGTERM);
  // Resumed once the daemon failed its job: resumed earlier, the trainers
  // could finish every step before the daemon's shutdown reached the job.
  EXPECT_TRUE(WaitForLog(cluster.node(node).process(), "event=job_failed job=1 code=UNAVAILABLE",
                         kErrorBound))
      << cluster.DaemonLogs();
  ResumeSurvivors(trainers, {});  // the stopped node's too: they learn of the shutdown
  for (Trainer& t : *trainers) {
    if (t.node != node) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    EXPECT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitUnavailable) << error << cluster.DaemonLogs();
    EXPECT_NE(error.find("gradsyncd is shutting down (SIGTERM)"), std::string::npos) << error;
  }
  const ExitStatus stopped = cluster.node(node).process().Wait(kErrorBound);
  EXPECT_TRUE(stopped.exited && stopped.code == 0) << stopped.ToString() << cluster.DaemonLogs();
  return stopped_at;
}

// Node 2 stopped with SIGTERM at `stage`: it leaves, the survivors train
// like the reference and count it out as departed, never presumed dead
// (after its silence, or because its closed port refused a probe).
void StopNodeTwoWithSigtermAndExpectItDeparted(Stage stage) {
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  const auto stopped_at = StopNodeWithSigterm(cluster, &trainers, kVictimNode, stage);
  EXPECT_NE(cluster.node(kVictimNode).process().Log().find("event=departing generation=1"),
            std::string::npos)
      << cluster.DaemonLogs();
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers);
  if (::testing::Test::HasFatalFailure()) return;
  std::printf("elastic_job sigterm %s: SIGTERM of node 2 to the survivors' completion: %.2f s\n",
              StageName(stage),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count());
  for (int n = 0; n < kNodes; ++n) {
    if (n == kVictimNode) continue;
    const std::string log = cluster.node(n).process().Log();
    EXPECT_NE(log.find("event=node_departed generation=1 node_rank=2"), std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
    EXPECT_NE(log.find("event=job_reformed job="), std::string::npos) << cluster.DaemonLogs();
    EXPECT_EQ(log.find("event=node_presumed_dead"), std::string::npos) << "node " << n << "\n"
                                                                       << cluster.DaemonLogs();
    EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
  }
  if (!kOnEtcd) {
    // The leader formed generation 2 with node 2 named as having left.
    const std::string leader = cluster.node(0).process().Log();
    EXPECT_NE(leader.find("event=member_departed generation=1 node_rank=2"), std::string::npos)
        << cluster.DaemonLogs();
  }
}

TEST(ElasticJob, NodeStoppedWithSigtermLeavesAndTheSurvivorsReformWithoutItAtOnce) {
  StopNodeTwoWithSigtermAndExpectItDeparted(Stage::kBackward);
}

// The survivors wait inside the collective, so node 2's Gloo worker going
// fails it at once and they probe node 2's port: the daemon closes it only
// after its departure reached the rendezvous, so it is named departed.
TEST(ElasticJob, NodeStoppedWithSigtermWhileTheSurvivorsWaitInTheCollectiveIsNamedDeparted) {
  StopNodeTwoWithSigtermAndExpectItDeparted(Stage::kSurvivorsInCollective);
}

// Node 2's trainers SIGKILLed mid-backward while its daemon lives on (what
// a Kubernetes scale-down does: it stops a Pod's trainers before its
// sidecar): with its last trainer gone the node leaves the job, and the
// survivors re-form without it at once.
TEST(ElasticJob, ANodeWhoseTrainersAllDiedLeavesAndTheSurvivorsReformWithoutIt) {
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilPaused(cluster, Stage::kBackward, &trainers, {kVictimNode});
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) t.process.Signal(SIGKILL);
  }
  ASSERT_TRUE(
      WaitForLog(cluster.node(kVictimNode).process(), "event=departing generation=1", kErrorBound))
      << cluster.DaemonLogs();
  // Whichever death the daemon handled first takes the node out: the first
  // (it had marked part of the iteration) or the last.
  const std::string victim_log = cluster.node(kVictimNode).process().Log();
  EXPECT_TRUE(victim_log.find("so its node leaves the job") != std::string::npos ||
              victim_log.find("its node's last trainer") != std::string::npos)
      << cluster.DaemonLogs();
  ResumeSurvivors(&trainers, {kVictimNode});
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers);
  for (int n = 0; n < kNodes; ++n) {
    const std::string log = cluster.node(n).process().Log();
    if (n == kVictimNode) continue;
    EXPECT_NE(log.find("event=node_departed generation=1 node_rank=2"), std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
    EXPECT_EQ(log.find("event=node_presumed_dead"), std::string::npos) << "node " << n << "\n"
                                                                       << cluster.DaemonLogs();
  }
  EXPECT_TRUE(cluster.node(kVictimNode).process().Running()) << cluster.DaemonLogs();
}

// Node 1 dies, so node 2 is the second of the survivors' two members (its
// Gloo rank 1); its rank 4 then broadcasts a buffer of two pieces to every
// survivor's trainers, which check each byte, and training stays exact.
TEST(ElasticJob, BroadcastAfterAReformationRunsAmongTheSurvivors) {
  constexpr int kVictim = 1, kBroadcastStep = 4, kRoot = 4;
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {kVictim}, /*resume=*/true,
                 {absl::StrCat("--broadcast-after=", kBroadcastStep, ":", kRoot)});
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers, kVictim);
  if (::testing::Test::HasFatalFailure()) return;
  const std::string received = absl::StrCat("mlp_trainer: gs_broadcast from rank ", kRoot,
                                            " after step ", kBroadcastStep, ": 5242883 bytes ok");
  for (Trainer& t : trainers) {
    if (t.node == kVictim) continue;
    EXPECT_NE(t.process.Log().find(received), std::string::npos)
        << "node " << t.node << ": " << t.process.Log();
  }
  EXPECT_NE(cluster.node(0).process().Log().find("event=broadcast_world nodes=2 node_index=0"),
            std::string::npos)
      << cluster.DaemonLogs();
  EXPECT_NE(cluster.node(2).process().Log().find("event=broadcast_world nodes=2 node_index=1"),
            std::string::npos)
      << cluster.DaemonLogs();
}

// The same for --check-replicas-every: node 1 dies, and the checks after
// iterations 4, 6 and 8 compare the survivors' replicas across node 0 and
// node 2 (its second member), training staying exact.
TEST(ElasticJob, ReplicaChecksAfterAReformationCompareAmongTheSurvivors) {
  constexpr int kVictim = 1;
  ClusterOptions options = JobOptions(/*min_nodes=*/2);
  options.flags.push_back("--check-replicas-every=2");
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {kVictim}, /*resume=*/true,
                 {"--check-replicas"});
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers, kVictim);
  if (::testing::Test::HasFatalFailure()) return;
  for (Trainer& t : trainers) {
    if (t.node == kVictim) continue;
    EXPECT_NE(t.process.Log().find("replicas checked after iteration 8 (world size 4)"),
              std::string::npos)
        << "node " << t.node << ": " << t.process.Log();
  }
  for (int n : {0, 2}) {
    const std::string log = cluster.node(n).process().Log();
    const size_t at = log.find("event=replicas_equal iteration=8 trainers=2 ");
    ASSERT_NE(at, std::string::npos) << "node " << n << "\n" << cluster.DaemonLogs();
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find(" nodes=2"), std::string::npos) << line;
  }
}

// A root on the dead node is no member's: every survivor's trainer gets
// INVALID_ARGUMENT naming the rank.
TEST(ElasticJob, BroadcastFromADeadNodesRankAfterAReformationFailsNamingTheRank) {
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {kVictimNode}, /*resume=*/true,
                 {"--broadcast-after=4:5"});
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitInvalidArgument) << error << cluster.DaemonLogs();
    EXPECT_NE(error.find("root_rank 5 is on no node of the job"), std::string::npos)
        << "node " << t.node << ": " << error;
  }
}

// Starts every trainer with `extra_args`, node 1's daemon holding piece 1
// of the first two-piece broadcast (the test hook) until `release` exists,
// and SIGKILLs node 2 (daemon and trainers) once node 1 holds it: nodes 0
// and 2 were inside that piece's collective. Node 1 is released once node
// 0 re-formed: its call to node 1 cannot have completed meanwhile (a Gloo
// send waits for the receiver), so node 1's call fails in the old world.
void KillNodeTwoDuringABroadcast(Cluster& cluster, const std::string& release,
                                 std::vector<Trainer>* trainers,
                                 const std::vector<std::string>& extra_args) {
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r) {
      const std::string out = absl::StrCat(cluster.dir(), "/w", n, "_", r);
      std::vector<std::string> args = TrainArgs();
      args.push_back("--print-loss");
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      trainers->push_back({n, "", out, StartTrainer(cluster.node(n), r, args, out)});
    }
  }
  ASSERT_TRUE(
      WaitForLog(cluster.node(1).process(), "event=test_broadcast_held piece=1", kStateBound))
      << cluster.DaemonLogs();
  cluster.node(kVictimNode).process().Signal(SIGKILL);
  for (Trainer& t : *trainers) {
    if (t.node == kVictimNode) t.process.Signal(SIGKILL);
  }
  cluster.node(kVictimNode).process().Wait(kStateBound);
  EXPECT_TRUE(
      WaitForLog(cluster.node(0).process(), "event=job_reformed job=1 generation=2 ", kErrorBound))
      << cluster.DaemonLogs();
  std::FILE* go = std::fopen(release.c_str(), "w");
  ASSERT_NE(go, nullptr) << release;
  std::fclose(go);
}

ClusterOptions HoldingPieceOneOnNodeOne(const std::string& release) {
  // A longer timeout: holding the piece is no stall.
  ClusterOptions options = JobOptions(/*min_nodes=*/2, 4 * kTimeoutS);
  options.node_env.resize(kNodes);
  options.node_env[1] = {{"GRADSYNC_TEST_HOLD_BROADCAST_PIECE", "1"},
                         {"GRADSYNC_TEST_HOLD_BROADCAST_UNTIL", release}};
  return options;
}

// Node 2 dies while rank 0 broadcasts 5 MiB + 3 bytes (two pieces) after
// iteration 1: the survivors re-form, run the interrupted piece again
// among themselves, every survivor's gs_broadcast returns GS_OK with rank
// 0's bytes, and training goes on over the survivors exactly.
TEST(ElasticJob, ANodeKilledDuringABroadcastLetsTheSurvivorsFinishItAndTrainOn) {
  ScratchDir scratch("bcast_death");
  const std::string release = scratch.File("release");
  Cluster cluster(HoldingPieceOneOnNodeOne(release));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  KillNodeTwoDuringABroadcast(cluster, release, &trainers, {"--broadcast-after=1:0"});
  if (::testing::Test::HasFatalFailure()) return;
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers);
  if (::testing::Test::HasFatalFailure()) return;
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) continue;
    EXPECT_NE(t.process.Log().find("gs_broadcast from rank 0 after step 1: 5242883 bytes ok"),
              std::string::npos)
        << "node " << t.node << ": " << t.process.Log();
  }
  for (int n : {0, 1}) {
    const std::string log = cluster.node(n).process().Log();
    EXPECT_NE(log.find("event=broadcast_resumed behind=\"node_rank=0 at broadcast 1 step 2\""),
              std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
    EXPECT_EQ(log.find("event=job_failed"), std::string::npos) << "node " << n << "\n" << log;
  }
}

// The same with the root (rank 4) on the node that dies: node 0 got the
// last piece and went on (a step ahead of node 1, which did not), and the
// bytes node 1 misses are gone, so every survivor's trainer gets
// INVALID_ARGUMENT naming the root.
TEST(ElasticJob, TheRootsNodeKilledDuringABroadcastFailsItNamingTheRoot) {
  ScratchDir scratch("bcast_root_death");
  const std::string release = scratch.File("release");
  Cluster cluster(HoldingPieceOneOnNodeOne(release));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  KillNodeTwoDuringABroadcast(cluster, release, &trainers, {"--broadcast-after=1:4"});
  if (::testing::Test::HasFatalFailure()) return;
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitInvalidArgument) << error << cluster.DaemonLogs();
    EXPECT_NE(error.find("root_rank 4 is on no node of the job: its node died during the "
                         "broadcast"),
              std::string::npos)
        << "node " << t.node << ": " << error;
  }
}

// Four nodes of one trainer; rank 0 broadcasts after iteration 1. Gloo's
// broadcast is a tree: node 0 sends piece 1 to node 1, then to node 2
// while node 1 passes it on to node 3, which holds it (the test hook).
// Node 2 is killed once its trainer received the whole broadcast: node 0
// completed it and went on, nodes 1 and 3 did not (node 1 still sends to
// node 3), so the survivors stopped a step apart. They re-form, node 0
// sends the last piece again from its slot, nodes 1 and 3 complete their
// calls with it, and all train on exactly.
TEST(ElasticJob, SurvivorsAStepApartInABroadcastCatchUpFromTheRootAndTrainOn) {
  constexpr int kFour = 4, kLag = 2;
  ScratchDir scratch("bcast_lag");
  const std::string release = scratch.File("release");
  ClusterOptions options = JobOptions(/*min_nodes=*/2, 4 * kTimeoutS);
  options.nodes = kFour;
  options.local_size = 1;
  options.flags.back() = absl::StrCat("--max-nodes=", kFour);
  options.node_env.resize(kFour);
  options.node_env[3] = {{"GRADSYNC_TEST_HOLD_BROADCAST_PIECE", "1"},
                         {"GRADSYNC_TEST_HOLD_BROADCAST_UNTIL", release}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  for (int n = 0; n < kFour; ++n) {
    const std::string out = absl::StrCat(cluster.dir(), "/w", n);
    std::vector<std::string> args = TrainArgs();
    args.push_back("--broadcast-after=1:0");
    trainers.push_back({n, "", out, StartTrainer(cluster.node(n), 0, args, out)});
  }
  const std::string received = "gs_broadcast from rank 0 after step 1: 5242883 bytes ok";
  ASSERT_TRUE(
      WaitForLog(cluster.node(3).process(), "event=test_broadcast_held piece=1", kStateBound))
      << cluster.DaemonLogs();
  ASSERT_TRUE(WaitForLog(trainers[kLag].process, received, kStateBound))
      << trainers[kLag].process.Log() << cluster.DaemonLogs();
  cluster.node(kLag).process().Signal(SIGKILL);
  trainers[kLag].process.Signal(SIGKILL);
  ASSERT_TRUE(
      WaitForLog(cluster.node(0).process(), "event=job_reformed job=1 generation=2 ", kErrorBound))
      << cluster.DaemonLogs();
  std::FILE* go = std::fopen(release.c_str(), "w");
  ASSERT_NE(go, nullptr) << release;
  std::fclose(go);
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(
      absl::StrCat("--join-steps=", kSteps, ",", kSteps, ",", kKilledStep, ",", kSteps));
  reference_args.push_back("--join-divide-by-active");
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> survivors = {&trainers[0], &trainers[1], &trainers[3]};
  ExpectEndedAlikeAndLikeTheReference(cluster, survivors, reference,
                                      [&] { return AllTrainerErrors(trainers); });
  for (Trainer* t : survivors) {
    EXPECT_NE(t->process.Log().find(received), std::string::npos)
        << "node " << t->node << ": " << t->process.Log();
  }
  for (int n : {0, 1, 3}) {
    const std::string log = cluster.node(n).process().Log();
    EXPECT_NE(log.find("event=broadcast_catch_up step=2 bytes=5242883 root_rank=0 root_place=0"),
              std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
    EXPECT_NE(log.find("ahead=\"node_rank=0 at broadcast 2 step 0\" root_place=0 caught_up=true"),
              std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
  }
}

// Which node dies in iteration 2 and which joins the running job after the
// survivors re-formed: a replacement daemon for the dead node's rank, or a
// new rank below --max-nodes (a spare node of the cluster).
struct NodeSwap {
  int victim = kVictimNode;
  int joiner = kVictimNode;
};

// A node joins (a fresh daemon and trainers, --catch-up) while the
// survivors' generation runs. The lowest survivor's trainers are held (the
// longer timeout keeps that from being a stall) until every survivor read
// the grow entry, so they switch at its iteration m; from m on the job
// averages over 6 again. The joiner's trainers take the ranks the dead node
// left free (the lowest free range), start at iteration m with the lowest
// live rank's weights (gs_broadcast from gs_job_info.catch_up_root:
// joined_running_job on theirs, nodes_joined on the survivors'), and all 6
// end with the same weights, within 1e-12 of one process that averages
// iterations 0-1 over all six shards, 2..m-1 over the survivors' and m on
// over all six again. `extra_args` go to every trainer, --catch-up added.
// Returns the survivors' and the joiner's trainers.
void SwapNodeWhileTheJobRuns(Cluster& cluster, std::vector<Trainer>* trainers,
                             std::vector<Trainer>* replacements, int* m,
                             const std::vector<std::string>& extra_args = {}, NodeSwap swap = {}) {
  std::vector<std::string> args = extra_args;
  args.push_back("--catch-up");
  // The lowest survivor: the embedded leader, or etcd's first member.
  const int held = swap.victim == 0 ? 1 : 0;
  RunUntilKilled(cluster, Stage::kBackward, trainers, {swap.victim}, /*resume=*/false, args);
  ResumeSurvivors(trainers, {held, swap.victim});  // the others': their collective fails
  ASSERT_TRUE(WaitForLog(cluster.node(held).process(), "event=job_reformed", kErrorBound))
      << cluster.DaemonLogs();
  ASSERT_TRUE(cluster.StartNode(swap.joiner)) << cluster.DaemonLogs();
  for (int r = 0; r < kLocal; ++r) {
    std::vector<std::string> replacement_args = TrainArgs();
    replacement_args.insert(replacement_args.end(), args.begin(), args.end());
    const std::string out = absl::StrCat(cluster.dir(), "/replacement_", r);
    replacements->push_back(
        {swap.joiner, "", out, StartTrainer(cluster.node(swap.joiner), r, replacement_args, out)});
  }
  // The rendezvous holds the joiner and the lowest survivor (the leader, or
  // etcd's first member) publishes the grow entry; every survivor reads it
  // before the held trainers go on.
  ASSERT_TRUE(WaitForLog(cluster.node(held).process(), "event=job_grow_published", kErrorBound))
      << cluster.DaemonLogs();
  for (int n = 0; n < kNodes; ++n) {
    if (n == swap.victim) continue;
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(), "event=job_grow_read", kErrorBound))
        << cluster.DaemonLogs();
  }
  for (Trainer& t : *trainers) {
    if (t.node == held) t.process.Signal(SIGCONT);
  }
  // m: where the replacements started (their trainers print it).
  const std::string joined = "mlp_trainer: joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog((*replacements)[0].process, joined, kErrorBound))
      << (*replacements)[0].process.Log() << cluster.DaemonLogs();
  const std::string log = (*replacements)[0].process.Log();
  *m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(*m, kKilledStep);
  ASSERT_LT(*m, kSteps) << "the survivors finished before the replacement joined";
  // The lowest live rank sends the state; the joiner's trainers hold the
  // dead node's ranks, which no survivor holds.
  for (size_t i = 0; i < replacements->size(); ++i) {
    const std::string line =
        absl::StrCat(joined, *m, ": state from rank ", held * kLocal, ", world size 6, rank ",
                     swap.victim * kLocal + static_cast<int>(i), "\n");
    EXPECT_TRUE(WaitForLog((*replacements)[i].process, line, kErrorBound))
        << line << (*replacements)[i].process.Log();
  }

  std::vector<std::string> steps;
  for (int rank = 0; rank < kNodes * kLocal; ++rank) {
    steps.push_back(absl::StrCat(rank / kLocal == swap.victim ? kKilledStep : kSteps));
  }
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", absl::StrJoin(steps, ",")));
  reference_args.push_back("--join-divide-by-active");
  reference_args.push_back(absl::StrCat("--rejoin-at=", *m));
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> everyone;
  for (Trainer& t : *trainers) {
    if (t.node != swap.victim) everyone.push_back(&t);
  }
  for (Trainer& t : *replacements) everyone.push_back(&t);
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(cluster, everyone, reference, [&] {
    return AllTrainerErrors(*trainers) + AllTrainerErrors(*replacements);
  }));
  // The survivors kept their ranks through both membership changes.
  const std::string sent = absl::StrCat("mlp_trainer: nodes joined after iteration ", *m,
                                        ": state sent from rank ", held * kLocal, "\n");
  for (size_t i = 0; i < trainers->size(); ++i) {
    Trainer& t = (*trainers)[i];
    if (t.node == swap.victim) continue;
    EXPECT_NE(t.process.Log().find(sent), std::string::npos) << t.process.Log();
    const std::string changed =
        absl::StrCat("mlp_trainer: the job's members changed (2 times) by iteration ", *m,
                     ": world size 4, rank ", i, "\n");
    EXPECT_NE(t.process.Log().find(changed), std::string::npos) << changed << t.process.Log();
  }
}

TEST(ElasticJob, AReplacementNodeJoinsTheRunningJobCatchesUpAndTrainsOverAllAgain) {
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  int m = 0;
  ASSERT_NO_FATAL_FAILURE(SwapNodeWhileTheJobRuns(cluster, &trainers, &replacements, &m));
  absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->world_size(), 6) << cluster.DaemonLogs();
  EXPECT_EQ(stats->generation(), 3u);
  std::printf("elastic_job join: node 2 killed in iteration %d, its replacement joined at %d\n",
              kKilledStep, m);
}

// A node joins and the catch-up root's node dies during the catch-up (on
// etcd, where node 0 may die): node 2 dies in iteration 2, a replacement
// node 2 joins at m, and every trainer broadcasts the state from rank 0.
// Node 0 holds piece 0 of it (the test hook) and is SIGKILLed with its
// trainers; node 1 and the joiner re-form and run the catch-up again from
// rank 2, the lowest live rank of an old member (the joiner's ranks 4-5
// are not): all four end within 1e-12 of one process that averages 0-1
// over 6, 2..m-1 over ranks 0-3 and m on over ranks 2-5.
TEST(ElasticJob, AJoinersCatchUpWhoseRootsNodeDiesRunsAgainFromTheNextOldMember) {
  if (!kOnEtcd) GTEST_SKIP() << "the root, rank 0, is on node 0, whose death ends a leader's job";
  SKIP_WITHOUT_ETCD();
  constexpr int kNewRoot = 2;
  ScratchDir scratch("joiner_root_death");
  ClusterOptions options = JobOptions(/*min_nodes=*/2, 4 * kTimeoutS);
  options.node_env.resize(kNodes);
  options.node_env[0] = {{"GRADSYNC_TEST_HOLD_BROADCAST_PIECE", "0"},
                         {"GRADSYNC_TEST_HOLD_BROADCAST_UNTIL", scratch.File("never")}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {kVictimNode}, /*resume=*/false,
                 {"--catch-up"});
  // Node 0's trainers stay held until every survivor read the grow entry.
  ResumeSurvivors(&trainers, {0, kVictimNode});
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_reformed", kErrorBound))
      << cluster.DaemonLogs();
  ASSERT_TRUE(cluster.StartNode(kVictimNode)) << cluster.DaemonLogs();
  for (int r = 0; r < kLocal; ++r) {
    std::vector<std::string> args = TrainArgs();
    args.push_back("--catch-up");
    const std::string out = absl::StrCat(cluster.dir(), "/replacement_", r);
    replacements.push_back(
        {kVictimNode, "", out, StartTrainer(cluster.node(kVictimNode), r, args, out)});
  }
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_grow_published", kErrorBound))
      << cluster.DaemonLogs();
  for (int n : {0, 1}) {
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(), "event=job_grow_read", kErrorBound))
        << cluster.DaemonLogs();
  }
  for (int r = 0; r < kLocal; ++r) trainers[r].process.Signal(SIGCONT);
  ASSERT_TRUE(
      WaitForLog(cluster.node(0).process(), "event=test_broadcast_held piece=0", kErrorBound))
      << cluster.DaemonLogs();
  cluster.node(0).process().Signal(SIGKILL);
  for (int r = 0; r < kLocal; ++r) trainers[r].process.Signal(SIGKILL);
  const std::string joined = "mlp_trainer: joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog(replacements[0].process, joined, kErrorBound))
      << replacements[0].process.Log() << cluster.DaemonLogs();
  const std::string log = replacements[0].process.Log();
  const int m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(m, kKilledStep);
  EXPECT_NE(log.find(absl::StrCat(joined, m, ": state from rank ", kNewRoot, ",")),
            std::string::npos)
      << log;

  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", m, ",", m, ",", kSteps, ",", kSteps, ",",
                                        kKilledStep, ",", kKilledStep));
  reference_args.push_back("--join-divide-by-active");
  reference_args.push_back(absl::StrCat("--rejoin-at=", m));
  reference_args.push_back("--rejoin-ranks=4,5");
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> everyone = {&trainers[2], &trainers[3], &replacements[0], &replacements[1]};
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(cluster, everyone, reference, [&] {
    return AllTrainerErrors(trainers) + AllTrainerErrors(replacements);
  }));
  for (int n : {1, 2}) {
    EXPECT_NE(cluster.node(n).process().Log().find(
                  absl::StrCat("event=catch_up_root_replaced old=0 new=", kNewRoot)),
              std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
  }
}

// Node 1 dies, so the survivors hold ranks 0-1 and 4-5; a new node 3
// (below --max-nodes 4) joins. Counting the trainers of the members before
// it would give it ranks 4-5, node 2's: it takes the free 2-3 instead, its
// trainers train on ranks 2-3's shards, and everyone ends like the
// reference.
TEST(ElasticJob, ANewRankJoiningAfterAHoleTakesTheFreeRanksNotAMembers) {
  ClusterOptions options = JobOptions(/*min_nodes=*/2, 4 * kTimeoutS);
  options.spare_nodes = 1;
  options.flags.back() = "--max-nodes=4";
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  int m = 0;
  ASSERT_NO_FATAL_FAILURE(SwapNodeWhileTheJobRuns(cluster, &trainers, &replacements, &m, {},
                                                  NodeSwap{/*victim=*/1, /*joiner=*/3}));
  absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->world_size(), 6) << cluster.DaemonLogs();
}

// Node 1 dies (the survivors hold ranks 0-1 and 4-5) and a replacement
// node 1 joins: it gets its old ranks 2-3 back, between the survivors'.
TEST(ElasticJob, AReplacementForAMiddleNodeGetsItsOldRanksBack) {
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  int m = 0;
  ASSERT_NO_FATAL_FAILURE(SwapNodeWhileTheJobRuns(cluster, &trainers, &replacements, &m, {},
                                                  NodeSwap{/*victim=*/1, /*joiner=*/1}));
}

// On etcd node 0 may die and be replaced: nodes 1 and 2 re-form (ranks 2-5),
// a fresh node 0 joins, takes ranks 0-1 again and catches up from rank 2,
// the lowest live rank; everyone ends like the reference.
TEST(ElasticJob, AReplacementNodeZeroJoinsOnEtcdAndCatchesUpFromTheLowestLiveRank) {
  if (!kOnEtcd) GTEST_SKIP() << "the embedded leader's death ends the job (LeaderKilled...)";
  SKIP_WITHOUT_ETCD();
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  int m = 0;
  ASSERT_NO_FATAL_FAILURE(SwapNodeWhileTheJobRuns(cluster, &trainers, &replacements, &m, {},
                                                  NodeSwap{/*victim=*/0, /*joiner=*/0}));
}

// --check-replicas-every=1, so a check is due right at the join boundary
// (after iteration m, the old world's last): every trainer of the grown
// world takes part, the replacements' once they received the catch-up root's state
// (their gs_job_info says a check is due at the iteration they start at),
// and it compares all three nodes' trainers on the grown world, as every
// later check does.
TEST(ElasticJob, AReplicaCheckDueWhereANodeJoinsRunsOnTheGrownWorld) {
  ClusterOptions options = JobOptions(/*min_nodes=*/2, 4 * kTimeoutS);
  options.flags.push_back("--check-replicas-every=1");
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  int m = 0;
  ASSERT_NO_FATAL_FAILURE(
      SwapNodeWhileTheJobRuns(cluster, &trainers, &replacements, &m, {"--check-replicas"}));
  for (Trainer& t : replacements) {
    EXPECT_NE(t.process.Log().find(absl::StrCat("replicas checked after iteration ", m, " ")),
              std::string::npos)
        << t.process.Log();
  }
  for (int n = 0; n < kNodes; ++n) {
    const std::string log = cluster.node(n).process().Log();
    for (int it : {m, m + 1}) {
      const std::string equal = absl::StrCat("event=replicas_equal iteration=", it, " trainers=2 ");
      const size_t at = log.find(equal);
      ASSERT_NE(at, std::string::npos) << equal << " on node " << n << "\n" << cluster.DaemonLogs();
      const std::string line = log.substr(at, log.find('\n', at) - at);
      EXPECT_NE(line.find(" nodes=3"), std::string::npos) << line;
    }
  }
}

// Nodes 0 and 1 train (--num-nodes 2, --min-nodes 1, --max-nodes 3, every
// trainer on a sixth of the batch) and node 2 (started with `joiner` in
// `options`: its flags, its environment) joins during iteration 2: node 0's
// trainers are held there until both members read the grow entry, so the
// members meet the joiner at the same boundary. trainers: the members'
// four, then the joiner's two.
void StartMembersAndAJoiner(Cluster& cluster, std::vector<Trainer>* trainers) {
  for (int n = 0; n < 3; ++n) {
    if (n == 2) {
      for (Trainer& t : *trainers) {
        if (t.node != 0) continue;
        ASSERT_TRUE(WaitForLog(t.process, "mlp_trainer: paused at backward", kStateBound) &&
                    WaitStopped(t.process, kStateBound))
            << t.process.Log() << cluster.DaemonLogs();
      }
      ASSERT_TRUE(cluster.StartNode(2)) << cluster.DaemonLogs();
    }
    for (int r = 0; r < kLocal; ++r) {
      std::vector<std::string> args = TrainArgs();
      args.insert(args.end(), {"--catch-up", "--shard-world=6"});
      if (n == 0) args.push_back("--pause-at=backward");
      const std::string out = absl::StrCat(cluster.dir(), "/w", n, "_", r);
      trainers->push_back({n, "", out, StartTrainer(cluster.node(n), r, args, out)});
    }
  }
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_grow_published", kErrorBound))
      << cluster.DaemonLogs();
  for (int n : {0, 1}) {
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(), "event=job_grow_read", kErrorBound))
        << cluster.DaemonLogs();
  }
  for (Trainer& t : *trainers) {
    if (t.node == 0) t.process.Signal(SIGCONT);
  }
}

ClusterOptions MembersAndAJoiner() {
  ClusterOptions options = JobOptions(/*min_nodes=*/1, 4 * kTimeoutS);
  options.nodes = 2;
  options.spare_nodes = 1;
  options.flags.back() = "--max-nodes=3";
  return options;
}

// --max-nodes above --num-nodes: a job of nodes 0 and 1 (--num-nodes 2,
// --min-nodes 1, --max-nodes 3; 2 trainers each, every trainer on a sixth
// of the batch) takes a new node 2 while it runs. Node 0's trainers are
// held in iteration 2 until both members read the grow entry; from the
// join iteration m on the job averages over 6 trainers instead of 4, and
// all six end within 1e-12 of the reference (ranks 4-5 inactive before m).
TEST(ElasticJob, ANewRankBelowMaxNodesJoinsTheRunningJobAndTrainsWithIt) {
  Cluster cluster(MembersAndAJoiner());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  ASSERT_NO_FATAL_FAILURE(StartMembersAndAJoiner(cluster, &trainers));
  const std::string joined = "mlp_trainer: joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog(trainers[4].process, joined, kErrorBound))
      << trainers[4].process.Log() << cluster.DaemonLogs();
  const std::string log = trainers[4].process.Log();
  const int m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(m, kKilledStep);
  ASSERT_LT(m, kSteps) << "the members finished before node 2 joined";
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.insert(
      reference_args.end(),
      {"--join-steps=8,8,8,8,0,0", "--join-divide-by-active", absl::StrCat("--rejoin-at=", m)});
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> everyone;
  for (Trainer& t : trainers) everyone.push_back(&t);
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(
      cluster, everyone, reference, [&] { return AllTrainerErrors(trainers); }));
  EXPECT_NE(trainers[5].process.Log().find(
                absl::StrCat(joined, m, ": state from rank 0, world size 6, rank 5\n")),
            std::string::npos)
      << trainers[5].process.Log();
  absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->world_size(), 6) << cluster.DaemonLogs();
  EXPECT_EQ(stats->generation(), 2u);
}

// The members dropped the joiner (one line each, naming it and `cause`),
// trained on as if it never came (every step over their 4 trainers, within
// 1e-12 of the reference) and are the job's world again.
void ExpectTheMembersDroppedTheJoinerAndTrainedOn(Cluster& cluster, std::vector<Trainer>& trainers,
                                                  const std::string& cause) {
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.insert(reference_args.end(),
                        {"--join-steps=8,8,8,8,0,0", "--join-divide-by-active"});
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> members;
  for (Trainer& t : trainers) {
    if (t.node != 2) members.push_back(&t);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(
      cluster, members, reference, [&] { return AllTrainerErrors(trainers); }));
  for (int n : {0, 1}) {
    const std::string log = cluster.node(n).process().Log();
    const size_t at = log.find("event=joiner_dropped ");
    ASSERT_NE(at, std::string::npos) << "node " << n << "\n" << cluster.DaemonLogs();
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find(" joiner=2 "), std::string::npos) << line;
    EXPECT_NE(line.find(cause), std::string::npos) << cause << "\n" << line;
    EXPECT_EQ(log.find("event=joiner_dropped ", at + 1), std::string::npos) << log;
    EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
  }
  absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->world_size(), 4) << cluster.DaemonLogs();
}

// The joiner's daemon (and its trainers) SIGKILLed once the grown
// generation formed, where `hook` holds it: the members find its port
// refusing, drop it and re-form among themselves at the same boundary, and
// train on. Prints the time from the kill to the members' switch to the
// re-formed world.
void KillTheJoinerAndExpectTheMembersTrainOn(const std::string& hook, const std::string& where) {
  ScratchDir scratch("joiner_killed");
  ClusterOptions options = MembersAndAJoiner();
  options.node_env.resize(3);
  options.node_env[2] = {{hook, scratch.File("never")}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  ASSERT_NO_FATAL_FAILURE(StartMembersAndAJoiner(cluster, &trainers));
  ASSERT_TRUE(
      WaitForLog(cluster.node(2).process(), "event=test_hook_armed hook=" + hook, kErrorBound))
      << cluster.DaemonLogs();
  const auto killed_at = std::chrono::steady_clock::now();
  cluster.node(2).process().Signal(SIGKILL);
  for (Trainer& t : trainers) {
    if (t.node == 2) t.process.Signal(SIGKILL);
  }
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_grown", kErrorBound))
      << cluster.DaemonLogs();
  const double train_on_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_NO_FATAL_FAILURE(
      ExpectTheMembersDroppedTheJoinerAndTrainedOn(cluster, trainers, "refuses connections"));
  std::printf("elastic_job joiner killed %s: SIGKILL to the members' re-formed world: %.2f s\n",
              where.c_str(), train_on_s);
}

// Killed just before it connects its Gloo mesh: the members wait for its
// Gloo address.
TEST(ElasticJob, AJoinerKilledBeforeItsMeshConnectsIsDroppedAndTheMembersTrainOn) {
  KillTheJoinerAndExpectTheMembersTrainOn("GRADSYNC_TEST_HOLD_JOINER_BEFORE_MESH_UNTIL",
                                          "before its mesh");
}

// Killed before it published its records: the members wait for them in
// the agreement.
TEST(ElasticJob, AJoinerKilledBeforeTheAgreementIsDroppedAndTheMembersTrainOn) {
  KillTheJoinerAndExpectTheMembersTrainOn("GRADSYNC_TEST_HOLD_JOINER_BEFORE_AGREEMENT_UNTIL",
                                          "before the agreement");
}

// The joiner runs another --check-replicas-every than the members: the
// grown generation's agreement refuses it. Its trainers get
// GS_ERR_MISMATCH naming it and the flag; the members drop it and train on.
TEST(ElasticJob, AJoinerRefusedForAMismatchedFlagGetsMismatchAndTheMembersTrainOn) {
  ClusterOptions options = MembersAndAJoiner();
  options.node_flags = {{}, {}, {"--check-replicas-every=3"}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  ASSERT_NO_FATAL_FAILURE(StartMembersAndAJoiner(cluster, &trainers));
  const std::string culprit = "but node 2 runs --check-replicas-every=3";
  for (Trainer& t : trainers) {
    if (t.node != 2) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitMismatch) << error << cluster.DaemonLogs();
    EXPECT_NE(error.find(culprit), std::string::npos) << error;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectTheMembersDroppedTheJoinerAndTrainedOn(cluster, trainers, culprit));
  EXPECT_NE(cluster.node(2).process().Log().find("event=joiner_departing "), std::string::npos)
      << cluster.node(2).process().Log();
}

// SetConfig on node 0 (the leader, or a node like the others on etcd)
// while the survivors re-form (generation 1 aborted, 2 not formed): the
// change is held and is generation 2's config version 1, so both survivors
// re-plan to it at the same iteration after the redone one, and training
// stays exact.
TEST(ElasticJob, ConfigSetWhileTheSurvivorsReformAppliesOnEverySurvivorAlike) {
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {kVictimNode}, /*resume=*/false);
  ResumeSurvivors(&trainers, {0, kVictimNode});  // node 1's: its collective fails
  // On etcd the node that records the abort first logs it, not always node 0.
  const std::string aborted = "event=generation_aborted generation=1";
  ASSERT_TRUE(WaitUntil(
      [&] {
        return cluster.node(0).process().Log().find(aborted) != std::string::npos ||
               (kOnEtcd && cluster.node(1).process().Log().find(aborted) != std::string::npos);
      },
      kErrorBound))
      << cluster.DaemonLogs();
  const absl::Status set = SetBucketCaps(cluster.port(), "elastic-token", "25", "1");
  ASSERT_TRUE(set.ok()) << set.message();
  EXPECT_NE(cluster.node(0).process().Log().find("event=job_config_held generation=2"),
            std::string::npos)
      << cluster.DaemonLogs();
  EXPECT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_reformed", kErrorBound))
      << cluster.DaemonLogs();
  ResumeSurvivors(&trainers, {1, kVictimNode});  // node 0's
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers);
  const std::string caps = "cap_mb=25.000 first_cap_mb=1.000";
  const std::string rebuilt0 = RebuildTo(cluster.node(0).process().Log(), caps);
  EXPECT_NE(rebuilt0, "none") << cluster.DaemonLogs();
  EXPECT_EQ(rebuilt0, RebuildTo(cluster.node(1).process().Log(), caps)) << cluster.DaemonLogs();
}

TEST(ElasticJob, BelowMinNodesTheSurvivorFailsNamingMinNodesAndTheDeadNodes) {
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  const auto killed_at = RunUntilKilled(cluster, Stage::kBackward, &trainers, {1, 2});
  for (Trainer& t : trainers) {
    if (t.node != 0) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const double failed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    const std::string error = TrainerError(t.process.Log());
    std::printf("elastic_job below_min_nodes: exit %d after %.1f s error=\"%s\"\n", st.code,
                failed_s, error.c_str());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitPeerFailed) << cluster.DaemonLogs();
    for (const char* needle : {"--min-nodes=2", "node_rank=1", "node_rank=2"}) {
      EXPECT_NE(error.find(needle), std::string::npos) << needle << " in " << error;
    }
  }
  EXPECT_TRUE(cluster.node(0).process().Running()) << cluster.DaemonLogs();
}

// Trainer `victim` (by default rank 3: node 1, local rank 1) pauses at
// `victim_pause`, the others at "backward"; once all stopped it is
// SIGKILLed (its daemon stays) and the others resume.
constexpr int kTrainerVictim = 3;

// Once local rank `local` of `node` has left, a replacement trainer
// (--catch-up) on that rank, held by its daemon until a boundary, before
// the others go on.
void StartReplacementOnceItsSlotIsFree(Cluster& cluster, int node, int local,
                                       std::vector<Trainer>* replacements) {
  ASSERT_TRUE(WaitForLog(cluster.node(node).process(),
                         absl::StrCat("event=leave job=1 local_rank=", local), kStateBound))
      << cluster.DaemonLogs();
  std::vector<std::string> args = TrainArgs();
  args.push_back("--catch-up");
  const std::string out = absl::StrCat(cluster.dir(), "/replacement");
  replacements->push_back({node, "", out, StartTrainer(cluster.node(node), local, args, out)});
  ASSERT_TRUE(
      WaitForLog(cluster.node(node).process(), "event=register_rejoining job=1", kStateBound))
      << replacements->back().process.Log() << cluster.DaemonLogs();
}

void RunUntilTrainerKilled(Cluster& cluster, const std::string& victim_pause,
                           std::vector<Trainer>* trainers,
                           const std::function<void()>& before_resuming = nullptr,
                           int victim = kTrainerVictim,
                           const std::vector<std::string>& extra_args = {}) {
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r) {
      const std::string pause = n * kLocal + r == victim ? victim_pause : "backward";
      const std::string out = absl::StrCat(cluster.dir(), "/w", n, "_", r);
      std::vector<std::string> args = TrainArgs();
      args.push_back("--pause-at=" + pause);
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      trainers->push_back({n, pause, out, StartTrainer(cluster.node(n), r, args, out)});
    }
  }
  for (Trainer& t : *trainers) {
    ASSERT_TRUE(WaitForLog(t.process, "mlp_trainer: paused at " + t.pause, kStateBound) &&
                WaitStopped(t.process, kStateBound))
        << t.process.Log() << cluster.DaemonLogs();
  }
  (*trainers)[victim].process.Signal(SIGKILL);
  if (before_resuming) before_resuming();
  for (size_t i = 0; i < trainers->size(); ++i) {
    if (static_cast<int>(i) != victim) (*trainers)[i].process.Signal(SIGCONT);
  }
}

// Rank 3 died after marking iteration 2's gradients: iteration 2 is
// averaged over all 6 (its gradient is complete in its segment), 3-7 over
// the other 5, whose weights then equal DDP's Join with divide-by-active.
// A replacement for it, started while the others are still stopped, with
// one tensor more than the job's layout is refused at its gs_register with
// MISMATCH naming it, and the job goes on untouched (a replacement with the
// job's layout rejoins: ARestartedTrainerRejoins... below).
TEST(ElasticJob, TrainerKilledAfterMarkingLeavesTheWorldFromTheNextIteration) {
  // The longer timeout: the others stay stopped mid-iteration meanwhile.
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilTrainerKilled(cluster, "marked", &trainers, [&] {
    // The same local rank (1) on node 1, once its daemon saw the death.
    ASSERT_TRUE(
        WaitForLog(cluster.node(1).process(), "event=leave job=1 local_rank=1", kStateBound))
        << cluster.DaemonLogs();
    std::vector<std::string> args = TrainArgs();
    args.push_back("--extra-tensor=extra");
    Process replacement = StartTrainer(cluster.node(1), kTrainerVictim % kLocal, args,
                                       absl::StrCat(cluster.dir(), "/replacement"));
    const ExitStatus st = replacement.Wait(kErrorBound);
    const std::string error = TrainerError(replacement.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << replacement.Log();
    EXPECT_EQ(st.code, kExitMismatch) << error;
    for (const char* needle : {"layout mismatch on node 1: rank 3 (local 1, pid ",
                               "registered a different layout than the running job's"}) {
      EXPECT_NE(error.find(needle), std::string::npos) << needle << " in " << error;
    }
  });
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", kSteps, ",", kSteps, ",", kSteps, ",",
                                        kKilledStep + 1, ",", kSteps, ",", kSteps));
  reference_args.push_back("--join-divide-by-active");
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<double> first;
  for (size_t i = 0; i < trainers.size(); ++i) {
    if (static_cast<int>(i) == kTrainerVictim) continue;
    Trainer& t = trainers[i];
    const ExitStatus st = t.process.Wait(kErrorBound);
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    ASSERT_EQ(st.code, 0) << "trainer " << i << ": " << TrainerError(t.process.Log()) << "\n"
                          << cluster.DaemonLogs();
    const std::vector<double> weights = LoadWeights(t.out);
    ASSERT_EQ(weights.size(), reference.size()) << t.out;
    if (first.empty()) first = weights;
    EXPECT_EQ(weights, first) << "trainer " << i << " ended with other weights";
    EXPECT_LT(RelativeDifference(weights, reference), 1e-12) << "trainer " << i;
  }
}

// Rank 3 died after marking iteration 2 and nobody replaces it: a
// gs_broadcast from rank 0 after iteration 4 runs among the other five (its
// node's broadcaster does not wait for the dead rank), every byte checked,
// and training stays within 1e-12 of the reference.
TEST(ElasticJob, BroadcastAfterATrainersDeathRunsWithoutIt) {
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilTrainerKilled(cluster, "marked", &trainers, nullptr, kTrainerVictim,
                        {"--broadcast-after=4:0"});
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", kSteps, ",", kSteps, ",", kSteps, ",",
                                        kKilledStep + 1, ",", kSteps, ",", kSteps));
  reference_args.push_back("--join-divide-by-active");
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> others;
  for (size_t i = 0; i < trainers.size(); ++i) {
    if (static_cast<int>(i) != kTrainerVictim) others.push_back(&trainers[i]);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(
      cluster, others, reference, [&] { return AllTrainerErrors(trainers); }));
  for (Trainer* t : others) {
    EXPECT_NE(t->process.Log().find("gs_broadcast from rank 0 after step 4: 5242883 bytes ok"),
              std::string::npos)
        << t->process.Log();
  }
}

// The same with rank 3, the dead trainer, as the root: its node refuses
// the call, failing the job with INVALID_ARGUMENT naming it. The culprit's
// error wins on every node: rank 2, its node's other trainer, gets it from
// its daemon; the other nodes' trainers from the rendezvous' report of it,
// which carries its code.
TEST(ElasticJob, BroadcastFromADeadTrainersRankFailsNamingIt) {
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilTrainerKilled(cluster, "marked", &trainers, nullptr, kTrainerVictim,
                        {"--broadcast-after=4:3"});
  for (size_t i = 0; i < trainers.size(); ++i) {
    if (static_cast<int>(i) == kTrainerVictim) continue;
    Trainer& t = trainers[i];
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitInvalidArgument) << "trainer " << i << ": " << error << "\n"
                                             << cluster.DaemonLogs();
    for (const char* needle : {"rank 3 (local 1, pid ", "died, so it has nothing to send"}) {
      EXPECT_NE(error.find(needle), std::string::npos) << needle << " in " << error;
    }
  }
}

// Trainer `victim` SIGKILLed after marking iteration 2 (its node stays,
// the job goes on over 5) and a replacement started on its node with the
// same local rank while the others are still stopped in iteration 2. Its
// predecessor counts in iteration 2, so iteration 3's agreement announces
// it and it is admitted at m = 4 with the dead trainer's rank: after
// iteration 3 every other trainer (--catch-up) sees trainers_joined grow
// and sends the state from the catch-up root (the lowest rank alive and a
// member before m: `root`), which the replacement receives. All six end
// with the same weights, within 1e-12 of one process that averages 0-2
// over all six shards, 3 over the other five and m on over all six again.
// Killed at `victim_pause` "backward" instead (after its first mark): it
// counts out of iteration 2 itself, whose redo announces the replacement,
// so m = 3 and the reference averages 2 over the other five.
void ExpectARestartedTrainerRejoins(int victim, int root,
                                    const std::string& victim_pause = "marked") {
  const bool mid_backward = victim_pause == "backward";
  const int victim_steps = mid_backward ? kKilledStep : kKilledStep + 1;
  const int node = victim / kLocal;
  const int local = victim % kLocal;
  // The longer timeout: the others stay stopped mid-iteration meanwhile.
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  std::vector<Trainer> replacements;
  RunUntilTrainerKilled(
      cluster, victim_pause, &trainers,
      [&] { StartReplacementOnceItsSlotIsFree(cluster, node, local, &replacements); }, victim,
      {"--catch-up"});
  ASSERT_EQ(replacements.size(), 1u);
  Trainer& replacement = replacements[0];
  const std::string joined = "mlp_trainer: joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog(replacement.process, joined, kErrorBound))
      << replacement.process.Log() << AllTrainerErrors(trainers) << cluster.DaemonLogs();
  const std::string log = replacement.process.Log();
  const int m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  EXPECT_EQ(m, victim_steps + 1) << log;
  EXPECT_NE(log.find(absl::StrCat(joined, m, ": state from rank ", root, ", world size 6, rank ",
                                  victim, "\n")),
            std::string::npos)
      << log;

  std::vector<std::string> steps;
  for (int r = 0; r < kNodes * kLocal; ++r) {
    steps.push_back(absl::StrCat(r == victim ? victim_steps : kSteps));
  }
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", absl::StrJoin(steps, ",")));
  reference_args.push_back("--join-divide-by-active");
  reference_args.push_back(absl::StrCat("--rejoin-at=", m));
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> everyone;
  for (size_t i = 0; i < trainers.size(); ++i) {
    if (static_cast<int>(i) != victim) everyone.push_back(&trainers[i]);
  }
  everyone.push_back(&replacement);
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(cluster, everyone, reference, [&] {
    return AllTrainerErrors(trainers) + AllTrainerErrors(replacements);
  }));
  const std::string sent = absl::StrCat("mlp_trainer: trainers joined after iteration ", m,
                                        ": state sent from rank ", root, "\n");
  for (size_t i = 0; i + 1 < everyone.size(); ++i) {
    EXPECT_NE(everyone[i]->process.Log().find(sent), std::string::npos)
        << everyone[i]->process.Log();
  }
  EXPECT_NE(cluster.node(node).process().Log().find(
                absl::StrCat("event=trainer_rejoined iteration=", m, " trainer=\"rank ", victim)),
            std::string::npos)
      << cluster.DaemonLogs();
  // Rejoined: the stats' world size is all six again (5 after the death).
  absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->world_size(), 6) << cluster.DaemonLogs();
  EXPECT_EQ(stats->active_trainers(), 6) << cluster.DaemonLogs();
  std::printf("elastic_job trainer rejoin: rank %d killed in iteration %d, rejoined at %d\n",
              victim, kKilledStep, m);
}

TEST(ElasticJob, ARestartedTrainerRejoinsItsNodeCatchesUpAndTrainsOverAllAgain) {
  ExpectARestartedTrainerRejoins(/*victim=*/kTrainerVictim, /*root=*/0);
}

// Rank 0's trainer is the one that died: the catch-up root is rank 1.
TEST(ElasticJob, ARestartedRankZeroRejoinsAndCatchesUpFromTheLowestLiveRank) {
  ExpectARestartedTrainerRejoins(/*victim=*/0, /*root=*/1);
}

TEST(ElasticJob, ATrainerKilledMidBackwardRestartedRejoinsItsNodeCatchesUpAndTrainsOverAllAgain) {
  ExpectARestartedTrainerRejoins(/*victim=*/kTrainerVictim, /*root=*/0, "backward");
}

// The catch-up root's node dies during the catch-up (on etcd, where node
// 0 may die): rank 3 is killed after marking iteration 2 and restarted, so
// after iteration 3 every trainer broadcasts the state from rank 0 (the
// catch-up root). Node 0 holds piece 0 of that broadcast (the test hook)
// and is SIGKILLed with its trainers while the others wait for the piece.
// Nodes 1 and 2 re-form and run the catch-up again from rank 2, the lowest
// live rank that was a member before the join (rank 3's replacement is
// not one): every survivor and the replacement get GS_OK with rank 2's
// state, which equals rank 0's, and all four end within 1e-12 of one
// process that averages 0-2 over all six shards, 3 over all but rank 3's
// and 4 on over ranks 2-5. `hold` "agreement": node 0 holds the
// broadcast's agreement instead, so the root's node dies before the
// broadcast began and the survivors find the root on no node there.
void ExpectTheCatchUpRunsAgainFromTheNextOldMember(const std::string& hold) {
  constexpr int kRejoinAt = kKilledStep + 2, kNewRoot = 2;
  ScratchDir scratch("catch_up_root_death");
  ClusterOptions options = JobOptions(/*min_nodes=*/2, 4 * kTimeoutS);
  options.node_env.resize(kNodes);
  options.node_env[0] = {{"GRADSYNC_TEST_HOLD_BROADCAST_PIECE", hold},
                         {"GRADSYNC_TEST_HOLD_BROADCAST_UNTIL", scratch.File("never")}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers, replacements;
  const int node = kTrainerVictim / kLocal, local = kTrainerVictim % kLocal;
  RunUntilTrainerKilled(
      cluster, "marked", &trainers,
      [&] { StartReplacementOnceItsSlotIsFree(cluster, node, local, &replacements); },
      kTrainerVictim, {"--catch-up"});
  ASSERT_EQ(replacements.size(), 1u);
  ASSERT_TRUE(
      WaitForLog(cluster.node(0).process(), "event=test_broadcast_held piece=" + hold, kErrorBound))
      << cluster.DaemonLogs();
  cluster.node(0).process().Signal(SIGKILL);
  for (int r = 0; r < kLocal; ++r) trainers[r].process.Signal(SIGKILL);
  const std::string joined = absl::StrCat("mlp_trainer: joined the running job at iteration ",
                                          kRejoinAt, ": state from rank ", kNewRoot, ",");
  ASSERT_TRUE(WaitForLog(replacements[0].process, joined, kErrorBound))
      << replacements[0].process.Log() << AllTrainerErrors(trainers) << cluster.DaemonLogs();

  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", kRejoinAt, ",", kRejoinAt, ",", kSteps,
                                        ",", kKilledStep + 1, ",", kSteps, ",", kSteps));
  reference_args.push_back("--join-divide-by-active");
  reference_args.push_back(absl::StrCat("--rejoin-at=", kRejoinAt));
  reference_args.push_back(absl::StrCat("--rejoin-ranks=", kTrainerVictim));
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> everyone = {&trainers[2], &trainers[4], &trainers[5], &replacements[0]};
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(cluster, everyone, reference, [&] {
    return AllTrainerErrors(trainers) + AllTrainerErrors(replacements);
  }));
  const std::string sent = absl::StrCat("mlp_trainer: trainers joined after iteration ", kRejoinAt,
                                        ": state sent from rank ", kNewRoot, "\n");
  for (int i : {2, 4, 5}) {
    EXPECT_NE(trainers[i].process.Log().find(sent), std::string::npos) << trainers[i].process.Log();
  }
  for (int n : {1, 2}) {
    EXPECT_NE(cluster.node(n).process().Log().find(
                  absl::StrCat("event=catch_up_root_replaced old=0 new=", kNewRoot)),
              std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
  }
}

TEST(ElasticJob, TheCatchUpRootsNodeKilledDuringTheCatchUpRunsItAgainFromTheNextOldMember) {
  if (!kOnEtcd) GTEST_SKIP() << "the root, rank 0, is on node 0, whose death ends a leader's job";
  SKIP_WITHOUT_ETCD();
  ExpectTheCatchUpRunsAgainFromTheNextOldMember("0");
}

TEST(ElasticJob, TheCatchUpRootsNodeKilledBeforeTheCatchUpBeganRunsItFromTheNextOldMember) {
  if (!kOnEtcd) GTEST_SKIP() << "the root, rank 0, is on node 0, whose death ends a leader's job";
  SKIP_WITHOUT_ETCD();
  ExpectTheCatchUpRunsAgainFromTheNextOldMember("agreement");
}

// Rank 3 died after its first mark of iteration 2, once the first bucket
// (its gate) was averaged over all 6 and written back: its node stays in.
// Node 1 sums rank 2's input again from the copy its sum pass kept, every
// node redoes iteration 2 over the other 5 (the others from their kept
// sums), and all 5 finish with GS_OK and the same weights, within 1e-12 of
// one process that averages 0-1 over 6 and 2-7 over the other 5. No node
// departs; the stats count 5 active trainers.
TEST(ElasticJob, TrainerKilledMidBackwardLeavesItsNodeInAndEveryNodeRedoesTheIterationWithoutIt) {
  constexpr int kVictimsNode = kTrainerVictim / kLocal;
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilTrainerKilled(cluster, "backward", &trainers);
  std::vector<std::string> steps;
  for (int r = 0; r < kNodes * kLocal; ++r) {
    steps.push_back(absl::StrCat(r == kTrainerVictim ? kKilledStep : kSteps));
  }
  std::vector<std::string> reference_args = TrainArgs();
  reference_args.push_back(absl::StrCat("--join-steps=", absl::StrJoin(steps, ",")));
  reference_args.push_back("--join-divide-by-active");
  const std::vector<double> reference = SingleProcessReference(cluster.dir(), reference_args);
  ASSERT_FALSE(reference.empty());
  std::vector<Trainer*> others;
  for (size_t i = 0; i < trainers.size(); ++i) {
    if (static_cast<int>(i) != kTrainerVictim) others.push_back(&trainers[i]);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectEndedAlikeAndLikeTheReference(
      cluster, others, reference, [&] { return AllTrainerErrors(trainers); }));
  EXPECT_NE(cluster.node(kVictimsNode)
                .process()
                .Log()
                .find(absl::StrCat("event=trainer_lost_mid_iteration iteration=", kKilledStep,
                                   " trainer=\"rank 3 (local 1")),
            std::string::npos)
      << cluster.DaemonLogs();
  for (int n = 0; n < kNodes; ++n) {
    const std::string log = cluster.node(n).process().Log();
    EXPECT_NE(log.find(absl::StrCat("event=iteration_redo_for_lost_trainer iteration=", kKilledStep,
                                    " nodes_that_lost_one=1")),
              std::string::npos)
        << "node " << n << "\n"
        << cluster.DaemonLogs();
    EXPECT_EQ(log.find("event=node_departed"), std::string::npos) << "node " << n << "\n" << log;
  }
  // The world size the stats report is what the iterations since averaged
  // over (as gs_get_job_info tells the trainers), busbw's n with it.
  absl::StatusOr<v1::Stats> stats = GetStats(cluster.port(), "elastic-token");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->active_trainers(), 5) << cluster.DaemonLogs();
  EXPECT_EQ(stats->world_size(), 5) << cluster.DaemonLogs();
}

// A node that would end the job at a death while the others re-form is
// refused when the job forms, on every node alike.
TEST(ElasticJob, NodesGivenDifferentMinNodesAreRefusedWhenTheJobForms) {
  ClusterOptions options = JobOptions(/*min_nodes=*/2);
  options.node_flags = {{}, {"--min-nodes=3"}, {}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(TrainArgs(), &outs);
  for (Process& p : trainers) {
    const ExitStatus st = p.Wait(kErrorBound);
    const std::string error = TrainerError(p.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << p.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitMismatch) << error << cluster.DaemonLogs();
    EXPECT_NE(error.find("node 0 runs --min-nodes=2 but node 1 runs --min-nodes=3"),
              std::string::npos)
        << error;
  }
}

// The embedded rendezvous lives in node 0's daemon: its loss ends an
// elastic job too, with the error that says so.
TEST(ElasticJob, LeaderKilledEndsTheJobNamingTheDeadLeader) {
  if (kOnEtcd) GTEST_SKIP() << "on etcd no node leads: NodeZeroKilledOnEtcdSurvivorsTrainOn";
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {0});
  for (Trainer& t : trainers) {
    if (t.node == 0) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitPeerFailed) << cluster.DaemonLogs();
    // Proven by its refused port, not by an RPC's deadline: dead, not
    // "dead or cut off".
    EXPECT_NE(error.find("the leader is dead (its daemon at 127.0.0.1:"), std::string::npos)
        << error;
    EXPECT_NE(error.find(" refuses connections)"), std::string::npos) << error;
    EXPECT_EQ(error.find("cut off"), std::string::npos) << error;
  }
}

// Node 0 SIGKILLed while every survivor's trainers are held stopped, so
// no collective notices: each survivor's daemon sees its connection to the
// leader close, probes the leader's port and fails the job naming the dead
// leader, proven by the refusal; not by a heartbeat that waited out its RPC
// deadline ("Deadline Exceeded"), which no error or log may mention.
TEST(ElasticJob, LeaderKilledWhileNoCollectiveRunsFailsTheSurvivorsAtOnceNamingTheDeadLeader) {
  if (kOnEtcd) GTEST_SKIP() << "on etcd no node leads: NodeZeroKilledOnEtcdSurvivorsTrainOn";
  // Holding the trainers is no stall: the job's timeout is far away.
  Cluster cluster(JobOptions(/*min_nodes=*/2, 4 * kTimeoutS));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilPaused(cluster, Stage::kBackward, &trainers, {0});
  // No collective in flight: each survivor waits for its paused trainers
  // (its stall report), bucket 0 of the iteration done everywhere.
  for (int n = 1; n < kNodes; ++n) {
    const std::string stall = absl::StrCat("event=stall iteration=", kKilledStep, " bucket=1 ");
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(), stall, kStateBound)) << cluster.DaemonLogs();
  }
  const auto killed_at = std::chrono::steady_clock::now();
  cluster.node(0).process().Signal(SIGKILL);
  for (Trainer& t : trainers) {
    if (t.node == 0) t.process.Signal(SIGKILL);
  }
  for (int n = 1; n < kNodes; ++n) {
    const Process& daemon = cluster.node(n).process();
    ASSERT_TRUE(WaitForLog(daemon, "event=job_failed job=1 code=PEER_FAILED", kErrorBound))
        << cluster.DaemonLogs();
    // Printed, not asserted (a loaded machine): the heartbeat's deadline is 3 s.
    std::printf(
        "elastic_job leader killed, no collective running: node %d failed its job %.2f s "
        "after the SIGKILL\n",
        n, std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
    const std::string log = daemon.Log();
    EXPECT_NE(log.find("event=leader_refuses_connections generation=1 address="), std::string::npos)
        << log;
    const size_t at = log.find("event=job_failed");
    const std::string failed = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(failed.find("the leader is dead (its daemon at 127.0.0.1:"), std::string::npos)
        << failed;
    EXPECT_NE(failed.find(" refuses connections)"), std::string::npos) << failed;
    EXPECT_EQ(failed.find("cut off"), std::string::npos) << failed;
    // Up to the failure (later, the Leave to the dead leader times out).
    EXPECT_EQ(log.substr(0, at + failed.size()).find("Deadline Exceeded"), std::string::npos)
        << log;
  }
  ResumeSurvivors(&trainers, {0});
  for (Trainer& t : trainers) {
    if (t.node == 0) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitPeerFailed) << error << cluster.DaemonLogs();
    EXPECT_NE(error.find(absl::StrCat("the leader daemon at 127.0.0.1:", cluster.port(),
                                      " is unreachable: the leader is dead (its daemon at ")),
              std::string::npos)
        << error;
    EXPECT_NE(error.find(" refuses connections)"), std::string::npos) << error;
    EXPECT_EQ(error.find("cut off"), std::string::npos) << error;
    // Said once: the re-formation does not explain the watch's error again.
    const size_t first = error.find(" is unreachable");
    ASSERT_NE(first, std::string::npos) << error;
    EXPECT_EQ(error.find(" is unreachable", first + 1), std::string::npos) << error;
  }
}

// On etcd no node is special: node 0 SIGKILLed mid-backward, nodes 1 and
// 2 re-form and redo the iteration, and train like the reference.
TEST(ElasticJob, NodeZeroKilledOnEtcdSurvivorsTrainOn) {
  if (!kOnEtcd) GTEST_SKIP() << "the embedded leader's death ends the job (LeaderKilled...)";
  SKIP_WITHOUT_ETCD();
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  const auto killed_at = RunUntilKilled(cluster, Stage::kBackward, &trainers, {0});
  ASSERT_TRUE(WaitForLog(cluster.node(1).process(), "event=job_reformed", kErrorBound))
      << cluster.DaemonLogs();
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers, /*victim=*/0);
  if (::testing::Test::HasFatalFailure()) return;
  std::printf("elastic_job node 0 killed on etcd: SIGKILL to the survivors' completion: %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
  for (int n : {1, 2}) EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
}

// The embedded rendezvous lives in node 0's daemon: stopping it ends the
// job (it does not leave it), named by the leader's abort or its absence.
// On etcd node 0 leaves like any node and the others train on.
TEST(ElasticJob, NodeZeroStoppedWithSigtermEndsTheJobOnTheLeaderAndLeavesItOnEtcd) {
  Cluster cluster(JobOptions(/*min_nodes=*/2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  StopNodeWithSigterm(cluster, &trainers, 0);
  if (kOnEtcd) {
    ExpectSurvivorsTrainedLikeTheReference(cluster, trainers, /*victim=*/0);
    return;
  }
  for (Trainer& t : trainers) {
    if (t.node == 0) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitPeerFailed) << error << cluster.DaemonLogs();
    // Whichever the survivor heard first: the leader's abort naming node 0's
    // shutdown, or the leader gone.
    EXPECT_TRUE(error.find("node_rank=0 (host=127.0.0.1) reported UNAVAILABLE: gradsyncd is "
                           "shutting down (SIGTERM)") != std::string::npos ||
                error.find("the leader is dead") != std::string::npos)
        << error << cluster.DaemonLogs();
  }
}

#ifdef GRADSYNC_ELASTIC_ON_ETCD
// A 3-member etcd cluster loses the member every daemon talks to first
// while node 2's death makes the survivors re-form: they re-form through
// the other two members and train like the reference.
TEST(ElasticJob, EtcdMemberKilledWhileTheSurvivorsReformTheyTrainOn) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  ClusterOptions options = JobOptions(/*min_nodes=*/2);
  options.rendezvous = absl::StrCat("etcd://", etcd.endpoints()[0], ",", etcd.endpoints()[1], ",",
                                    etcd.endpoints()[2], "/three");
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {kVictimNode}, /*resume=*/false);
  etcd.Kill(0);
  ResumeSurvivors(&trainers, {kVictimNode});
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_reformed", kErrorBound))
      << cluster.DaemonLogs() << etcd.Logs();
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers);
}

// The worst an etcd member's death can do to a re-formation, made certain
// instead of left to load: member 0, the one every daemon tries first, is
// SIGSTOPped (it answers nothing, so each attempt on it waits out its
// deadline) when node 2 is SIGKILLed; once both survivors joined the new
// generation (a test hook holds them there), member 1 stops too, and etcd
// has no quorum for 3.5 s (longer than a call's whole budget was) while
// the survivors' next calls wait for it. A call retries across the members
// for as long as the lease lives (10 s): the survivors re-form through
// members 1 and 2, log the failover, and train like the reference.
TEST(ElasticJob, EtcdQuorumLostWhileTheSurvivorsReformTheyRetryAndTrainOn) {
  SKIP_WITHOUT_ETCD();
  ScratchDir scratch("etcd_quorum");
  const std::string release = scratch.File("release");
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  // --timeout-s 20: the lease TTL, and each etcd call's budget, is 10 s.
  ClusterOptions options = JobOptions(/*min_nodes=*/2, 4 * kTimeoutS);
  options.rendezvous = absl::StrCat("etcd://", absl::StrJoin(etcd.endpoints(), ","), "/quorum");
  options.node_env.assign(kNodes, {{"GRADSYNC_TEST_HOLD_REFORM_AFTER_JOIN_UNTIL", release}});
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  RunUntilKilled(cluster, Stage::kBackward, &trainers, {kVictimNode}, /*resume=*/false);
  etcd.Stop(0);
  ResumeSurvivors(&trainers, {kVictimNode});
  for (int n : {0, 1}) {
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(),
                           "event=test_hook_armed hook=GRADSYNC_TEST_HOLD_REFORM_AFTER_JOIN_UNTIL",
                           kErrorBound))
        << "node " << n << cluster.DaemonLogs() << etcd.Logs();
  }
  etcd.Stop(1);
  std::FILE* go = std::fopen(release.c_str(), "w");
  ASSERT_NE(go, nullptr) << release;
  std::fclose(go);
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  etcd.Continue(1);
  const auto back_at = std::chrono::steady_clock::now();
  for (int n : {0, 1}) {
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(), "event=job_reformed", kErrorBound))
        << "node " << n << cluster.DaemonLogs() << etcd.Logs();
  }
  std::printf("elastic_job etcd quorum back to both survivors re-formed: %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - back_at).count());
  ExpectSurvivorsTrainedLikeTheReference(cluster, trainers);
  for (int n : {0, 1}) {
    EXPECT_NE(cluster.node(n).process().Log().find(
                  absl::StrCat("event=etcd_failover from=\"", etcd.endpoints()[0], "\"")),
              std::string::npos)
        << "node " << n << ": " << cluster.node(n).process().Log();
  }
}
#endif

void KillNodeTwoAndExpectPeerFailed(Stage stage) {
  Cluster cluster(JobOptions(/*min_nodes=*/kNodes));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  const auto killed_at = RunUntilKilled(cluster, stage, &trainers);
  double slowest_s = 0;
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    slowest_s = std::max(
        slowest_s,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
    const std::string log = t.process.Log();
    const std::string error = TrainerError(log);
    std::printf("elastic_fixed_job trainer on node %d: exit %d error=\"%s\"\n", t.node, st.code,
                error.c_str());
    EXPECT_FALSE(st.timed_out) << log << cluster.DaemonLogs();
    ASSERT_TRUE(st.exited) << st.ToString();
    EXPECT_EQ(st.code, kExitPeerFailed) << log << cluster.DaemonLogs();
    EXPECT_NE(error.find("node_rank=2"), std::string::npos)
        << "node " << t.node << ": " << error << "\n"
        << cluster.DaemonLogs();
    EXPECT_NE(error.find("--min-nodes 3"), std::string::npos)
        << "node " << t.node << ": " << error << "\n"
        << cluster.DaemonLogs();
  }
  for (int n = 0; n < kNodes; ++n) {
    if (n == kVictimNode) continue;
    EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
  }
  std::printf("elastic_fixed_job %s: SIGKILL of node 2 to the last survivor's PEER_FAILED %.1f s\n",
              StageName(stage), slowest_s);
}

TEST(FixedJob, NodeKilledMidBackwardFailsSurvivorsNamingItAndMinNodes) {
  KillNodeTwoAndExpectPeerFailed(Stage::kBackward);
}

TEST(FixedJob, NodeKilledMidCollectiveFailsSurvivorsNamingItAndMinNodes) {
  KillNodeTwoAndExpectPeerFailed(Stage::kVictimInCollective);
}

// A fixed job cannot go on without a node: a SIGTERM'd daemon reports its
// shutdown as an error, which ends the job on every node, named.
TEST(FixedJob, NodeStoppedWithSigtermFailsSurvivorsNamingItsShutdown) {
  Cluster cluster(JobOptions(/*min_nodes=*/kNodes));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Trainer> trainers;
  StopNodeWithSigterm(cluster, &trainers, kVictimNode);
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const std::string error = TrainerError(t.process.Log());
    ASSERT_TRUE(st.exited) << st.ToString() << t.process.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitPeerFailed) << error << cluster.DaemonLogs();
    EXPECT_NE(error.find("node_rank=2 (host=127.0.0.1) reported UNAVAILABLE: gradsyncd is "
                         "shutting down (SIGTERM)"),
              std::string::npos)
        << "node " << t.node << ": " << error << cluster.DaemonLogs();
  }
  for (int n = 0; n < kNodes; ++n) {
    if (n != kVictimNode) {
      EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
    }
  }
}

}  // namespace
}  // namespace gradsync::testing
