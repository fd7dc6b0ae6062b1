// Several gradsyncd daemons (one per "node", on loopback) acting as one
// job, with real trainer processes: equivalence with single-process
// training, layout mismatches between nodes, a daemon killed mid-iteration
// and the job re-formed (warm restart), and refused joins.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/call_token.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kBound = seconds(40);

// A job of `nodes` daemons with `local` trainers each; node 0 leads and
// listens on `leader_host` only. `node_extra[n]`: flags for node n only.
ClusterOptions Job(int nodes, int local, std::vector<std::string> extra = {},
                   std::string token = "s3cret", std::string leader_host = "127.0.0.1",
                   std::vector<std::vector<std::string>> node_extra = {}) {
  ClusterOptions options;
  options.nodes = nodes;
  options.local_size = local;
  options.job_id = "mnjob";
  options.token = std::move(token);
  options.leader_host = std::move(leader_host);
  options.flags = {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001", "--timeout-s=15"};
  options.flags.insert(options.flags.end(), extra.begin(), extra.end());
  options.node_flags = std::move(node_extra);
  return options;
}

// Every node of `cluster` logged the plan's cut `pieces` ("buckets=1 pieces=4 ...").
void ExpectPlanPieces(Cluster& cluster, int nodes, const std::string& pieces) {
  for (int n = 0; n < nodes; ++n) {
    EXPECT_NE(cluster.node(n).process().Log().find(absl::StrCat("event=plan_pieces ", pieces)),
              std::string::npos)
        << "node " << n << ":\n"
        << cluster.node(n).process().Log();
  }
}

TEST(MultiNode, ThreeDaemonsTwoTrainersEachMatchSingleProcessTraining) {
  Cluster cluster(Job(3, 2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::string> common = {"--steps=20", "--batch=60", "--fp64", "--gate-every=3"};
  std::vector<Process> trainers;
  std::vector<std::string> outs;
  for (int n = 0; n < 3; ++n) {
    for (int r = 0; r < 2; ++r) {
      outs.push_back(absl::StrCat(cluster.dir(), "/w", n, ".", r, ".txt"));
      std::vector<std::string> args = common;
      // Every trainer marks its gradients ready in its own random order.
      args.push_back(absl::StrCat("--shuffle-seed=", 100 + 10 * n + r));
      trainers.push_back(StartTrainer(cluster.node(n), r, args, outs.back()));
    }
  }
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), common);
  const std::vector<double> first = LoadWeights(outs[0]);
  for (const std::string& out : outs) {
    const std::vector<double> got = LoadWeights(out);
    EXPECT_LE(RelativeDifference(got, expected), 1e-12) << out;
    EXPECT_EQ(got, first) << out << " differs from node 0's trainer 0";
  }
  // Node 0 decided the rebuilt plan for everyone: each node logged it.
  const std::string logs = cluster.DaemonLogs();
  size_t rebuilt = 0;
  for (size_t p = logs.find("event=plan_rebuilt"); p != std::string::npos;
       p = logs.find("event=plan_rebuilt", p + 1)) {
    ++rebuilt;
  }
  EXPECT_EQ(rebuilt, 3u) << logs;
}

// A bucket larger than a piece (kPieceBytes, 8 MiB) crosses nodes in
// pieces whose collectives are pipelined with the local sum and the
// write-back: training still equals single-process training, and every node
// cut the bucket the same way (16 MiB of fp64 weights plus biases: a first
// and a last piece of 2 MiB around 2 near-equal pieces).
TEST(MultiNode, ABucketOfSeveralPiecesTrainsLikeOneProcess) {
  Cluster cluster(Job(2, 2, {"--bucket-cap-mb=32", "--first-bucket-cap-mb=32"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::vector<double>> weights = ExpectTrainsLikeOneProcess(
      cluster, {"--steps=6", "--batch=60", "--fp64", "--dim=1024", "--hidden=2048"}, kBound);
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(weights[i], weights[0]) << "trainer " << i << " differs from node 0's trainer 0";
  }
  ExpectPlanPieces(cluster, 2, "buckets=1 pieces=4 piece_mb=8");
  for (int n = 0; n < 2; ++n) {
    // The Gloo worker reduced in the trainers' arenas and wrote the average.
    EXPECT_NE(cluster.node(n).process().Log().find(
                  absl::StrCat("event=gloo_worker_arenas_mapped node_rank=", n, " arenas=2")),
              std::string::npos)
        << "node " << n << ":\n"
        << cluster.node(n).process().Log();
  }
}

// The Gloo worker sums a bucket where the trainers' gradients are (trainer
// 0's arena, after the daemon's local sum) and writes the average into
// every trainer's arena itself. 2 daemons x `local` trainers, fp64, one
// bucket of `model`'s first layer (`cap_mb`): training equals
// single-process training on the whole batch, every replica alike, and each
// node's worker mapped its trainers' arenas; `pieces` is the plan's cut
// (bucket_pieces.h).
void ExpectArenaBucketTrainsLikeOneProcess(const std::string& cap_mb,
                                           const std::vector<std::string>& model,
                                           const std::string& pieces, int local = 2) {
  Cluster cluster(
      Job(2, local,
          {"--bucket-cap-mb=" + cap_mb, "--first-bucket-cap-mb=" + cap_mb, "--timeout-s=60"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> common = {"--batch=8", "--fp64"};
  common.insert(common.end(), model.begin(), model.end());
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(common, &outs);
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(seconds(120));
    ASSERT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  ExpectPlanPieces(cluster, 2, pieces);
  for (int n = 0; n < 2; ++n) {
    const std::string log = cluster.node(n).process().Log();
    EXPECT_NE(
        log.find(absl::StrCat("event=gloo_worker_arenas_mapped node_rank=", n, " arenas=", local)),
        std::string::npos)
        << "node " << n << ":\n"
        << log;
  }
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), common);
  const std::vector<double> first = LoadWeights(outs[0]);
  for (const std::string& out : outs) {
    const std::vector<double> got = LoadWeights(out);
    EXPECT_LE(RelativeDifference(got, expected), 1e-12) << out;
    EXPECT_EQ(got, first) << out << " differs from node 0's trainer 0";
  }
}

// 1 MiB of weights: one piece, the per-iteration counts in a collective of
// their own ahead of it (too large to fold, count_fold.h).
TEST(MultiNode, AOneMegabyteBucketSummedInTheTrainersArenasTrainsLikeOneProcess) {
  ExpectArenaBucketTrainsLikeOneProcess("1", {"--steps=8", "--dim=256", "--hidden=512"},
                                        "buckets=2 pieces=2");
}

// One bucket of ~163 KiB, the iteration's first collective: above the
// size whose collective gathers (gather_sum.h: 2 x 163 KiB > 256 KiB),
// so Gloo's ring could average it and test half the inputs for NaN, but
// small enough that the per-iteration counts fold into it (count_fold.h),
// which makes it a plain sum: the daemon must scan every input itself
// (--nonfinite=error, the default), or the piece fails INTERNAL.
TEST(MultiNode, ABucketCarryingTheIterationsCountsIsCheckedWhole) {
  for (int local : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("2 daemons x ", local, " trainers"));
    ExpectArenaBucketTrainsLikeOneProcess("1", {"--steps=4", "--dim=128", "--hidden=160"},
                                          "buckets=1 pieces=1", local);
  }
}

// 64 MiB of weights: pieces whose collectives and averages the worker runs
// one after another while the daemon sums the next piece (2 MiB, 8 near-equal
// pieces, 2 MiB).
TEST(MultiNode, ASixtyFourMegabyteBucketSummedInTheTrainersArenasTrainsLikeOneProcess) {
  ExpectArenaBucketTrainsLikeOneProcess("128", {"--steps=3", "--dim=2048", "--hidden=4096"},
                                        "buckets=1 pieces=10");
}

// A hardened leader binds one address (here 127.0.0.2, not 127.0.0.1): it
// must join its own rendezvous there, not at 127.0.0.1 where nothing listens.
TEST(MultiNode, LeaderListeningOnOneAddressOnlyJoinsItsOwnJobAndTrainsLikeOneProcess) {
  Cluster cluster(Job(2, 1, {}, "s3cret", "127.0.0.2"));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  ExpectTrainsLikeOneProcess(cluster, {"--steps=10", "--batch=60", "--fp64"}, kBound);
}

// Nodes listening on an IPv6 address: each Gloo device binds that address
// (brackets stripped; Gloo wants one address family across the job), and
// the job trains exactly.
TEST(MultiNode, NodesListeningOnIpv6LoopbackTrainLikeOneProcess) {
  Cluster cluster(Job(2, 1, {}, "s3cret", "[::1]", {{}, {"--listen=[::1]:0"}}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  ExpectTrainsLikeOneProcess(cluster, {"--steps=10", "--batch=60", "--fp64"}, kBound);
}

// Every node given the same --leader (as the k8s manifest does): node 0 sees
// that "localhost:PORT" resolves to its own address and port, and leads.
TEST(MultiNode, NodeZeroGivenALeaderNamingItselfLeadsAndTrainsLikeOneProcess) {
  ClusterOptions options = Job(2, 1);
  options.node0_leader_host = "localhost";
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  EXPECT_NE(cluster.node(0).process().Log().find("event=leader_is_self leader=localhost:"),
            std::string::npos)
      << cluster.DaemonLogs();
  ExpectTrainsLikeOneProcess(cluster, {"--steps=10", "--batch=60", "--fp64"}, kBound);
}

// The port a daemon logged for --metrics-listen=HOST:0 (0 if none).
int MetricsPort(Daemon& daemon) {
  if (!WaitForLog(daemon.process(), "event=metrics_listening", kBound)) return 0;
  const std::string log = daemon.process().Log();
  const size_t at = log.find(" port=", log.find("event=metrics_listening"));
  return at == std::string::npos ? 0 : std::atoi(log.c_str() + at + 6);
}

// The value of the first sample of `metric` (name then '{' or ' '), or -1.
double Sample(const std::string& text, const std::string& metric) {
  for (size_t at = text.find(metric); at != std::string::npos; at = text.find(metric, at + 1)) {
    if ((at > 0 && text[at - 1] != '\n') ||
        (text[at + metric.size()] != '{' && text[at + metric.size()] != ' ')) {
      continue;
    }
    const size_t end = text.find('\n', at);
    const size_t space = text.rfind(' ', end);
    return std::atof(text.substr(space + 1, end - space - 1).c_str());
  }
  return -1;
}

// The wire and join fields reach the operator: `gradsyncctl stats`
// (table) and the daemon's Prometheus endpoint, scraped by curl, while a
// 2-node bf16-wire job runs.
TEST(MultiNode, StatsTableAndMetricsShowTheWireDtypeBytesAndJoins) {
  // --uneven-inputs: the nodes agree on the job's active trainers (without
  // it each node counts only its own).
  Cluster cluster(
      Job(2, 1, {"--wire-dtype=bf16", "--metrics-listen=127.0.0.1:0", "--uneven-inputs"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> trainers;
  for (int n = 0; n < 2; ++n) {
    trainers.push_back(StartTrainer(cluster.node(n), 0, {"--steps=150", "--sleep-ms=20"}, ""));
  }
  const int metrics_port = MetricsPort(cluster.node(0));
  ASSERT_GT(metrics_port, 0) << cluster.DaemonLogs();
  // Iteration 0 went through the wire: there are bytes to show.
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=plan_decided", kBound))
      << cluster.DaemonLogs();

  Process table = Process::Spawn({Runfile("tools/gradsyncctl/gradsyncctl"),
                                  absl::StrCat("--addr=127.0.0.1:", cluster.port()), "stats"},
                                 cluster.dir() + "/table.log");
  Process scrape = Process::Spawn(
      {"/usr/bin/curl", "-sSf", absl::StrCat("http://127.0.0.1:", metrics_port, "/metrics")},
      cluster.dir() + "/metrics.txt");
  ASSERT_EQ(table.Wait(kBound).code, 0) << table.Log();
  ASSERT_EQ(scrape.Wait(kBound).code, 0) << scrape.Log();
  const std::string text = table.Log();
  EXPECT_NE(text.find("wire bf16  "), std::string::npos) << text;
  EXPECT_EQ(text.find("wire bf16  0 B"), std::string::npos) << text;
  EXPECT_NE(text.find(" sent to the cross-node allreduce  2 active trainers  0 joined here"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("JOINED"), std::string::npos) << text;

  const std::string metrics = scrape.Log();
  EXPECT_NE(metrics.find("gradsync_wire_info{node=\"0\",job=\"mnjob\",wire_dtype=\"bf16\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("# TYPE gradsync_wire_bytes_total counter"), std::string::npos);
  EXPECT_GT(Sample(metrics, "gradsync_wire_bytes_total"), 0) << metrics;
  EXPECT_EQ(Sample(metrics, "gradsync_active_trainers"), 2) << metrics;
  EXPECT_EQ(Sample(metrics, "gradsync_joined_local_trainers"), 0) << metrics;
  EXPECT_EQ(Sample(metrics, "gradsync_trainer_joined"), 0) << metrics;
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(kBound);
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
}

TEST(MultiNode, LayoutMismatchBetweenNodesIsAnErrorOnEveryTrainer) {
  Cluster cluster(Job(2, 1));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  Process a = StartTrainer(cluster.node(0), 0, {"--steps=3"}, "");
  Process b = StartTrainer(cluster.node(1), 0, {"--steps=3", "--hidden=40"}, "");
  for (Process* p : {&a, &b}) {
    ExitStatus st = p->Wait(kBound);
    EXPECT_FALSE(st.timed_out);
    EXPECT_EQ(st.code, kExitMismatch) << p->Log();
    EXPECT_NE(p->Log().find("node 1 registered a different layout than node 0"), std::string::npos)
        << p->Log();
    EXPECT_NE(p->Log().find("fc1.weight"), std::string::npos) << p->Log();
  }
}

TEST(MultiNode, KilledDaemonFailsEveryTrainerThenTheJobReforms) {
  Cluster cluster(Job(3, 1));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> trainers;
  for (int n = 0; n < 3; ++n) {
    trainers.push_back(
        StartTrainer(cluster.node(n), 0, {"--steps=2000", "--sleep-ms=20", "--batch=60"}, ""));
  }
  for (int n = 0; n < 3; ++n) {
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(), "event=job_running", kBound));
  }
  // Node 1 finished iteration 0 and decided its next plan: iterations are in flight.
  ASSERT_TRUE(WaitForLog(cluster.node(1).process(), "event=plan_decided", kBound));
  // Node 1: in the ring both survivors talk to it, and neither is the leader.
  cluster.node(1).process().Signal(SIGKILL);
  cluster.node(1).process().Wait(kBound);
  for (int n = 0; n < 3; ++n) {
    ExitStatus st = trainers[n].Wait(seconds(30));  // the daemons' timeout is 15 s
    EXPECT_FALSE(st.timed_out) << "trainer on node " << n << " hung";
    // Node 1's trainer lost its own daemon; the others a peer node.
    EXPECT_EQ(st.code, kExitPeerFailed) << "trainer on node " << n << "\n"
                                        << trainers[n].Log() << cluster.DaemonLogs();
    if (n == 1) continue;
    EXPECT_NE(trainers[n].Log().find("node_rank=1 (host=127.0.0.1) is dead"), std::string::npos)
        << "trainer on node " << n << "\n"
        << trainers[n].Log() << cluster.DaemonLogs();
  }
  // Warm restart: the surviving daemons, untouched, plus a new node 1.
  ASSERT_TRUE(cluster.StartNode(1)) << cluster.DaemonLogs();
  ExpectTrainsLikeOneProcess(cluster, {"--steps=10", "--batch=60", "--fp64"}, kBound, "again");
  EXPECT_NE(cluster.node(0).process().Log().find("event=joined generation=2"), std::string::npos)
      << cluster.DaemonLogs();
}

TEST(MultiNode, StallIsReportedByTheLeaderNamingNodeTrainerAndTensor) {
  Cluster cluster(Job(2, 1, {"--stall-threshold-s=1", "--timeout-s=4"}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  Process ok = StartTrainer(cluster.node(0), 0, {"--steps=5"}, "");
  Process stuck = StartTrainer(cluster.node(1), 0, {"--steps=5", "--withhold=0"}, "");
  // Node 0 times out inside the collective node 1 never joins; the leader
  // then aborts the generation: both end with TIMEOUT or PEER_FAILED.
  for (Process* p : {&ok, &stuck}) {
    ExitStatus st = p->Wait(kBound);
    EXPECT_FALSE(st.timed_out);
    EXPECT_TRUE(st.code == 14 || st.code == 15) << p->Log();
  }
  const std::string leader = cluster.node(0).process().Log();
  const size_t at = leader.find("event=job_stall");
  ASSERT_NE(at, std::string::npos) << cluster.DaemonLogs();
  const std::string line = leader.substr(at, leader.find('\n', at) - at);
  EXPECT_NE(line.find("node_rank=1"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 1 (local 0"), std::string::npos) << line;
  EXPECT_NE(line.find("fc1.weight"), std::string::npos) << line;
  // The leader's stats carry node 1's report too.
  Process stats =
      Process::Spawn({Runfile("tools/gradsyncctl/gradsyncctl"),
                      absl::StrCat("--addr=127.0.0.1:", cluster.port()), "stats", "--json"},
                     cluster.dir() + "/stats.log");
  EXPECT_EQ(stats.Wait(kBound).code, 0) << stats.Log();
  const std::string json = stats.Log();
  EXPECT_NE(json.find("node_rank=1"), std::string::npos) << json;
  EXPECT_NE(json.find("fc1.weight"), std::string::npos) << json;
}

TEST(MultiNode, DeadLeaderIsReportedAsSuch) {
  Cluster cluster(Job(2, 1));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  Process a = StartTrainer(cluster.node(0), 0, {"--steps=2000", "--sleep-ms=20"}, "");
  Process b = StartTrainer(cluster.node(1), 0, {"--steps=2000", "--sleep-ms=20"}, "");
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(WaitForLog(cluster.node(n).process(), "event=job_running", kBound));
  }
  // Node 1 finished iteration 0 and planned the next: iterations are in flight.
  ASSERT_TRUE(WaitForLog(cluster.node(1).process(), "event=plan_decided", kBound));
  cluster.node(0).process().Signal(SIGKILL);
  cluster.node(0).process().Wait(kBound);
  ExitStatus sa = a.Wait(seconds(30)), sb = b.Wait(seconds(30));
  EXPECT_FALSE(sa.timed_out || sb.timed_out);
  EXPECT_EQ(sa.code, 14) << a.Log();  // its own daemon died
  EXPECT_EQ(sb.code, 14) << b.Log();
  EXPECT_NE(b.Log().find("the leader is dead"), std::string::npos)
      << b.Log() << cluster.DaemonLogs();
}

TEST(MultiNode, ConfigSetOnTheLeaderRePlansEveryNodeAtTheSameIteration) {
  Cluster cluster(Job(2, 1));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::string> args = {"--steps=150", "--fp64", "--sleep-ms=25"};
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_running", kBound));
  // Iteration 0 is done: the change lands mid-run.
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=plan_decided", kBound));
  const std::string ctl = Runfile("tools/gradsyncctl/gradsyncctl");
  // A non-leader refuses: caps are job-wide.
  Process refused = Process::Spawn(
      {ctl, absl::StrCat("--addr=127.0.0.1:", cluster.node(1).ListenPort(seconds(10))),
       "--token-file=" + cluster.dir() + "/token", "config", "set", "bucket_cap_mb=25"},
      cluster.dir() + "/ctl1.log");
  EXPECT_EQ(refused.Wait(kBound).code, 1) << refused.Log();
  EXPECT_NE(refused.Log().find("set them on the leader"), std::string::npos) << refused.Log();
  Process set = Process::Spawn({ctl, absl::StrCat("--addr=127.0.0.1:", cluster.port()),
                                "--token-file=" + cluster.dir() + "/token", "config", "set",
                                "bucket_cap_mb=25", "first_bucket_cap_mb=1"},
                               cluster.dir() + "/ctl0.log");
  EXPECT_EQ(set.Wait(kBound).code, 0) << set.Log();
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  // Both nodes re-planned at the same iteration boundary...
  auto rebuilt_at = [](const std::string& log) {
    const size_t at = log.find("event=plan_rebuilt iteration=");
    if (at == std::string::npos) return std::string("none");
    const size_t start = at + std::string("event=plan_rebuilt iteration=").size();
    return log.substr(start, log.find(' ', start) - start);
  };
  const std::string at0 = rebuilt_at(cluster.node(0).process().Log());
  EXPECT_NE(at0, "none") << cluster.DaemonLogs();
  EXPECT_EQ(at0, rebuilt_at(cluster.node(1).process().Log())) << cluster.DaemonLogs();
  // ...and training stayed equivalent to one process on the whole batch.
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
  }
}

// The iterations of every "event=plan_rebuilt" in `log`, comma-separated.
std::string RebuildIterations(const std::string& log) {
  const std::string key = "event=plan_rebuilt iteration=";
  std::string out;
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    const size_t start = at + key.size();
    absl::StrAppend(&out, out.empty() ? "" : ",", log.substr(start, log.find(' ', start) - start));
  }
  return out.empty() ? "none" : out;
}

// Waits until `needle` is in the process's log past byte `from`.
bool WaitForLogAfter(const Process& p, const std::string& needle, size_t from,
                     std::chrono::milliseconds timeout) {
  return WaitUntil([&] { return p.Log().find(needle, from) != std::string::npos; }, timeout);
}

// True once process `pid` is stopped (state T in /proc/PID/stat).
bool WaitUntilStopped(pid_t pid, std::chrono::milliseconds timeout) {
  return WaitUntil(
      [&] {
        std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
        const std::string stat((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
        const size_t paren = stat.rfind(')');
        return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
      },
      timeout);
}

// A config change a few iterations into a job of fast
// iterations that stalled once at its start (node 0's trainer stops in
// step 2's backward for ~1 s: a slow first data load). The switch
// iteration was chosen from the rate averaged since the job started, stall
// included: far too low, so the other node got the change after it had
// passed that iteration (STATE). Now the rate of the last iterations
// counts. Four rounds, each a new job.
TEST(MultiNode, ConfigChangeEarlyInAFastJobAppliesAtTheSameIterationOnBothNodes) {
  Cluster cluster(Job(2, 1));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  // Long enough for the switch iteration, ~2 s of iterations ahead.
  const std::vector<std::string> args = {"--steps=4000", "--fp64", "--batch=8"};
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  std::vector<std::string> trainer_args = args;
  trainer_args.push_back("--print-loss");
  // The leader schedules a change ~2 s of iterations ahead: at most 1000
  // iterations a second keeps that inside the job on a fast, idle machine
  // (at 2000 a second it fell past the last step and nothing re-planned).
  trainer_args.push_back("--sleep-ms=1");
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const size_t from0 = cluster.node(0).process().Log().size();
    const size_t from1 = cluster.node(1).process().Log().size();
    std::vector<Process> trainers;
    std::vector<std::string> outs;
    for (int n = 0; n < 2; ++n) {
      outs.push_back(absl::StrCat(cluster.dir(), "/fast", round, ".", n, ".txt"));
      std::vector<std::string> a = trainer_args;
      if (n == 0) a.push_back("--pause-at=backward");
      trainers.push_back(StartTrainer(cluster.node(n), 0, a, outs.back()));
    }
    ASSERT_TRUE(WaitUntilStopped(trainers[0].pid(), kBound)) << trainers[0].Log();
    // The stall's length is the scenario (well under the 15 s timeout), not
    // synchronization: the test waits on states before and after it.
    std::this_thread::sleep_for(seconds(1));
    trainers[0].Signal(SIGCONT);
    // Rank 0 prints each step as it completes: the change lands a few
    // iterations after the stall. Rounds alternate the caps, so each one
    // re-plans.
    ASSERT_TRUE(WaitForLogAfter(trainers[0], "step   8 ", 0, kBound)) << trainers[0].Log();
    const absl::Status set =
        SetBucketCaps(cluster.port(), "s3cret",  // the Cluster's job token
                      round % 2 == 0 ? "25" : "0.001", round % 2 == 0 ? "1" : "0.0001");
    ASSERT_TRUE(set.ok()) << set.message();
    for (auto& t : trainers) {
      ExitStatus st = t.Wait(seconds(120));
      EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
    }
    const std::string at0 = RebuildIterations(cluster.node(0).process().Log().substr(from0));
    const std::string at1 = RebuildIterations(cluster.node(1).process().Log().substr(from1));
    EXPECT_NE(at0, "none") << cluster.DaemonLogs();
    EXPECT_EQ(at0, at1) << cluster.DaemonLogs();
    for (const std::string& out : outs) {
      EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
    }
    if (::testing::Test::HasFailure()) return;
  }
}

// The last "event=plan_decided ..." of a daemon's log, from the event on.
std::string LastPlanDecision(const std::string& log) {
  const size_t at = log.rfind("event=plan_decided");
  if (at == std::string::npos) return "none";
  return log.substr(at, log.find('\n', at) - at);
}

// SetConfig every ~20 ms on the leader while a 2x2 job
// trains. Every version applies on every node, in order, at the same
// iteration: no crash, training exactly like one process, and both nodes
// end on the same plan decision. (Before: nodes applied different versions
// at different iterations, and a daemon aborted inside Gloo.)
TEST(MultiNode, ConfigBurstsKeepEveryNodeOnTheSamePlanAndTrainingExact) {
  Cluster cluster(Job(2, 2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::string> args = {"--steps=600", "--fp64", "--batch=60", "--sleep-ms=10"};
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_running", kBound));
  std::atomic<bool> done{false};
  std::thread burst([&] {
    for (int i = 0; !done.load(); ++i) {
      // Alternating between one bucket per tensor and one for all of them.
      const absl::Status set =
          SetBucketCaps(cluster.port(), "s3cret",  // the Cluster's job token
                        i % 2 == 0 ? "25" : "0.001", i % 2 == 0 ? "1" : "0.0001");
      EXPECT_TRUE(set.ok()) << set.message();
      std::this_thread::sleep_for(milliseconds(20));  // the burst's pace
    }
  });
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(seconds(120));
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  done.store(true);
  burst.join();
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  const std::vector<double> first = LoadWeights(outs[0]);
  for (const std::string& out : outs) {
    const std::vector<double> got = LoadWeights(out);
    EXPECT_LE(RelativeDifference(got, expected), 1e-12) << out;
    EXPECT_EQ(got, first) << out << " differs from node 0's trainer 0";
  }
  const std::string last0 = LastPlanDecision(cluster.node(0).process().Log());
  const std::string last1 = LastPlanDecision(cluster.node(1).process().Log());
  EXPECT_EQ(last0, last1) << cluster.DaemonLogs();
  EXPECT_EQ(last0.find("config_version=0 "), std::string::npos)
      << "no config version applied: " << last0;
}

// SetConfig every ~20 ms on the leader from before the job forms, so the
// first versions enter the log while both nodes are still forming (they
// are scheduled just after the one-time rebuild at iteration 1). A node
// that took versions from the log before its job listened for them dropped
// them: the nodes then numbered their plan decisions differently and one
// waited for the other's plan until the timeout. Every version must reach
// every node's job, whenever it was published.
TEST(MultiNode, ConfigBurstWhileTheJobFormsKeepsEveryNodeOnTheSamePlan) {
  Cluster cluster(Job(2, 2));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::atomic<bool> done{false};
  std::thread burst([&] {
    for (int i = 0; !done.load(); ++i) {
      const absl::Status set =
          SetBucketCaps(cluster.port(), "s3cret",  // the Cluster's job token
                        i % 2 == 0 ? "25" : "0.001", i % 2 == 0 ? "1" : "0.0001");
      EXPECT_TRUE(set.ok()) << set.message();
      std::this_thread::sleep_for(milliseconds(20));  // the burst's pace
    }
  });
  // Past the switch horizon: a version published once the job runs applies
  // about 2 s of iterations later, estimated high while the job is young
  // (iteration ~200); paced steps (at most ~100 a second) run past it, so
  // some version applies however quickly the job formed (one published
  // while it formed applies at once).
  const std::vector<std::string> args = {"--steps=300", "--fp64", "--batch=60", "--sleep-ms=10"};
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(seconds(120));
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  done.store(true);
  burst.join();
  const std::string log0 = cluster.node(0).process().Log();
  const std::string log1 = cluster.node(1).process().Log();
  EXPECT_EQ(log0.find("comparing plan version"), std::string::npos) << cluster.DaemonLogs();
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
  }
  const std::string last0 = LastPlanDecision(log0);
  EXPECT_EQ(last0, LastPlanDecision(log1)) << cluster.DaemonLogs();
  EXPECT_EQ(last0.find("config_version=0 "), std::string::npos)
      << "no config version applied: " << last0;
}

// SetConfig on the leader while its job has formed locally and waits in
// Join for node 1, which has not started: no generation runs yet, so the
// change has no log to enter. The leader's Join had already read the old
// caps, so the job ran with them while GetConfig showed the new ones. The
// change is held and becomes the generation's config version 1: both
// nodes re-plan to it at the same iteration, and training stays exact.
TEST(MultiNode, ConfigSetWhileTheLeaderWaitsForTheOtherNodesAppliesToTheJob) {
  Cluster cluster(Job(2, 1));
  ASSERT_TRUE(cluster.StartNode(0)) << cluster.DaemonLogs();
  // --sleep-ms paces the job (a few hundred ms of iterations past the
  // switch), not synchronization: the test waits on logged states.
  const std::vector<std::string> args = {"--steps=40", "--fp64", "--batch=60", "--sleep-ms=5"};
  std::vector<std::string> outs = {cluster.dir() + "/held0.txt", cluster.dir() + "/held1.txt"};
  std::vector<Process> trainers;
  trainers.push_back(StartTrainer(cluster.node(0), 0, args, outs[0]));
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=join node_rank=0", kBound))
      << cluster.DaemonLogs();
  const absl::Status set = SetBucketCaps(cluster.port(), "s3cret", "25", "1");
  ASSERT_TRUE(set.ok()) << set.message();
  // No generation had formed: the leader held the change.
  EXPECT_NE(cluster.node(0).process().Log().find("event=job_config_held generation=1"),
            std::string::npos)
      << cluster.DaemonLogs();
  ASSERT_TRUE(cluster.StartNode(1)) << cluster.DaemonLogs();
  trainers.push_back(StartTrainer(cluster.node(1), 0, args, outs[1]));
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  // Job-wide: the same re-plan, to the new caps, at the same iteration.
  const std::string caps = "cap_mb=25.000 first_cap_mb=1.000";
  const std::string rebuilt0 = RebuildTo(cluster.node(0).process().Log(), caps);
  const std::string rebuilt1 = RebuildTo(cluster.node(1).process().Log(), caps);
  EXPECT_NE(rebuilt0, "none") << cluster.DaemonLogs();
  EXPECT_EQ(rebuilt0, rebuilt1) << cluster.DaemonLogs();
  const std::string decided0 = LastPlanDecision(cluster.node(0).process().Log());
  EXPECT_NE(decided0.find("config_version=1 "), std::string::npos) << decided0;
  EXPECT_EQ(decided0, LastPlanDecision(cluster.node(1).process().Log())) << cluster.DaemonLogs();
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
  }
}

// Every trainer of node 1 accumulates two micro-batches
// under no_sync per step while node 0's sync every step. Each node is
// consistent within itself, so only a cross-node comparison can see it:
// MISMATCH on every trainer, naming both nodes and what each summed,
// instead of GS_OK and a 2-iteration sum averaged with a 1-iteration one.
// `daemon_flags` and `model` decide how the comparison crosses: folded
// into a small first bucket, or on its own ahead of a large one (the
// plan's cut then `pieces`).
void ExpectNoSyncOnOneNodeOnlyFailsEveryTrainerWithMismatch(
    const std::vector<std::string>& daemon_flags, const std::vector<std::string>& model,
    const std::string& pieces = "") {
  Cluster cluster(Job(2, 2, daemon_flags));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> trainers;
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = {"--steps=3", "--fp64"};
      args.insert(args.end(), model.begin(), model.end());
      if (n == 1) args.push_back("--accumulate=2");
      trainers.push_back(StartTrainer(cluster.node(n), r, args, ""));
    }
  }
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(kBound);
    EXPECT_FALSE(st.timed_out) << t.Log();
    EXPECT_EQ(st.code, kExitMismatch) << t.Log() << cluster.DaemonLogs();
    const std::string log = t.Log();
    EXPECT_NE(log.find("nodes out of step in iteration 0"), std::string::npos) << log;
    EXPECT_NE(log.find("node 0's trainers summed 1 iteration(s) (0 under no_sync)"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("node 1's summed 2 (1 under no_sync)"), std::string::npos) << log;
  }
  EXPECT_TRUE(cluster.node(0).process().Running()) << cluster.DaemonLogs();
  EXPECT_TRUE(cluster.node(1).process().Running()) << cluster.DaemonLogs();
  if (!pieces.empty()) ExpectPlanPieces(cluster, 2, pieces);
}

TEST(MultiNode, NoSyncOnEveryTrainerOfOneNodeOnlyFailsEveryTrainerWithMismatch) {
  ExpectNoSyncOnOneNodeOnlyFailsEveryTrainerWithMismatch({}, {});
}

// The same with a first bucket of 1 MiB, too large to carry the counts
// (count_fold.h): they cross in a collective of their own ahead of the
// bucket's, and the daemon still compares them before anyone is told the
// iteration is done.
TEST(MultiNode, NoSyncOnOneNodeOnlyWithAOneMegabyteFirstBucketFailsEveryTrainerWithMismatch) {
  ExpectNoSyncOnOneNodeOnlyFailsEveryTrainerWithMismatch(
      {"--bucket-cap-mb=1", "--first-bucket-cap-mb=1", "--timeout-s=60"},
      {"--dim=256", "--hidden=512"}, "buckets=2 pieces=2");
}

TEST(MultiNode, BadTokenIsRefusedAndLogged) {
  Cluster cluster(Job(2, 1, {}, "right-token"));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::string wrong = cluster.dir() + "/wrong";
  ASSERT_TRUE(WriteTokenFile(wrong, "wrong-token"));
  // Replaces node 1 with one holding the wrong token.
  ASSERT_TRUE(cluster.StartNode(1, wrong)) << cluster.DaemonLogs();
  Process a = StartTrainer(cluster.node(1), 0, {"--steps=2"}, "");
  ExitStatus st = a.Wait(kBound);
  EXPECT_FALSE(st.timed_out);
  EXPECT_EQ(st.code, kExitInvalidArgument) << a.Log();
  EXPECT_NE(a.Log().find("Rendezvous.Join refused: the job token does not match"),
            std::string::npos)
      << a.Log();
  EXPECT_NE(cluster.node(0).process().Log().find("event=call_refused rpc=Rendezvous.Join"),
            std::string::npos)
      << cluster.DaemonLogs();
  EXPECT_EQ(cluster.DaemonLogs().find("wrong-token"), std::string::npos) << "the token leaked";
}

TEST(MultiNode, WrongNumberOfNodesAndDuplicateRanksAreRefused) {
  Cluster cluster(Job(2, 1));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  // A third daemon that believes the job has 3 nodes.
  Daemon confused(1, {"--num-nodes=3", "--node-rank=2", "--job-id=mnjob",
                      absl::StrCat("--leader=127.0.0.1:", cluster.port()), "--timeout-s=5",
                      "--job-token-file=" + cluster.dir() + "/token"});
  ASSERT_TRUE(confused.WaitReady(seconds(10)));
  Process c = StartTrainer(confused, 0, {"--steps=2"}, "");
  EXPECT_EQ(c.Wait(kBound).code, kExitInvalidArgument) << c.Log();
  EXPECT_NE(c.Log().find("node_rank=2 was started with num_nodes=3"), std::string::npos) << c.Log();

  // A second daemon claiming node rank 1 while node 1 is in the round.
  Daemon twin(1, {"--num-nodes=2", "--node-rank=1", "--job-id=mnjob",
                  absl::StrCat("--leader=127.0.0.1:", cluster.port()), "--timeout-s=5",
                  "--job-token-file=" + cluster.dir() + "/token"});
  ASSERT_TRUE(twin.WaitReady(seconds(10)));
  Process one = StartTrainer(cluster.node(1), 0, {"--steps=2"}, "");
  // The twin joins second: once the leader has the real node 1 in the round.
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=join node_rank=1 ", kBound))
      << cluster.DaemonLogs();
  Process dup = StartTrainer(twin, 0, {"--steps=2"}, "");
  ExitStatus d = dup.Wait(kBound);
  EXPECT_EQ(d.code, kExitInvalidArgument) << dup.Log();
  EXPECT_NE(dup.Log().find("node_rank=1 joined twice"), std::string::npos) << dup.Log();
  // The job itself still forms with the real node 0.
  Process zero = StartTrainer(cluster.node(0), 0, {"--steps=2"}, "");
  EXPECT_EQ(zero.Wait(kBound).code, 0) << zero.Log() << cluster.DaemonLogs();
  EXPECT_EQ(one.Wait(kBound).code, 0) << one.Log();
}

TEST(MultiNode, NonZeroRankWithoutLeaderExitsAtOnceNamingTheFlags) {
  // Before: it hosted a rendezvous of its own and failed only when trainers came.
  Daemon lost(1, {"--num-nodes", "3", "--node-rank", "1", "--job-id=mnjob", "--timeout-s=30"});
  const auto started = std::chrono::steady_clock::now();
  const ExitStatus st = lost.process().Wait(seconds(10));
  EXPECT_FALSE(st.timed_out) << lost.process().Log();
  EXPECT_TRUE(st.exited) << st.ToString();
  EXPECT_EQ(st.code, 2) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - started, seconds(5));
  EXPECT_NE(lost.process().Log().find("--node-rank 1 of --num-nodes 3 needs --leader HOST:PORT"),
            std::string::npos)
      << lost.process().Log();
  // Nothing was bound or created before the refusal.
  EXPECT_NE(access(lost.socket().c_str(), F_OK), 0);
  EXPECT_TRUE(SegmentsWithPrefix(lost.shm_prefix()).empty());
}

// Trains on two daemons (one trainer each, fp32) with `wire_dtype` and
// returns node 0's trainer's log; its weights go to `out`. `after` runs
// once the trainers are done, while the daemons still run.
std::string TrainTwoNodes(const std::string& wire_dtype, const std::vector<std::string>& args,
                          const std::string& out,
                          const std::function<void(Cluster&)>& after = nullptr) {
  Cluster cluster(Job(2, 1, {"--wire-dtype=" + wire_dtype}));
  EXPECT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> trainers;
  for (int n = 0; n < 2; ++n) {
    trainers.push_back(StartTrainer(cluster.node(n), 0, args,
                                    n == 0 ? out : absl::StrCat(cluster.dir(), "/w1.txt")));
  }
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(kBound);
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << cluster.DaemonLogs();
  }
  if (after) after(cluster);
  return trainers[0].Log();
}

// Node 0's Stats once its wire counter reached `bytes` (the scheduler
// thread may count the last bucket just after the trainers returned), or
// the last Stats seen at the deadline.
v1::Stats WaitForWireBytes(const Cluster& cluster, uint64_t bytes) {
  v1::Stats stats;
  WaitUntil(
      [&] {
        const absl::StatusOr<v1::Stats> now = GetStats(cluster.port(), "s3cret");
        if (now.ok()) stats = *now;
        return now.ok() && stats.wire_bytes() >= bytes;
      },
      kBound);
  return stats;
}

// The losses rank 0 printed, by step ("step   3  loss 0.123456 ...").
std::vector<double> Losses(const std::string& log) {
  std::vector<double> losses;
  for (size_t p = log.find("step "); p != std::string::npos; p = log.find("step ", p + 1)) {
    int step = 0;
    double loss = 0;
    if (std::sscanf(log.c_str() + p, "step %d loss %lf", &step, &loss) == 2 &&
        step == static_cast<int>(losses.size())) {
      losses.push_back(loss);
    }
  }
  return losses;
}

// --wire-dtype: fp32 gradients cross the wire as 16-bit values. The result
// stays within the casts' error of single-process training (and farther
// from it than fp32's own rounding: the cast did happen).
TEST(MultiNode, CompressedWireTrainsWithinTheCastsErrorOfSingleProcessTraining) {
  const std::vector<std::string> args = {"--steps=5", "--batch=64", "--quiet"};
  ScratchDir dir;
  const std::vector<double> expected = SingleProcessReference(dir.path(), args);
  // Every step hands at least the whole model to the wire (buckets also
  // carry the alignment padding between neighbouring tensors).
  const uint64_t min_fp32_bytes = 5 * expected.size() * sizeof(float);
  uint64_t fp32_bytes = 0;
  for (const char* wire : {"off", "bf16", "fp16"}) {
    const std::string out = dir.File(absl::StrCat("w.", wire, ".txt"));
    const uint64_t want_bytes = std::string(wire) == "off" ? min_fp32_bytes : min_fp32_bytes / 2;
    v1::Stats stats;
    TrainTwoNodes(wire, args, out,
                  [&](Cluster& cluster) { stats = WaitForWireBytes(cluster, want_bytes); });
    EXPECT_EQ(stats.wire_dtype(), wire);
    EXPECT_GE(stats.wire_bytes(), want_bytes) << wire;
    const std::vector<double> got = LoadWeights(out);
    ASSERT_EQ(got.size(), expected.size()) << wire;
    const double diff = RelativeDifference(got, expected);
    std::printf("wire %s: relative difference %.3g from single-process fp32, wire_bytes %llu\n",
                wire, diff, static_cast<unsigned long long>(stats.wire_bytes()));
    if (std::string(wire) == "off") {
      // fp32 across nodes differs from one process by summation order only.
      EXPECT_LE(diff, 1e-6);
      fp32_bytes = stats.wire_bytes();
      continue;
    }
    // Half the bytes of the fp32 run, exactly, but for each iteration's
    // agreement (uncompressed float64: 4 counts + three per node, then the
    // straggler tracker's head, two per node and 16 buckets per node; 5 steps).
    const uint64_t agreement_bytes = 5 * (4 + 3 * 2 + 1 + (2 + 16) * 2) * sizeof(double);
    EXPECT_EQ((stats.wire_bytes() - agreement_bytes) * 2, fp32_bytes - agreement_bytes) << wire;
    // Per step each averaged gradient element is within 2 roundings (2^-7
    // bf16, 2^-10 fp16, relative); over 5 steps of lr 0.1 the weights
    // (norm ~1) move by far less than that.
    const double bound = std::string(wire) == "bf16" ? 0x1p-7 : 0x1p-10;
    EXPECT_LE(diff, bound) << wire;
    // Farther than fp32's own rounding: the cast did happen.
    EXPECT_GT(diff, 1e-6) << wire << ": as close as fp32, so nothing was compressed";
  }
}

TEST(MultiNode, TrainingWithABf16WireConvergesLikeFp32) {
  const std::vector<std::string> args = {"--steps=60", "--batch=64", "--print-loss"};
  ScratchDir dir;
  const std::vector<double> fp32 = Losses(TrainTwoNodes("off", args, dir.File("fp32.txt")));
  const std::vector<double> bf16 = Losses(TrainTwoNodes("bf16", args, dir.File("bf16.txt")));
  ASSERT_EQ(fp32.size(), 60u);
  ASSERT_EQ(bf16.size(), 60u);
  // The loss the fp32 run reached after 4/5 of its steps: the bf16 run gets
  // below it by its last step (a convergence check, not a timing).
  const double threshold = fp32[47];
  EXPECT_LT(fp32[47], 0.5 * fp32[0]) << "the fp32 run itself did not converge";
  std::printf("loss: step 0 %.6f, fp32 step 47 %.6f / 59 %.6f, bf16 step 59 %.6f\n", fp32[0],
              fp32[47], fp32.back(), bf16.back());
  EXPECT_LT(bf16.back(), threshold)
      << "bf16 loss " << bf16.back() << " vs fp32 at step 47 " << threshold;
}

TEST(MultiNode, DifferentWireDtypesOnTwoNodesAreAMismatchNamingBoth) {
  Cluster cluster(
      Job(2, 1, {}, "s3cret", "127.0.0.1", {{"--wire-dtype=off"}, {"--wire-dtype=bf16"}}));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  Process a = StartTrainer(cluster.node(0), 0, {"--steps=3"}, "");
  Process b = StartTrainer(cluster.node(1), 0, {"--steps=3"}, "");
  for (Process* p : {&a, &b}) {
    ExitStatus st = p->Wait(kBound);
    EXPECT_FALSE(st.timed_out);
    EXPECT_EQ(st.code, kExitMismatch) << p->Log();
    EXPECT_NE(p->Log().find("node 0 runs --wire-dtype=off but node 1 runs --wire-dtype=bf16"),
              std::string::npos)
        << p->Log();
  }
}

// A daemon of another version that cuts buckets by another rule (node 1
// advertises rule 2 through the test hook) would pair unlike buckets: the
// job is refused when it forms, on every node alike, naming both nodes and
// both rules.
TEST(MultiNode, DaemonsThatCutBucketsDifferentlyAreRefusedWhenTheJobFormsNamingBothNodes) {
  ClusterOptions options;
  options.job_id = "bucket-rule-mismatch";
  options.flags = {"--timeout-s=30"};
  options.node_env = {{}, {{"GRADSYNC_TEST_ADVERTISE_BUCKET_RULE", "2"}}};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers({"--steps=3", "--batch=60"}, &outs);
  ASSERT_EQ(trainers.size(), 2u);
  for (Process& p : trainers) {
    const ExitStatus st = p.Wait(seconds(60));
    ASSERT_TRUE(st.exited) << st.ToString() << p.Log() << cluster.DaemonLogs();
    EXPECT_EQ(st.code, kExitMismatch) << p.Log() << cluster.DaemonLogs();
    EXPECT_NE(p.Log().find("the nodes' gradsyncd versions cut buckets differently: node 0 cuts "
                           "by bucket rule 1 but node 1 by bucket rule 2"),
              std::string::npos)
        << p.Log();
  }
  EXPECT_NE(cluster.node(1).process().Log().find(
                "event=test_hook_armed hook=GRADSYNC_TEST_ADVERTISE_BUCKET_RULE rule=\"2\""),
            std::string::npos)
      << cluster.DaemonLogs();
}

}  // namespace
}  // namespace gradsync::testing
