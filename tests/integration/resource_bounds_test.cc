// What a client can make the daemon hold is bounded, and running out does
// not leave it deaf: connections until the process has no descriptor left
// (then closed) and a flood of Attach calls during a running job — each
// against a real gradsyncd, real sockets and real trainers.
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "gradsync/v1/local.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kBound = seconds(60);

int OpenDescriptors(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n;
}

int Threads(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

int ConnectTcp(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int ConnectUnix(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Idle connections until accept fails with EMFILE, a
// trainer's connection meanwhile, then all of them closed. gRPC's own
// listener would never accept again (on either socket) while the daemon
// lived on; now both serve again: Control answers and a job trains.
TEST(ResourceBoundsTest, ListenersRecoverAfterRunningOutOfDescriptors) {
  Daemon daemon(1, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  const int port = daemon.ListenPort(seconds(10));
  ASSERT_GT(port, 0) << daemon.process().Log();
  const pid_t pid = daemon.process().pid();
  ASSERT_TRUE(GetStats(port).ok()) << daemon.process().Log();

  // Room for a few dozen connections past what the daemon holds now.
  const int baseline = OpenDescriptors(pid);
  ASSERT_GT(baseline, 0);
  const rlimit tight{static_cast<rlim_t>(baseline + 24), static_cast<rlim_t>(baseline + 24)};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &tight, nullptr), 0) << std::strerror(errno);

  std::vector<int> held;
  for (int i = 0; i < 64; ++i) {
    const int fd = ConnectTcp(port);
    if (fd >= 0) held.push_back(fd);
  }
  // The daemon took every descriptor it may have.
  EXPECT_TRUE(WaitUntil([&] { return OpenDescriptors(pid) >= baseline + 23; }, kBound))
      << "descriptors: " << OpenDescriptors(pid) << " of " << baseline + 24;
  // A trainer knocking on the unix socket now.
  const int trainer_knock = ConnectUnix(daemon.socket());
  EXPECT_GE(trainer_knock, 0);
  const int tcp_knock = ConnectTcp(port);
  EXPECT_GE(tcp_knock, 0);
  EXPECT_TRUE(WaitForLog(daemon.process(), "event=accept_out_of_fds", kBound))
      << daemon.process().Log();

  for (int fd : held) close(fd);
  if (trainer_knock >= 0) close(trainer_knock);
  if (tcp_knock >= 0) close(tcp_knock);
  EXPECT_TRUE(WaitUntil([&] { return OpenDescriptors(pid) <= baseline + 2; }, kBound))
      << "the daemon still holds " << OpenDescriptors(pid) << " descriptors";

  absl::StatusOr<v1::Stats> stats = GetStats(port);
  EXPECT_TRUE(stats.ok()) << stats.status() << "\n" << daemon.process().Log();
  ExpectTrains(daemon, 1, "after running out of descriptors");
  ASSERT_TRUE(daemon.process().Running());
}

// A trainer that arrives while the daemon has no descriptor left is turned
// away, and must be told that, not that the daemon "serves only its own
// user" (what a silently closed connection used to read as). Once the
// connections are released a trainer trains.
TEST(ResourceBoundsTest, TrainerTurnedAwayOutOfDescriptorsIsToldWhy) {
  Daemon daemon(1, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  const int port = daemon.ListenPort(seconds(10));
  ASSERT_GT(port, 0) << daemon.process().Log();
  const pid_t pid = daemon.process().pid();
  const int baseline = OpenDescriptors(pid);
  ASSERT_GT(baseline, 0);
  const rlimit tight{static_cast<rlim_t>(baseline + 24), static_cast<rlim_t>(baseline + 24)};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &tight, nullptr), 0) << std::strerror(errno);
  std::vector<int> held;
  // Descriptors come and go inside gRPC too: a trainer may find room and
  // be served, or (rarely) arrive when the acceptor lost its reserve
  // descriptor to another thread and can only leave it in the backlog
  // (TIMEOUT, its message pointing at the daemon's log). Top up and try
  // again until one is turned away; each one turned away must say why.
  bool turned_away = false;
  for (int attempt = 0; attempt < 10 && !turned_away; ++attempt) {
    for (int i = 0; i < (attempt == 0 ? 64 : 16); ++i) {
      const int fd = ConnectTcp(port);
      if (fd >= 0) held.push_back(fd);
    }
    ASSERT_TRUE(WaitForLog(daemon.process(), "event=accept_out_of_fds", kBound))
        << daemon.process().Log();
    // gRPC's own transient descriptors may have been counted when the
    // flood stopped: not full yet means the next attempt tops up.
    if (!WaitUntil([&] { return OpenDescriptors(pid) >= baseline + 24; }, seconds(5))) continue;
    Process trainer = StartTrainer(daemon, 0, {"--steps=1"}, "");
    const ExitStatus st = trainer.Wait(kBound);
    ASSERT_TRUE(st.exited) << st.ToString() << "\n" << trainer.Log();
    if (trainer.Log().find("gs_connect failed") == std::string::npos) continue;  // served
    if (st.code == kExitTimeout) {
      // Let the acceptor take a reserve back: release some connections.
      for (int i = 0; i < 8 && !held.empty(); ++i) {
        close(held.back());
        held.pop_back();
      }
      continue;
    }
    turned_away = true;
    EXPECT_EQ(st.code, kExitResourceExhausted) << trainer.Log();
    EXPECT_NE(
        trainer.Log().find(absl::StrCat("gradsyncd (pid ", pid, ") ran out of file descriptors")),
        std::string::npos)
        << trainer.Log();
    EXPECT_EQ(trainer.Log().find("serves only its own user"), std::string::npos) << trainer.Log();
  }
  EXPECT_TRUE(turned_away) << "no trainer was turned away\n" << daemon.process().Log();

  for (int fd : held) close(fd);
  EXPECT_TRUE(WaitUntil([&] { return OpenDescriptors(pid) <= baseline + 2; }, kBound))
      << "the daemon still holds " << OpenDescriptors(pid) << " descriptors";
  ExpectTrains(daemon, 1, "after a trainer was turned away for want of descriptors");
}

// A flood of Attach calls while a job runs. Each used to
// hold a server thread for up to 30 s; now one waits per local rank and the
// rest are turned away at once with RESOURCE_EXHAUSTED naming the rank,
// the daemon's threads stay bounded, and the running job keeps training.
TEST(ResourceBoundsTest, AttachFloodDuringAJobIsBoundedAndTheJobKeepsTraining) {
  constexpr int kLocal = 2, kCalls = 64;
  Daemon daemon(kLocal, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10)));
  const int port = daemon.ListenPort(seconds(10));
  ASSERT_GT(port, 0);
  std::vector<Process> trainers;
  for (int r = 0; r < kLocal; ++r) {
    trainers.push_back(StartTrainer(daemon, r, {"--steps=1000000", "--sleep-ms=5"}, ""));
  }
  ASSERT_TRUE(WaitForLog(daemon.process(), "event=job_running", kBound)) << daemon.process().Log();
  const pid_t pid = daemon.process().pid();
  const int threads_before = Threads(pid);

  auto channel = grpc::CreateChannel("unix:" + daemon.socket(), grpc::InsecureChannelCredentials());
  auto stub = v1::Local::NewStub(channel);
  absl::Mutex mu;
  int returned = 0;
  std::vector<grpc::Status> statuses(kCalls);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  for (int i = 0; i < kCalls; ++i) contexts.push_back(std::make_unique<grpc::ClientContext>());
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&, i] {
      v1::AttachRequest req;
      req.set_local_rank(i % kLocal);
      req.set_pid(getpid());
      req.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
      v1::AttachResponse resp;
      contexts[i]->set_deadline(std::chrono::system_clock::now() + seconds(60));
      statuses[i] = stub->Attach(contexts[i].get(), req, &resp);
      absl::MutexLock lock(&mu);
      ++returned;
    });
  }
  // All but one waiter per local rank are answered without waiting.
  {
    absl::MutexLock lock(&mu);
    auto answered = [&] { return returned >= kCalls - kLocal; };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&answered), absl::Seconds(30)))
        << returned << " of " << kCalls << " Attach calls answered";
  }
  const int threads_during = Threads(pid);
  int exhausted = 0, quota_refused = 0;
  {
    absl::MutexLock lock(&mu);
    for (const grpc::Status& st : statuses) {
      if (st.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) continue;
      ++exhausted;
      // Two bounds refuse a flood, both RESOURCE_EXHAUSTED: the daemon's one
      // waiter per local rank, and, when more calls arrive at once than the
      // Local server's thread quota (server_limits.h), gRPC's own refusal
      // before a handler runs. Which one a call meets depends on timing.
      if (st.error_message() == "Server Threadpool Exhausted") {
        ++quota_refused;
        continue;
      }
      EXPECT_NE(st.error_message().find("local rank"), std::string::npos) << st.error_message();
      EXPECT_NE(st.error_message().find("already has an Attach waiting"), std::string::npos)
          << st.error_message();
    }
  }
  // At most one call per local rank is left waiting (all of a rank's calls
  // may meet the thread quota, leaving none).
  EXPECT_GE(exhausted, kCalls - kLocal) << quota_refused << " refused by the thread quota";
  // One thread per waiter at most, not one per call.
  EXPECT_LT(threads_during, threads_before + kCalls / 2)
      << "threads before " << threads_before << ", during " << threads_during;

  // The job kept training through it.
  absl::StatusOr<v1::Stats> before = GetStats(port);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_TRUE(WaitUntil(
      [&] {
        absl::StatusOr<v1::Stats> now = GetStats(port);
        return now.ok() && now->iterations() > before->iterations();
      },
      kBound))
      << daemon.process().Log();
  for (Process& t : trainers) EXPECT_TRUE(t.Running()) << t.Log();
  for (auto& ctx : contexts) ctx->TryCancel();
  for (std::thread& t : callers) t.join();
  for (Process& t : trainers) EXPECT_TRUE(t.Kill().ok());
}

}  // namespace
}  // namespace gradsync::testing
