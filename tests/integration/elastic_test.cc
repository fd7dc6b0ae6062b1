// --min-nodes / --max-nodes on a running job of real daemons and trainers.
// Elastic membership (a range below or above --num-nodes) is refused at
// start (tests/daemon:gradsyncd_flags_test); the flags given equal to
// --num-nodes keep today's fixed job: node 2 of 3 x 2 trainers SIGKILLed
// (its daemon and its trainers) mid-backward or mid cross-node collective
// ends every survivor with GS_ERR_PEER_FAILED naming node_rank=2 within the
// timeout. Each case prints the time from the kill to the last survivor's
// error: the detection part of what an elastic re-formation would cost.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr int kTimeoutS = 5;
// A hang check, not a performance bound: the timeout, one more for the
// leader's abort to travel, and room for a loaded 2-core machine.
constexpr auto kErrorBound = seconds(2 * kTimeoutS + 20);
constexpr auto kStateBound = seconds(30);
constexpr int kNodes = 3, kLocal = 2, kVictimNode = 2;

enum class Stage { kBackward, kCollective };

ClusterOptions FixedJobSpelledOut() {
  ClusterOptions options;
  options.nodes = kNodes;
  options.local_size = kLocal;
  options.job_id = "elastic";
  options.token = "elastic-token";
  options.flags = {"--bucket-cap-mb=0.001",
                   "--first-bucket-cap-mb=0.0001",
                   absl::StrCat("--timeout-s=", kTimeoutS),
                   "--stall-threshold-s=1",
                   absl::StrCat("--min-nodes=", kNodes),
                   absl::StrCat("--max-nodes=", kNodes)};
  return options;
}

// The error a failed trainer printed (mlp_trainer's `error="..."`).
std::string TrainerError(const std::string& log) {
  const size_t at = log.find("error=\"");
  if (at == std::string::npos) return "(no error line)";
  const size_t start = at + 7;
  return log.substr(start, log.find("\"\n", start) - start);
}

// Where trainer (node, local) stops itself. Mid-backward: every trainer
// has marked one gradient. Mid-collective: node 2's trainers marked all,
// so its daemon waits in the cross-node collective for the others, which
// are mid-backward.
std::string PauseFor(Stage stage, int node) {
  if (stage == Stage::kBackward) return "backward";
  return node == kVictimNode ? "marked" : "backward";
}

void KillNodeTwoAndExpectPeerFailed(Stage stage) {
  Cluster cluster(FixedJobSpelledOut());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  struct Trainer {
    int node;
    std::string pause;
    Process process;
  };
  std::vector<Trainer> trainers;
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r) {
      const std::string pause = PauseFor(stage, n);
      trainers.push_back({n, pause,
                          StartTrainer(cluster.node(n), r,
                                       {"--steps=8", "--batch=60", "--pause-at=" + pause}, "")});
    }
  }
  for (Trainer& t : trainers) {
    ASSERT_TRUE(WaitForLog(t.process, "mlp_trainer: paused at " + t.pause, kStateBound) &&
                WaitStopped(t.process, kStateBound))
        << t.process.Log() << cluster.DaemonLogs();
  }
  if (stage == Stage::kCollective) {
    // Node 0 waits for its trainers, so node 2 (all marked) waits in the
    // collective: a daemon logs nothing when it enters one.
    ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=stall", kStateBound))
        << cluster.DaemonLogs();
  }
  const auto killed_at = std::chrono::steady_clock::now();
  cluster.node(kVictimNode).process().Signal(SIGKILL);
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) t.process.Signal(SIGKILL);
  }
  for (Trainer& t : trainers) {
    if (t.node != kVictimNode) t.process.Signal(SIGCONT);
  }
  double slowest_s = 0;
  for (Trainer& t : trainers) {
    if (t.node == kVictimNode) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    slowest_s = std::max(
        slowest_s,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
    const std::string log = t.process.Log();
    std::printf("elastic_fixed_job trainer on node %d: exit %d error=\"%s\"\n", t.node, st.code,
                TrainerError(log).c_str());
    EXPECT_FALSE(st.timed_out) << log << cluster.DaemonLogs();
    ASSERT_TRUE(st.exited) << st.ToString();
    EXPECT_EQ(st.code, kExitPeerFailed) << log << cluster.DaemonLogs();
    EXPECT_NE(TrainerError(log).find("node_rank=2"), std::string::npos)
        << "node " << t.node << ": " << TrainerError(log) << "\n"
        << cluster.DaemonLogs();
  }
  for (int n = 0; n < kNodes; ++n) {
    if (n == kVictimNode) continue;
    EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
  }
  std::printf("elastic_fixed_job %s: SIGKILL of node 2 to the last survivor's PEER_FAILED %.1f s\n",
              stage == Stage::kBackward ? "mid_backward" : "mid_collective", slowest_s);
}

TEST(FixedJob, NodeKilledMidBackwardFailsSurvivorsNamingIt) {
  KillNodeTwoAndExpectPeerFailed(Stage::kBackward);
}

TEST(FixedJob, NodeKilledMidCollectiveFailsSurvivorsNamingIt) {
  KillNodeTwoAndExpectPeerFailed(Stage::kCollective);
}

}  // namespace
}  // namespace gradsync::testing
