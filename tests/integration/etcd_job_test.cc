// Jobs whose rendezvous lives in etcd (--rendezvous etcd://...): real
// gradsyncd daemons and trainers, a real etcd member on a loopback port.
// Two nodes of two trainers train exactly like one process on the whole
// batch; node 0 killed fails the job naming it, and the job forms again
// with node 0 restarted; `config set` on node 1 re-plans both nodes alike; etcd's client
// certificates reach a TLS etcd (and a stranger's do not); etcd killed, or
// a 3-member etcd losing its quorum to two SIGSTOPped members, for longer
// than the timeout fails every trainer with an error naming etcd, never a
// hang; a daemon stopped while etcd answers nothing exits after its short
// shutdown budget rather than a lease TTL per etcd call.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/integration/test_pki.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);

#define SKIP_WITHOUT_ETCD()                         \
  do {                                              \
    const std::string reason = EtcdMissingReason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;    \
  } while (0)

ClusterOptions OnEtcd(const EtcdCluster& etcd, int nodes, int local,
                      std::vector<std::string> extra = {}) {
  ClusterOptions options;
  options.nodes = nodes;
  options.local_size = local;
  options.job_id = "etcdjob";
  options.token = "etcd-s3cret";
  options.rendezvous = absl::StrCat("etcd://", etcd.endpoints()[0], "/gradsync-test");
  options.flags = {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001"};
  options.flags.insert(options.flags.end(), extra.begin(), extra.end());
  return options;
}

// The error a failed trainer printed (mlp_trainer's `error="..."`).
std::string TrainerError(const std::string& log) {
  const size_t at = log.find("error=\"");
  if (at == std::string::npos) return "(no error line)";
  const size_t start = at + 7;
  return log.substr(start, log.find("\"\n", start) - start);
}

TEST(EtcdJob, TwoNodesOfTwoTrainersMatchSingleProcessTraining) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  Cluster cluster(OnEtcd(etcd, 2, 2, {"--timeout-s=15"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::vector<double>> weights = ExpectTrainsLikeOneProcess(
      cluster, {"--steps=20", "--batch=60", "--fp64", "--gate-every=3"}, kBound);
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(weights[i], weights[0]) << "trainer " << i << " differs from node 0's trainer 0";
  }
  // Every node met the others in etcd; none served a rendezvous.
  for (int n = 0; n < 2; ++n) {
    const std::string log = cluster.node(n).process().Log();
    EXPECT_NE(log.find("event=etcd_session"), std::string::npos) << log;
    EXPECT_NE(log.find("event=joined generation=1"), std::string::npos) << log;
  }
}

// A fixed job on etcd loses node 0's daemon (SIGKILL) mid-training: every
// trainer fails naming it (node 0 is not special: no "dead leader"); node
// 0 restarted, new trainers form generation 2 and train like one process.
TEST(EtcdJob, KilledNodeZeroFailsEveryTrainerNamingItThenTheJobReforms) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  Cluster cluster(OnEtcd(etcd, 3, 1, {"--timeout-s=5"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> first_outs;
  std::vector<Process> trainers =
      cluster.StartTrainers({"--steps=2000", "--sleep-ms=20", "--batch=60"}, &first_outs, "first");
  // Node 0 decided its next plan: iterations are in flight.
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=plan_decided", kBound))
      << cluster.DaemonLogs();
  cluster.node(0).process().Signal(SIGKILL);
  cluster.node(0).process().Wait(kBound);
  for (int n = 0; n < 3; ++n) {
    ExitStatus st = trainers[n].Wait(kBound);
    ASSERT_TRUE(st.exited) << "trainer on node " << n << " hung\n" << cluster.DaemonLogs();
    EXPECT_NE(st.code, 0) << trainers[n].Log();
    if (n == 0) continue;  // it lost its own daemon
    const std::string error = TrainerError(trainers[n].Log());
    EXPECT_NE(error.find("node_rank=0 (host=127.0.0.1) is dead"), std::string::npos)
        << "trainer on node " << n << ": " << error << "\n"
        << cluster.DaemonLogs();
    EXPECT_EQ(error.find("leader is dead"), std::string::npos) << error;
  }
  ASSERT_TRUE(cluster.StartNode(0)) << cluster.DaemonLogs();
  ExpectTrainsLikeOneProcess(cluster, {"--steps=10", "--batch=60", "--fp64"}, kBound, "again");
  EXPECT_NE(cluster.node(1).process().Log().find("event=joined generation=2"), std::string::npos)
      << cluster.DaemonLogs();
}

// No node leads on etcd: `config set` on node 1 appends to the job-wide
// log in etcd, and both nodes re-plan to the new caps at the same
// iteration; training stays exact.
TEST(EtcdJob, ConfigSetOnAnyNodeAppliesOnEveryNodeAtTheSameIteration) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  Cluster cluster(OnEtcd(etcd, 2, 2, {"--timeout-s=15"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::string> args = {"--steps=400", "--fp64", "--batch=60", "--sleep-ms=10"};
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  ASSERT_TRUE(WaitForLog(cluster.node(1).process(), "event=job_running", kBound))
      << cluster.DaemonLogs();
  const absl::Status set =
      SetBucketCaps(cluster.node(1).ListenPort(seconds(10)), "etcd-s3cret", "25", "1");
  ASSERT_TRUE(set.ok()) << set.message() << cluster.DaemonLogs();
  for (Process& t : trainers) {
    ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  const std::string caps = "cap_mb=25.000 first_cap_mb=1.000";
  const std::string rebuilt0 = RebuildTo(cluster.node(0).process().Log(), caps);
  EXPECT_NE(rebuilt0, "none") << cluster.DaemonLogs();
  EXPECT_EQ(rebuilt0, RebuildTo(cluster.node(1).process().Log(), caps)) << cluster.DaemonLogs();
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
  }
}

// etcd serving TLS and requiring client certificates: the daemons reach it
// with --etcd-cert/--etcd-key/--etcd-ca and train; a daemon with a
// certificate etcd's CA did not sign cannot join, and its trainer's error
// names etcd.
TEST(EtcdJob, DaemonsReachAnEtcdThatRequiresClientCertificates) {
  SKIP_WITHOUT_ETCD();
  TestPki pki;
  ASSERT_TRUE(pki.Generate().ok());
  EtcdCluster etcd(1, {pki.File("node.pem"), pki.File("node.key"), pki.File("ca.pem")});
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  const std::vector<std::string> tls = {"--etcd-cert=" + pki.File("operator.pem"),
                                        "--etcd-key=" + pki.File("operator.key"),
                                        "--etcd-ca=" + pki.File("ca.pem"), "--timeout-s=5"};
  {
    Cluster cluster(OnEtcd(etcd, 2, 1, tls));
    ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
    ExpectTrainsLikeOneProcess(cluster, {"--steps=5", "--batch=60", "--fp64"}, kBound);
  }
  ClusterOptions stranger =
      OnEtcd(etcd, 2, 1,
             {"--etcd-cert=" + pki.File("stranger.pem"), "--etcd-key=" + pki.File("stranger.key"),
              "--etcd-ca=" + pki.File("ca.pem"), "--timeout-s=3"});
  stranger.job_id = "stranger-job";
  Cluster cluster(stranger);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers({"--steps=5", "--batch=60"}, &outs);
  for (Process& t : trainers) {
    ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited) << t.Log() << cluster.DaemonLogs();
    EXPECT_NE(st.code, 0) << t.Log();
    const std::string error = TrainerError(t.Log());
    EXPECT_NE(error.find(absl::StrCat("etcd at ", etcd.endpoints()[0])), std::string::npos)
        << error << "\n"
        << cluster.DaemonLogs();
  }
}

// Training is under way on `etcd` when `take_away` makes it unreachable
// for good: every trainer fails naming etcd (once) as unreachable, none
// hangs. `what` names the case in the printed line.
void ExpectEtcdLossFailsEveryTrainer(const EtcdCluster& etcd, ClusterOptions options,
                                     const std::function<void()>& take_away, const char* what) {
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(
      {"--steps=100000", "--batch=60", "--sleep-ms=20", "--print-loss"}, &outs);
  // Training is under way (rank 0 prints each completed step) when etcd goes.
  ASSERT_TRUE(WaitForLog(trainers[0], "step   3  loss", kBound))
      << trainers[0].Log() << cluster.DaemonLogs();
  take_away();
  const auto lost_at = std::chrono::steady_clock::now();
  for (Process& t : trainers) {
    ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited) << "a trainer still runs " << kBound.count() << " s after etcd went:\n"
                           << t.Log() << cluster.DaemonLogs();
    EXPECT_NE(st.code, 0) << t.Log();
    const std::string error = TrainerError(t.Log());
    EXPECT_NE(error.find(absl::StrCat("etcd at ", etcd.endpoints()[0])), std::string::npos)
        << error << "\n"
        << cluster.DaemonLogs();
    EXPECT_NE(error.find("unreachable"), std::string::npos) << error;
    // Named once, not by every layer that passed the error on.
    const size_t named = error.find("etcd at ");
    EXPECT_EQ(error.find("etcd at ", named + 1), std::string::npos) << error;
    std::printf("etcd_job %s: trainer exit %d after %.1f s error=\"%s\"\n", what, st.code,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - lost_at).count(),
                error.c_str());
  }
}

TEST(EtcdJob, EtcdUnreachableLongerThanTheTimeoutFailsEveryTrainerNamingEtcd) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  ExpectEtcdLossFailsEveryTrainer(
      etcd, OnEtcd(etcd, 2, 1, {"--timeout-s=3"}), [&] { etcd.Kill(0); }, "etcd killed");
}

// Two of three members SIGSTOPped: etcd has no quorum, and the stopped
// members answer nothing (every attempt on them waits out its deadline).
// Retrying across members ends with the lease TTL: every trainer fails
// naming etcd, none hangs.
TEST(EtcdJob, EtcdQuorumLostLongerThanTheTimeoutFailsEveryTrainerNamingEtcd) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(3);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  ClusterOptions options = OnEtcd(etcd, 2, 1, {"--timeout-s=3"});
  options.rendezvous =
      absl::StrCat("etcd://", absl::StrJoin(etcd.endpoints(), ","), "/gradsync-test");
  ExpectEtcdLossFailsEveryTrainer(
      etcd, options,
      [&] {
        etcd.Stop(0);
        etcd.Stop(1);
      },
      "etcd quorum lost");
}

// etcd stopped (it answers nothing) under a running elastic job, node 1's
// daemon gets SIGTERM: its Depart's writes share the daemon's 2 s shutdown
// budget, so it exits cleanly and logs that it left them to its lease's
// expiry. Each etcd call may retry for a lease TTL (10 s here): before the
// budget, the Depart alone held the stop up longer than this test waits.
TEST(EtcdJob, ADaemonStoppedWhileEtcdAnswersNothingExitsAfterItsShutdownBudget) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  Cluster cluster(OnEtcd(etcd, 2, 1, {"--timeout-s=10", "--min-nodes=1"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(
      {"--steps=100000", "--batch=60", "--sleep-ms=20", "--print-loss"}, &outs);
  ASSERT_TRUE(WaitForLog(trainers[0], "step   3  loss", kBound))
      << trainers[0].Log() << cluster.DaemonLogs();
  etcd.Stop(0);
  const auto stopped_at = std::chrono::steady_clock::now();
  cluster.node(1).process().Signal(SIGTERM);
  ExitStatus st = cluster.node(1).process().Wait(seconds(8));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  etcd.Continue(0);
  ASSERT_TRUE(st.exited && !st.timed_out)
      << "node 1's daemon still ran 8 s after SIGTERM: " << st.ToString() << "\n"
      << cluster.DaemonLogs();
  EXPECT_EQ(st.code, 0) << cluster.node(1).process().Log();
  const std::string log = cluster.node(1).process().Log();
  EXPECT_NE(log.find("event=etcd_leave_skipped budget_ms=2000"), std::string::npos) << log;
  EXPECT_NE(log.find(absl::StrCat("etcd=\"etcd at ", etcd.endpoints()[0])), std::string::npos)
      << log;
  std::printf("etcd_job stopped with etcd stopped: daemon exit %d after %.1f s\n", st.code, took);
}

}  // namespace
}  // namespace gradsync::testing
