// The worker zygote (daemon/backends/worker_zygote.h), with real daemons:
// a daemon of a job across nodes forks its Gloo workers from it, each worker
// is the daemon's own child (so the daemon reaps it and says how it died),
// and a zygote that is killed or stopped only costs the exec it saved: the
// job trains exactly as before, no hang.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);
const std::vector<std::string> kTraining = {"--steps=10", "--batch=60", "--fp64"};

ClusterOptions TwoNodes() {
  ClusterOptions options;
  options.job_id = "zygote";
  options.flags = {"--timeout-s=20"};
  return options;
}

// The pids of `parent`'s children whose name (/proc/PID/comm) is `comm`.
std::vector<pid_t> ChildrenNamed(pid_t parent, const std::string& comm) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::stringstream text;
    text << stat.rdbuf();
    const std::string line = text.str();
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    // After ") ": the state, then the parent's pid.
    int ppid = 0;
    std::string state;
    std::istringstream rest(line.substr(close + 2));
    rest >> state >> ppid;
    if (ppid == parent && line.substr(open + 1, close - open - 1) == comm) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

// The one child named `comm` of `parent`, once there is exactly one.
pid_t AwaitChild(pid_t parent, const std::string& comm) {
  pid_t child = 0;
  WaitUntil(
      [&] {
        const std::vector<pid_t> children = ChildrenNamed(parent, comm);
        child = children.size() == 1 ? children[0] : 0;
        return child != 0;
      },
      kBound);
  return child;
}

// The pid in the daemon's "event=gloo_worker_started ... generation=G ...
// pid=N" line (0 if absent).
pid_t StartedWorker(const Process& daemon, uint64_t generation) {
  const std::string log = daemon.Log();
  const std::string event = "event=gloo_worker_started ";
  for (size_t at = log.find(event); at != std::string::npos; at = log.find(event, at + 1)) {
    const std::string entry = log.substr(at, log.find('\n', at) - at);
    if (entry.find(absl::StrCat(" generation=", generation, " ")) == std::string::npos) continue;
    const size_t pid = entry.find(" pid=");
    int value = 0;
    if (pid != std::string::npos &&
        absl::SimpleAtoi(entry.substr(pid + 5, entry.find(' ', pid + 5) - pid - 5), &value)) {
      return value;
    }
  }
  return 0;
}

// Every daemon keeps a zygote and a spare worker forked from it, both its
// children; the job adopts the spare and trains exactly.
TEST(WorkerZygote, WorkersAreForkedFromTheZygoteAsTheirDaemonsChildren) {
  Cluster cluster(TwoNodes());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<pid_t> spares;
  for (int n = 0; n < 2; ++n) {
    const pid_t daemon = cluster.node(n).process().pid();
    EXPECT_GT(AwaitChild(daemon, "gradsync-zygote"), 0) << cluster.DaemonLogs();
    spares.push_back(AwaitChild(daemon, "gloo-worker"));
    ASSERT_GT(spares.back(), 0) << cluster.DaemonLogs();
    // A worker executed instead of forked would be named after its
    // executable, /proc/self/exe: "exe".
    EXPECT_TRUE(ChildrenNamed(daemon, "exe").empty());
  }
  ExpectTrainsLikeOneProcess(cluster, kTraining, kBound);
  for (int n = 0; n < 2; ++n) {
    const Process& daemon = cluster.node(n).process();
    EXPECT_EQ(StartedWorker(daemon, 1), spares[n]) << daemon.Log();
    EXPECT_EQ(daemon.Log().find("event=gloo_worker_zygote"), std::string::npos) << daemon.Log();
  }
}

// Node 1's zygote gets `zygote_signal` and its spare is killed before any
// trainer starts, so the job's worker must come another way; the job then
// trains like one process.
void TrainWithNode1sZygoteSignalled(Cluster& cluster, int zygote_signal) {
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const pid_t daemon = cluster.node(1).process().pid();
  const pid_t zygote = AwaitChild(daemon, "gradsync-zygote");
  const pid_t spare = AwaitChild(daemon, "gloo-worker");
  ASSERT_GT(zygote, 0) << cluster.DaemonLogs();
  ASSERT_GT(spare, 0) << cluster.DaemonLogs();
  ASSERT_EQ(kill(zygote, zygote_signal), 0);
  ASSERT_EQ(kill(spare, SIGKILL), 0);
  ExpectTrainsLikeOneProcess(cluster, kTraining, kBound);
}

// A killed zygote (and spare): the next worker is executed instead, and
// the daemon says why.
TEST(WorkerZygote, AKilledZygoteFallsBackToExecutingTheWorker) {
  Cluster cluster(TwoNodes());
  ASSERT_NO_FATAL_FAILURE(TrainWithNode1sZygoteSignalled(cluster, SIGKILL));
  const pid_t daemon = cluster.node(1).process().pid();
  const std::string log = cluster.node(1).process().Log();
  EXPECT_NE(log.find("event=gloo_worker_zygote_failed fallback=exec error=\"the worker zygote "
                     "exited\""),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(absl::StrCat("event=gloo_worker_started node_rank=1 generation=1 pid=",
                                  StartedWorker(cluster.node(1).process(), 1), " spare=false")),
            std::string::npos)
      << log;
  // Reaped, and not used again.
  EXPECT_TRUE(ChildrenNamed(daemon, "gradsync-zygote").empty()) << log;
}

// A stopped zygote never answers: after its reply timeout it is killed and
// reaped, the worker is executed instead, and the job trains. No hang.
TEST(WorkerZygote, AStoppedZygoteIsGivenUpAndTheJobTrains) {
  Cluster cluster(TwoNodes());
  ASSERT_NO_FATAL_FAILURE(TrainWithNode1sZygoteSignalled(cluster, SIGSTOP));
  const pid_t daemon = cluster.node(1).process().pid();
  const std::string log = cluster.node(1).process().Log();
  EXPECT_NE(log.find("event=gloo_worker_zygote_failed fallback=exec error=\"the worker zygote "
                     "did not answer within 5000 ms\""),
            std::string::npos)
      << log;
  EXPECT_TRUE(ChildrenNamed(daemon, "gradsync-zygote").empty()) << "the stopped zygote is left";
}

}  // namespace
}  // namespace gradsync::testing
