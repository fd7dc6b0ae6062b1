// Who is the straggler, with real daemons, real trainer processes and the
// real gradsyncctl: one trainer sleeps 20 ms inside every backward
// (tests/testing/fault_trainer --sleep-ms=20) and `gradsyncctl stragglers` names
// it, and only it, after 20 iterations — on one node of 3 trainers, and
// across 2 nodes of 1 trainer each (where no node has a local peer to
// compare with: only the nodes' exchange can tell). A balanced job names
// nobody; the log and the timeline mark the straggler. No timing threshold is asserted: the delayed
// trainer must be the one the daemon names and the one last most often; the balanced job must name
// nobody under the daemon's own verdict.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(120);
constexpr int kSteps = 20;
const std::string kDelay = "--sleep-ms=20";

std::vector<std::string> TrainArgs(bool delayed) {
  std::vector<std::string> args = {absl::StrCat("--steps=", kSteps), "--batch=60"};
  if (delayed) args.push_back(kDelay);
  return args;
}

struct CtlResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs the real gradsyncctl with `args`.
CtlResult RunCtl(const std::vector<std::string>& args, const std::string& scratch) {
  static int counter = 0;
  const std::string base = absl::StrCat(scratch, "/ctl.", counter++);
  SpawnOptions options;
  options.err_path = base + ".err";
  options.unset_env.push_back("GRADSYNC_ADDR");
  std::vector<std::string> argv = {Runfile("tools/gradsyncctl/gradsyncctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  Process ctl = Process::Spawn(argv, base + ".out", options);
  CtlResult r;
  if (!ctl.started()) return r;
  const ExitStatus st = ctl.Wait(seconds(60));
  r.exit_code = st.exited ? st.code : 128 + st.code;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  return r;
}

std::string Addr(int port) { return absl::StrCat("127.0.0.1:", port); }

// `gradsyncctl stragglers --json` over every daemon of the job.
nlohmann::json Stragglers(const std::vector<int>& ports, const std::string& scratch) {
  std::vector<std::string> args = {"--addr=" + Addr(ports[0]), "stragglers", "--json"};
  for (size_t i = 1; i < ports.size(); ++i) args.push_back(Addr(ports[i]));
  const CtlResult r = RunCtl(args, scratch);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  return j;
}

void WaitAllExitZero(std::vector<Process>& trainers, const std::string& logs) {
  for (Process& p : trainers) {
    const ExitStatus st = p.Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << p.Log() << logs;
  }
}

// The ranks the daemons named, and the rank last most often (-1 on a tie).
struct Named {
  std::vector<int> stragglers;
  int most_often_last = -1;
  size_t rows = 0;
};

Named Read(const nlohmann::json& j) {
  Named n;
  double best = -1;
  for (const nlohmann::json& t : j["trainers"]) {
    ++n.rows;
    const int rank = t["rank"].get<int>();
    if (t["straggler"].get<bool>()) n.stragglers.push_back(rank);
    const double share = t["share_last"].get<double>();
    if (share > best) {
      best = share;
      n.most_often_last = rank;
    } else if (share == best) {
      n.most_often_last = -1;
    }
  }
  return n;
}

TEST(StragglerOneNodeTest, TheTrainerSleepingInEveryBackwardIsNamedWithin20Iterations) {
  ScratchDir scratch;
  const std::string timeline = scratch.File("timeline.json");
  Daemon daemon(3, {"--timeout-s=60", "--trace-file=" + timeline});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  const int port = daemon.ListenPort(seconds(10));
  ASSERT_NE(port, 0) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 3; ++r) trainers.push_back(StartTrainer(daemon, r, TrainArgs(r == 2), ""));
  WaitAllExitZero(trainers, daemon.process().Log());

  const nlohmann::json j = Stragglers({port}, daemon.dir());
  const Named named = Read(j);
  ASSERT_EQ(named.rows, 3u) << j.dump(2);
  EXPECT_EQ(named.stragglers, std::vector<int>{2}) << j.dump(2);
  EXPECT_EQ(named.most_often_last, 2) << j.dump(2);
  for (const nlohmann::json& t : j["trainers"]) {
    EXPECT_EQ(t["node_rank"].get<int>(), 0);
    EXPECT_EQ(t["scope"].get<std::string>(), "node clock");
    EXPECT_GE(t["window_iterations"].get<int>(), 10) << j.dump(2);
    if (t["rank"].get<int>() == 2) {
      EXPECT_EQ(t["pid"].get<std::string>(), absl::StrCat(trainers[2].pid())) << j.dump(2);
    }
  }
  // The tables name it too, and /metrics' text marks it.
  const CtlResult table = RunCtl({"--addr=" + Addr(port), "stragglers"}, daemon.dir());
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("straggler: rank 2\n"), std::string::npos) << table.out;
  const CtlResult stats = RunCtl({"--addr=" + Addr(port), "stats"}, daemon.dir());
  EXPECT_NE(stats.out.find(absl::StrCat("STRAGGLER rank 2 (node 0, pid ", trainers[2].pid(), ")")),
            std::string::npos)
      << stats.out;
  const CtlResult prom = RunCtl({"--addr=" + Addr(port), "stats", "--prometheus"}, daemon.dir());
  EXPECT_NE(prom.out.find("gradsync_trainer_straggler{node=\"0\",job=\"default\",rank=\"2\","
                          "local_rank=\"2\"} 1"),
            std::string::npos)
      << prom.out;
  EXPECT_NE(prom.out.find("gradsync_trainer_lateness_seconds_bucket{"), std::string::npos);
  // And the log says so, and the whole-run timeline marks it on rank 2's track.
  EXPECT_NE(daemon.process().Log().find("event=straggler "), std::string::npos);
  daemon.Stop();
  const nlohmann::json trace = nlohmann::json::parse(ReadFile(timeline), nullptr, false);
  ASSERT_TRUE(trace.is_array()) << ReadFile(timeline).substr(0, 500);
  int markers = 0;
  for (const nlohmann::json& e : trace) {
    if (e.value("name", "") != "straggler") continue;
    ++markers;
    EXPECT_EQ(e["args"]["rank"], 2) << e.dump();
  }
  EXPECT_EQ(markers, 1);
}

TEST(StragglerOneNodeTest, ABalancedJobNamesNobody) {
  Daemon daemon(3, {"--timeout-s=60"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  const int port = daemon.ListenPort(seconds(10));
  ASSERT_NE(port, 0) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 3; ++r) trainers.push_back(StartTrainer(daemon, r, TrainArgs(false), ""));
  WaitAllExitZero(trainers, daemon.process().Log());

  const nlohmann::json j = Stragglers({port}, daemon.dir());
  const Named named = Read(j);
  ASSERT_EQ(named.rows, 3u) << j.dump(2);
  EXPECT_TRUE(named.stragglers.empty()) << j.dump(2);
  EXPECT_EQ(daemon.process().Log().find("event=straggler "), std::string::npos);
  const CtlResult table = RunCtl({"--addr=" + Addr(port), "stragglers"}, daemon.dir());
  EXPECT_NE(table.out.find("no straggler\n"), std::string::npos) << table.out;
}

// 2 nodes x 1 trainer: each node alone sees no lateness at all; only the
// per-iteration exchange between the nodes can name node 1's trainer.
void RunTwoNodes(bool delayed, Named* named, nlohmann::json* j) {
  ClusterOptions options;
  options.nodes = 2;
  options.local_size = 1;
  options.flags = {"--timeout-s=60"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const int port1 = cluster.node(1).ListenPort(seconds(10));
  ASSERT_NE(port1, 0) << cluster.DaemonLogs();
  std::vector<Process> trainers;
  trainers.push_back(StartTrainer(cluster.node(0), 0, TrainArgs(false), ""));
  trainers.push_back(StartTrainer(cluster.node(1), 0, TrainArgs(delayed), ""));
  WaitAllExitZero(trainers, cluster.DaemonLogs());
  *j = Stragglers({cluster.port(), port1}, cluster.dir());
  *named = Read(*j);
  for (const nlohmann::json& t : (*j)["trainers"]) {
    EXPECT_EQ(t["scope"].get<std::string>(), "job") << j->dump(2);
    EXPECT_EQ(t["node_rank"].get<int>(), t["rank"].get<int>()) << j->dump(2);
  }
  const bool logged = cluster.node(1).process().Log().find("event=straggler ") != std::string::npos;
  EXPECT_EQ(logged, delayed) << cluster.DaemonLogs();
}

TEST(StragglerTwoNodesTest, TheDelayedTrainerOfNode1IsNamedWithin20Iterations) {
  Named named;
  nlohmann::json j;
  RunTwoNodes(/*delayed=*/true, &named, &j);
  ASSERT_EQ(named.rows, 2u) << j.dump(2);
  EXPECT_EQ(named.stragglers, std::vector<int>{1}) << j.dump(2);
  EXPECT_EQ(named.most_often_last, 1) << j.dump(2);
  // Alone on its node, it is late for a bucket against node 0's trainer.
  for (const nlohmann::json& t : j["trainers"]) {
    if (t["rank"].get<int>() == 1) {
      EXPECT_GE(t["usual_bucket"].get<int>(), 0) << j.dump(2);
    }
  }
}

TEST(StragglerTwoNodesTest, ABalancedJobNamesNobody) {
  Named named;
  nlohmann::json j;
  RunTwoNodes(/*delayed=*/false, &named, &j);
  ASSERT_EQ(named.rows, 2u) << j.dump(2);
  EXPECT_TRUE(named.stragglers.empty()) << j.dump(2);
}

// An elastic job of 3 nodes x 1 trainer loses node 2 in iteration 2 (its
// trainer paused mid-backward, then it and its daemon SIGKILLed): the
// survivors re-form and train 28 more iterations, over which the exchange
// must go on, among the new generation's members, to name node 1's
// delayed trainer (figures from before the death are too few to name
// anyone: kMinVerdictIterations).
TEST(StragglerElasticTest, AfterAReformationTheDelayedTrainerOfNode1IsStillNamed) {
  ClusterOptions options;
  options.nodes = 3;
  options.local_size = 1;
  options.flags = {"--timeout-s=60", "--min-nodes=2", "--max-nodes=3"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const int port1 = cluster.node(1).ListenPort(seconds(10));
  ASSERT_NE(port1, 0) << cluster.DaemonLogs();
  std::vector<std::string> args = {"--steps=30", "--batch=60"};
  std::vector<Process> trainers;
  trainers.push_back(StartTrainer(cluster.node(0), 0, args, ""));
  args.push_back(kDelay);
  trainers.push_back(StartTrainer(cluster.node(1), 0, args, ""));
  args.back() = "--pause-at=backward";
  Process victim = StartTrainer(cluster.node(2), 0, args, "");
  ASSERT_TRUE(WaitForLog(victim, "mlp_trainer: paused at backward", kBound) &&
              WaitStopped(victim, kBound))
      << victim.Log() << cluster.DaemonLogs();
  cluster.node(2).process().Signal(SIGKILL);
  victim.Signal(SIGKILL);
  WaitAllExitZero(trainers, cluster.DaemonLogs());
  for (int n : {0, 1}) {
    ASSERT_NE(cluster.node(n).process().Log().find("event=job_reformed"), std::string::npos)
        << cluster.DaemonLogs();
  }
  const nlohmann::json j = Stragglers({cluster.port(), port1}, cluster.dir());
  const Named named = Read(j);
  ASSERT_EQ(named.rows, 2u) << j.dump(2);
  EXPECT_EQ(named.stragglers, std::vector<int>{1}) << j.dump(2);
  EXPECT_EQ(named.most_often_last, 1) << j.dump(2);
  for (const nlohmann::json& t : j["trainers"]) {
    EXPECT_EQ(t["scope"].get<std::string>(), "job") << j.dump(2);
    EXPECT_EQ(t["node_rank"].get<int>(), t["rank"].get<int>()) << j.dump(2);
    EXPECT_GE(t["window_iterations"].get<int>(), 10) << j.dump(2);
  }
}

}  // namespace
}  // namespace gradsync::testing
