// The fault matrix: SIGKILL or SIGSTOP of a trainer, of the
// leader daemon or of a non-leader daemon, at attach, register,
// mid-backward, during the local reduction and during the cross-node
// collective, in a 2-node x 2-trainer job of real daemons and trainers.
// Each case reaches its stage deterministically (trainers stop themselves
// there with --pause-at; the test waits for that state in /proc and in the
// logs), faults the victim, then checks that every surviving trainer ends
// with the documented code naming the culprit within the timeout, that
// surviving daemons live, that the next job on them trains exactly like one
// process, and that nothing is left in /dev/shm after shutdown. Each case
// prints one row of the summary table (the closing note).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The daemons' --timeout-s: a stopped peer must turn into an error by then.
constexpr int kTimeoutS = 5;
// A hang check, not a performance bound: the timeout, plus one more for the
// leader's abort to travel, plus room for a loaded 2-core CI machine.
constexpr auto kErrorBound = seconds(2 * kTimeoutS + 20);
constexpr auto kStateBound = seconds(30);
constexpr int kNodes = 2, kLocal = 2;

enum class Victim { kTrainer, kLeader, kNonLeader };
enum class Stage { kAttach, kRegister, kBackward, kReduction, kCollective };

struct Case {
  Victim victim;
  int signal;
  Stage stage;
};

std::string VictimName(Victim v) {
  switch (v) {
    case Victim::kTrainer:
      return "trainer";
    case Victim::kLeader:
      return "leader_daemon";
    case Victim::kNonLeader:
      return "nonleader_daemon";
  }
  return "?";
}

std::string StageName(Stage s) {
  switch (s) {
    case Stage::kAttach:
      return "attach";
    case Stage::kRegister:
      return "register";
    case Stage::kBackward:
      return "mid_backward";
    case Stage::kReduction:
      return "local_reduction";
    case Stage::kCollective:
      return "cross_node_collective";
  }
  return "?";
}

// "trainer_SIGKILL_mid_backward": the case's test name, and how gtest prints
// it when one fails (it prints a parameter it does not know as raw bytes).
std::string CaseName(const Case& c) {
  return absl::StrCat(VictimName(c.victim), "_", c.signal == SIGKILL ? "SIGKILL" : "SIGSTOP", "_",
                      StageName(c.stage));
}

void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

// The faulted trainer: node 1's local rank 1 (global rank 3).
constexpr int kVictimNode = 1, kVictimLocal = 1;

int VictimDaemonNode(Victim v) { return v == Victim::kLeader ? 0 : 1; }

// Where trainer (node, local) stops itself (mlp_trainer --pause-at), "" for
// nowhere. The daemon under test then sits in the stage: at "reduction" one
// of its trainers has marked everything and the other is mid-backward, so
// it waits in the local reduction; at "collective" both of its trainers
// have marked everything and the other node's are mid-backward, so it
// waits in the cross-node collective.
std::string PauseFor(const Case& c, int node, int local) {
  const bool victim_trainer =
      c.victim == Victim::kTrainer && node == kVictimNode && local == kVictimLocal;
  const int faulted_node = c.victim == Victim::kTrainer ? kVictimNode : VictimDaemonNode(c.victim);
  switch (c.stage) {
    case Stage::kAttach:
      return c.victim != Victim::kTrainer || victim_trainer ? "attach" : "";
    case Stage::kRegister:
      return c.victim != Victim::kTrainer || victim_trainer ? "register" : "";
    case Stage::kBackward:
      return c.victim != Victim::kTrainer || victim_trainer ? "backward" : "";
    case Stage::kReduction:
      if (node != faulted_node) return c.victim == Victim::kTrainer ? "" : "marked";
      return local == kVictimLocal ? "marked" : "backward";
    case Stage::kCollective:
      return node == faulted_node ? "marked" : "backward";
  }
  return "";
}

// Waits until `p` said it paused and is stopped.
bool WaitPaused(Process& p, const std::string& stage, milliseconds timeout) {
  return WaitForLog(p, "mlp_trainer: paused at " + stage, timeout) && WaitStopped(p, timeout);
}

// The error a failed trainer printed (mlp_trainer's `error="..."`).
std::string TrainerError(const std::string& log) {
  const size_t at = log.find("error=\"");
  if (at == std::string::npos) return "(no error line)";
  const size_t start = at + 7;
  return log.substr(start, log.find("\"\n", start) - start);
}

std::string CodeName(int code) {
  if (code == kExitPeerFailed) return "PEER_FAILED";
  if (code == kExitTimeout) return "TIMEOUT";
  if (code == kExitUnavailable) return "UNAVAILABLE";
  return absl::StrCat("exit ", code);
}

// Each node's shm prefix, kept across its restarts so that the new daemon
// removes what the dead one left in /dev/shm.
std::vector<std::string> NodePrefixes() {
  std::vector<std::string> out;
  for (int n = 0; n < kNodes; ++n) {
    out.push_back(absl::StrCat("gsfm", getpid(), "n", n, "r", rand() % 100000));
  }
  return out;
}

// Two daemons on loopback forming one job. A faulted node restarts with its
// rank and shm prefix (the leader also with its port: Cluster keeps it).
ClusterOptions MatrixJob(const std::vector<std::string>& prefixes) {
  ClusterOptions options;
  options.nodes = kNodes;
  options.local_size = kLocal;
  options.job_id = "matrix";
  options.token = "matrix-token";
  options.flags = {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001",
                   absl::StrCat("--timeout-s=", kTimeoutS), "--stall-threshold-s=1"};
  // Last one wins over the Daemon's own --shm-prefix.
  for (const std::string& prefix : prefixes) {
    options.node_flags.push_back({"--shm-prefix=" + prefix});
  }
  return options;
}

// What a surviving trainer on `node` may find in its error to have been told
// who failed (any one of them); `victim_daemon_pid` is the faulted daemon's.
std::vector<std::string> Culprits(const Case& c, int node, pid_t victim_daemon_pid,
                                  const std::string& victim_daemon_socket) {
  if (c.victim == Victim::kTrainer) return {"rank 3", "local 1", "missing local ranks 1"};
  if (node == VictimDaemonNode(c.victim)) {  // its own daemon, by pid or socket
    return {absl::StrCat("gradsyncd (pid ", victim_daemon_pid, ")"),
            "gradsyncd at " + victim_daemon_socket};
  }
  return {c.victim == Victim::kLeader ? "the leader daemon" : "node_rank=1"};
}

// The code every survivor must end with. A kill is noticed as a death
// (PEER_FAILED), except before the job formed, where the other node only
// sees that this one never joined: the leader's Join timeout (TIMEOUT)
// names the missing node and what it reported (the local ranks it waits
// for), and a dead leader is a Join that times out naming the leader. A
// trainer whose own daemon was killed is told the daemon died. A stop is
// silence: TIMEOUT where a wait runs out first, PEER_FAILED where the
// leader's heartbeat view gives up on the stopped member first; both are
// the documented contract.
bool ExpectedCode(const Case& c, int node, int code) {
  if (c.signal == SIGKILL) {
    if (c.stage == Stage::kAttach &&
        (c.victim == Victim::kTrainer || node != VictimDaemonNode(c.victim))) {
      return code == kExitTimeout;
    }
    return code == kExitPeerFailed;
  }
  return code == kExitTimeout || code == kExitPeerFailed;
}

class FaultMatrixTest : public ::testing::TestWithParam<Case> {};

TEST_P(FaultMatrixTest, SurvivorsGetTheCulpritsErrorInTimeAndTheNextJobTrains) {
  const Case c = GetParam();
  const std::vector<std::string> prefixes = NodePrefixes();
  Cluster cluster(MatrixJob(prefixes));
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::string> fault_args = {"--steps=8", "--batch=64"};
  struct Trainer {
    int node, local;
    std::string pause;
    Process process;
  };
  std::vector<Trainer> trainers;
  for (int n = 0; n < kNodes; ++n) {
    for (int r = 0; r < kLocal; ++r) {
      std::vector<std::string> args = fault_args;
      const std::string pause = PauseFor(c, n, r);
      if (!pause.empty()) args.push_back("--pause-at=" + pause);
      trainers.push_back({n, r, pause, StartTrainer(cluster.node(n), r, args, "")});
    }
  }
  auto is_victim = [&](const Trainer& t) {
    return c.victim == Victim::kTrainer && t.node == kVictimNode && t.local == kVictimLocal;
  };
  // 1. Reach the stage.
  for (Trainer& t : trainers) {
    if (t.pause.empty()) continue;
    ASSERT_TRUE(WaitPaused(t.process, t.pause, kStateBound))
        << "trainer " << t.node << "." << t.local << " never paused at " << t.pause << "\n"
        << t.process.Log() << cluster.DaemonLogs();
  }
  const int faulted_node = c.victim == Victim::kTrainer ? kVictimNode : VictimDaemonNode(c.victim);
  if (c.stage == Stage::kReduction) {
    // The faulted node's daemon has taken in what it was given and waits
    // for its trainer that is mid-backward.
    ASSERT_TRUE(WaitForLog(cluster.node(faulted_node).process(), "event=stall", kStateBound))
        << cluster.DaemonLogs();
  } else if (c.stage == Stage::kCollective) {
    // The other node waits for its trainers (stalled for a second), so the
    // faulted node, all of whose gradients are marked, waits in the
    // collective: the daemon logs nothing when it enters one.
    ASSERT_TRUE(WaitForLog(cluster.node(1 - faulted_node).process(), "event=stall", kStateBound))
        << cluster.DaemonLogs();
  }
  // 2. The fault.
  Process* victim = nullptr;
  const pid_t victim_daemon_pid =
      c.victim == Victim::kTrainer ? 0 : cluster.node(faulted_node).process().pid();
  const std::string victim_daemon_socket =
      c.victim == Victim::kTrainer ? "" : cluster.node(faulted_node).socket();
  if (c.victim == Victim::kTrainer) {
    for (Trainer& t : trainers) {
      if (is_victim(t)) victim = &t.process;
    }
  } else {
    victim = &cluster.node(faulted_node).process();
  }
  const auto signalled_at = std::chrono::steady_clock::now();
  victim->Signal(c.signal);
  if (c.signal == SIGSTOP) {
    // kill() only makes the stop pending: until the victim's threads have
    // all stopped it keeps working, and with the paused trainers resumed
    // below a daemon could take its node through the rest of the job (the
    // iterations are tiny) before its stop takes effect. The fault is in
    // place once every thread of the victim is stopped.
    ASSERT_TRUE(WaitStopped(*victim, kStateBound))
        << VictimName(c.victim) << " (pid " << victim->pid() << ") never stopped after SIGSTOP\n"
        << cluster.DaemonLogs();
    std::printf(
        "fault_matrix_detail %s SIGSTOP took effect after %.1f ms\n", VictimName(c.victim).c_str(),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - signalled_at)
            .count());
  }
  const auto faulted_at = std::chrono::steady_clock::now();
  for (Trainer& t : trainers) {
    if (!is_victim(t) && !t.pause.empty()) t.process.Signal(SIGCONT);
  }
  // 3. Every surviving trainer ends with the documented error, in time.
  std::vector<std::string> saw;
  double slowest_s = 0;
  for (Trainer& t : trainers) {
    if (is_victim(t)) continue;
    const ExitStatus st = t.process.Wait(kErrorBound);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - faulted_at).count();
    slowest_s = std::max(slowest_s, took);
    const std::string log = t.process.Log();
    const std::string error = TrainerError(log);
    saw.push_back(absl::StrCat(t.node, ".", t.local, ":", CodeName(st.code)));
    std::printf("fault_matrix_detail %s %s %s trainer=%d.%d code=%s after_s=%.1f error=\"%s\"\n",
                VictimName(c.victim).c_str(), strsignal(c.signal), StageName(c.stage).c_str(),
                t.node, t.local, CodeName(st.code).c_str(), took, error.c_str());
    EXPECT_FALSE(st.timed_out) << "trainer " << t.node << "." << t.local << " hung\n"
                               << log << cluster.DaemonLogs();
    ASSERT_TRUE(st.exited) << st.ToString();
    EXPECT_TRUE(ExpectedCode(c, t.node, st.code)) << CodeName(st.code) << "\n"
                                                  << log << cluster.DaemonLogs();
    bool named = false;
    for (const std::string& culprit :
         Culprits(c, t.node, victim_daemon_pid, victim_daemon_socket)) {
      named = named || error.find(culprit) != std::string::npos;
    }
    if (!named) saw.back() += "(culprit not named)";
    EXPECT_TRUE(named) << "trainer " << t.node << "." << t.local << " was not told the culprit ("
                       << absl::StrJoin(
                              Culprits(c, t.node, victim_daemon_pid, victim_daemon_socket), " | ")
                       << "): " << error << "\n"
                       << cluster.DaemonLogs();
  }
  // 4. Survivors' daemons are alive; the victim goes for good.
  for (int n = 0; n < kNodes; ++n) {
    if (c.victim != Victim::kTrainer && n == faulted_node) continue;
    EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
  }
  ASSERT_TRUE(victim->Kill().ok());
  // 5. The next job: on the surviving daemons plus a restarted faulted one.
  if (c.victim != Victim::kTrainer) {
    ASSERT_TRUE(cluster.StartNode(faulted_node)) << cluster.DaemonLogs();
  }
  const std::vector<std::string> args = {"--steps=5", "--batch=64", "--fp64"};
  std::vector<std::string> outs;
  std::vector<Process> again = cluster.StartTrainers(args, &outs, "again");
  bool trained = true;
  for (Process& p : again) {
    const ExitStatus st = p.Wait(kStateBound * 2);
    trained = trained && st.exited && st.code == 0;
    EXPECT_TRUE(st.exited && st.code == 0) << p.Log() << cluster.DaemonLogs();
  }
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    const double diff = RelativeDifference(LoadWeights(out), expected);
    trained = trained && diff <= 1e-12;
    EXPECT_LE(diff, 1e-12) << out;
  }
  // 6. Nothing left in /dev/shm once the daemons stop.
  size_t left = 0;
  for (int n = 0; n < kNodes; ++n) {
    EXPECT_EQ(cluster.node(n).Stop().code, 0) << cluster.node(n).process().Log();
    const std::vector<std::string> segments = SegmentsWithPrefix(prefixes[n] + ".");
    left += segments.size();
    EXPECT_TRUE(segments.empty()) << "node " << n << " left " << absl::StrJoin(segments, " ");
  }
  std::printf(
      "fault_matrix_row | %s %s | %s | %s | %.1f s | daemons %s, next job %s, %zu segments left "
      "|\n",
      VictimName(c.victim).c_str(), c.signal == SIGKILL ? "SIGKILL" : "SIGSTOP",
      StageName(c.stage).c_str(), absl::StrJoin(saw, " ").c_str(), slowest_s,
      c.victim == Victim::kTrainer ? "alive" : "survivor alive, victim restarted",
      trained ? "trained exactly" : "FAILED", left);
}

std::vector<Case> AllCases() {
  std::vector<Case> out;
  for (Victim v : {Victim::kTrainer, Victim::kLeader, Victim::kNonLeader}) {
    for (int sig : {SIGKILL, SIGSTOP}) {
      for (Stage s : {Stage::kAttach, Stage::kRegister, Stage::kBackward, Stage::kReduction,
                      Stage::kCollective}) {
        out.push_back({v, sig, s});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Matrix, FaultMatrixTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return CaseName(i.param); });

}  // namespace
}  // namespace gradsync::testing
