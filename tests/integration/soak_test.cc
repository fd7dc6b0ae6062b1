// Soak: a 3-node x 2-trainer job of real daemons trains segment
// after segment of 50 iterations; every segment starts with a bucket-cap
// change on the leader, and every second one a trainer is SIGKILLed
// mid-run (its peers must end with PEER_FAILED) and the next segment starts
// fresh trainers. Every segment that completes must equal one process
// training on the whole batch. Afterwards each daemon's open fds, threads
// (but gRPC's executor pool, bounded) and /dev/shm segments are exactly
// what they were after the first segment, and its RSS is within
// kRssSlackBytes of it.
//
// GRADSYNC_SOAK_ITERATIONS sets the total (default 300; the full
// run: 2000). Each daemon's before/after numbers are printed as
// `soak_resources` lines.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kNodes = 3, kLocal = 2;
constexpr int kSegmentSteps = 50;
constexpr auto kBound = seconds(120);  // a hang check, not a performance bound
// RSS may grow a little and stay (allocator caches, gRPC's per-thread
// caches). With glibc's arenas capped (daemon/malloc_arenas.h) 50 jobs grew
// it ~2.5 MiB over the first job; uncapped, ~15 MiB (0.3 MiB per job for
// ~30 jobs). A leak of one job's buffers per segment would pass this within
// a few segments, which is why fds, threads and segments are compared
// exactly.
constexpr long kRssSlackBytes = 4L << 20;
// gRPC's event-engine executor ("default-executor" threads) grows and
// shrinks its pool with load on its own schedule: counted apart from the
// daemon's other threads (compared exactly) and bounded, not compared.
// So does its timer manager ("grpc_global_timer" threads: seen 2 before
// and 3 after a soak).
constexpr long kExecutorPoolBound = 16;
bool IsGrpcPoolThread(const std::string& comm) {  // comm is 15 chars
  return comm == "default-executo" || comm == "grpc_global_tim";
}

int Iterations() {
  const char* env = std::getenv("GRADSYNC_SOAK_ITERATIONS");
  const int n = env && *env ? std::atoi(env) : 300;
  return std::max(n, 2 * kSegmentSteps);
}

struct Resources {
  long fds = 0, threads = 0, segments = 0, rss_bytes = 0;
  // Of rss_bytes: the heap and stacks, and mapped shared memory (segments).
  long rss_anon_bytes = 0, rss_shmem_bytes = 0;
  long executor_threads = 0;                // gRPC's pools, not in `threads`
  std::map<std::string, int> thread_names;  // /proc/PID/task/*/comm, for the report
  bool operator==(const Resources& o) const {
    return fds == o.fds && threads == o.threads && segments == o.segments;
  }
  std::string ToString() const {
    return absl::StrCat("fds=", fds, " threads=", threads,
                        " grpc_executor_threads=", executor_threads, " segments=", segments,
                        " rss_kib=", rss_bytes / 1024, " rss_anon_kib=", rss_anon_bytes / 1024,
                        " rss_shmem_kib=", rss_shmem_bytes / 1024);
  }
};

long CountEntries(const std::string& dir) {
  long n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

long StatusField(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atol(line.c_str() + field.size() + 1);
  }
  return -1;
}

Resources Measure(Daemon& d) {
  const pid_t pid = d.process().pid();
  Resources r;
  r.fds = CountEntries("/proc/" + std::to_string(pid) + "/fd");
  r.segments = static_cast<long>(SegmentsWithPrefix(d.shm_prefix()).size());
  r.rss_bytes = StatusField(pid, "VmRSS") * 1024;
  r.rss_anon_bytes = StatusField(pid, "RssAnon") * 1024;
  r.rss_shmem_bytes = StatusField(pid, "RssShmem") * 1024;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  if (DIR* d = opendir(tasks.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(tasks + "/" + e->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      ++r.thread_names[name];
      ++(IsGrpcPoolThread(name) ? r.executor_threads : r.threads);
    }
    closedir(d);
  }
  return r;
}

// Waits until `needle` occurs at least `count` times in the process's log.
bool WaitForLogCount(const Process& p, const std::string& needle, size_t count,
                     milliseconds timeout) {
  return WaitUntil(
      [&] {
        const std::string log = p.Log();
        size_t n = 0;
        for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) {
          ++n;
        }
        return n >= count;
      },
      timeout);
}

ClusterOptions SoakJob() {
  ClusterOptions options;
  options.nodes = kNodes;
  options.local_size = kLocal;
  options.job_id = "soak";
  options.token = "soak-token";
  options.flags = {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001", "--timeout-s=10"};
  return options;
}

TEST(Soak, RestartsAndConfigChangesLeakNothingAndEveryCompletedSegmentIsExact) {
  Cluster cluster(SoakJob());
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  const std::vector<std::string> args = {absl::StrCat("--steps=", kSegmentSteps), "--batch=48",
                                         "--fp64", "--quiet"};
  const std::vector<double> expected =
      SingleProcessReference(cluster.dir(), {args[0], args[1], args[2]});
  ASSERT_FALSE(expected.empty());
  const int segments = Iterations() / kSegmentSteps;
  std::vector<Resources> baseline(kNodes);
  int completed_iterations = 0, killed = 0, config_changes = 0;
  for (int s = 0; s < segments; ++s) {
    // Every second segment (not the first, which sets the baseline) loses
    // one trainer, on a node that rotates, at step 2 of the segment.
    const bool kill = s % 2 == 1;
    const int victim_node = (s / 2) % kNodes, victim_local = s % kLocal;
    // A config change on the leader between jobs: this segment's job plans
    // with it. (Mid-run changes: multinode_test's ConfigBursts and
    // ConfigChangeEarlyInAFastJob.)
    const bool big = s % 2 == 0;
    Process set = Process::Spawn(
        {Runfile("tools/gradsyncctl/gradsyncctl"),
         absl::StrCat("--addr=127.0.0.1:", cluster.port()), "--token-file=" + cluster.token_file(),
         "config", "set", big ? "bucket_cap_mb=0.002" : "bucket_cap_mb=0.001",
         big ? "first_bucket_cap_mb=0.0005" : "first_bucket_cap_mb=0.0001"},
        absl::StrCat(cluster.dir(), "/ctl", s, ".log"));
    ASSERT_EQ(set.Wait(kBound).code, 0) << set.Log();
    ++config_changes;
    std::vector<Process> trainers;
    std::vector<std::string> outs;
    for (int n = 0; n < kNodes; ++n) {
      for (int r = 0; r < kLocal; ++r) {
        std::vector<std::string> a = args;
        const bool victim = kill && n == victim_node && r == victim_local;
        if (victim) a.push_back("--pause-at=backward");
        outs.push_back(absl::StrCat(cluster.dir(), "/w", s, ".", n, ".", r, ".txt"));
        trainers.push_back(StartTrainer(cluster.node(n), r, a, victim ? "" : outs.back()));
      }
    }
    if (kill) {
      Process& victim = trainers[victim_node * kLocal + victim_local];
      ASSERT_TRUE(WaitStopped(victim, kBound)) << victim.Log();
      victim.Signal(SIGKILL);
      ++killed;
    }
    for (size_t i = 0; i < trainers.size(); ++i) {
      const bool victim = kill && static_cast<int>(i) == victim_node * kLocal + victim_local;
      const ExitStatus st = trainers[i].Wait(kBound);
      ASSERT_TRUE(st.exited || victim)
          << st.ToString() << trainers[i].Log() << cluster.DaemonLogs();
      if (victim) continue;
      if (kill) {
        EXPECT_EQ(st.code, kExitPeerFailed) << trainers[i].Log() << cluster.DaemonLogs();
        continue;
      }
      ASSERT_EQ(st.code, 0) << trainers[i].Log() << cluster.DaemonLogs();
      EXPECT_LE(RelativeDifference(LoadWeights(outs[i]), expected), 1e-12)
          << "segment " << s << " " << outs[i];
    }
    if (!kill) completed_iterations += kSegmentSteps;
    // Every daemon has released this segment's job (scheduler stopped,
    // generation left); it keeps the finished job until the next one.
    for (int n = 0; n < kNodes; ++n) {
      ASSERT_TRUE(WaitForLogCount(cluster.node(n).process(), "event=job_released", s + 1, kBound))
          << cluster.DaemonLogs();
    }
    // RSS after every job, to tell a leak (steady growth) from caching that
    // plateaus.
    for (int n = 0; n < kNodes; ++n) {
      const Resources r = Measure(cluster.node(n));
      std::printf("soak_rss segment=%d node=%d rss_kib=%ld rss_anon_kib=%ld rss_shmem_kib=%ld\n", s,
                  n, r.rss_bytes / 1024, r.rss_anon_bytes / 1024, r.rss_shmem_bytes / 1024);
    }
    // After the first job: what a daemon holds between jobs.
    if (s == 0) {
      for (int n = 0; n < kNodes; ++n) baseline[n] = Measure(cluster.node(n));
    }
  }
  for (int n = 0; n < kNodes; ++n) {
    const Resources now = Measure(cluster.node(n));
    std::string names_before, names_after;
    for (const auto& [name, count] : baseline[n].thread_names)
      absl::StrAppend(&names_before, name, "x", count, " ");
    for (const auto& [name, count] : now.thread_names)
      absl::StrAppend(&names_after, name, "x", count, " ");
    std::printf("soak_threads node=%d before={%s} after={%s}\n", n, names_before.c_str(),
                names_after.c_str());
    std::printf(
        "soak_resources node=%d iterations=%d completed=%d kills=%d config_changes=%d "
        "baseline{%s} after{%s}\n",
        n, segments * kSegmentSteps, completed_iterations, killed, config_changes,
        baseline[n].ToString().c_str(), now.ToString().c_str());
    EXPECT_EQ(now.fds, baseline[n].fds) << "node " << n;
    EXPECT_EQ(now.threads, baseline[n].threads) << "node " << n;
    EXPECT_EQ(now.segments, baseline[n].segments) << "node " << n;
    EXPECT_LE(now.executor_threads, kExecutorPoolBound) << "node " << n;
    EXPECT_LE(now.rss_bytes, baseline[n].rss_bytes + kRssSlackBytes) << "node " << n;
    EXPECT_TRUE(cluster.node(n).process().Running()) << cluster.DaemonLogs();
  }
}

}  // namespace
}  // namespace gradsync::testing
