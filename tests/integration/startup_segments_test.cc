// What a gradsyncd's start does to /dev/shm, against the real binary: a
// start that fails (a busy socket or port, a bad file, a missing directory)
// leaves no segment of its own behind, and the start-up sweep removes only
// what a dead daemon of this user, in this pid namespace, left.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ipc/shared_segment.h"
#include "tests/integration/harness.h"
#include "tests/integration/other_user.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;

constexpr auto kBound = seconds(30);

// A port something else listens on (the fd keeps it busy).
struct BusyPort {
  int fd = -1;
  int port = 0;
  BusyPort() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 1) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
  }
  ~BusyPort() { close(fd); }
};

struct FailedStart {
  ExitStatus status;
  std::string log;
  std::vector<std::string> left;  // segments of its prefix after it exited
};

// Runs gradsyncd with `args` (which must make its start fail) on a prefix
// of its own and reports how it ended and what it left in /dev/shm.
FailedStart RunFailingStart(const ScratchDir& dir, const std::string& socket,
                            const std::vector<std::string>& args) {
  const std::string prefix = UniquePrefix("failstart");
  std::vector<std::string> argv = {Runfile("daemon/gradsyncd"), "--socket=" + socket,
                                   "--shm-prefix=" + prefix, "--local-size=1"};
  argv.insert(argv.end(), args.begin(), args.end());
  Process daemon = Process::Spawn(argv, dir.File(prefix + ".log"));
  FailedStart r;
  r.status = daemon.Wait(kBound);
  r.log = daemon.Log();
  r.left = SegmentsWithPrefix(prefix + ".");
  SegmentCleanup cleanup;
  for (const std::string& name : r.left) cleanup.Add(name);
  return r;
}

void ExpectFailedCleanly(const FailedStart& r, const std::string& culprit) {
  EXPECT_TRUE(r.status.exited) << r.status.ToString() << "\n" << r.log;
  EXPECT_EQ(r.status.code, 1) << r.log;
  EXPECT_THAT(r.log, HasSubstr("event=start_failed"));
  EXPECT_THAT(r.log, HasSubstr(culprit));
  EXPECT_THAT(r.left, ::testing::IsEmpty()) << "left in /dev/shm after: " << culprit << "\n"
                                            << r.log;
}

TEST(StartupSegmentsTest, EveryFailedStartLeavesNoSegmentBehind) {
  ScratchDir dir("gsfail");
  const std::string socket = dir.File("gradsyncd.sock");

  {
    SCOPED_TRACE("the socket is served by another daemon");
    Daemon running(1);
    ASSERT_TRUE(running.WaitReady(kBound)) << running.process().Log();
    ExpectFailedCleanly(RunFailingStart(dir, running.socket(), {"--listen="}),
                        "another gradsyncd is already listening on " + running.socket());
  }
  {
    SCOPED_TRACE("--listen's port is taken");
    BusyPort busy;
    ASSERT_GT(busy.port, 0);
    const std::string listen = absl::StrCat("127.0.0.1:", busy.port);
    ExpectFailedCleanly(RunFailingStart(dir, socket, {"--listen=" + listen}),
                        "cannot listen on --listen " + listen);
  }
  {
    SCOPED_TRACE("--metrics-listen's port is taken");
    BusyPort busy;
    ASSERT_GT(busy.port, 0);
    ExpectFailedCleanly(
        RunFailingStart(dir, socket,
                        {"--listen=", absl::StrCat("--metrics-listen=127.0.0.1:", busy.port)}),
        absl::StrCat("127.0.0.1:", busy.port));
  }
  {
    SCOPED_TRACE("--trace-file cannot be written");
    const std::string trace = dir.File("missing/trace.json");
    ExpectFailedCleanly(RunFailingStart(dir, socket, {"--listen=", "--trace-file=" + trace}),
                        trace);
  }
  {
    SCOPED_TRACE("--tls-cert cannot be read");
    const std::string cert = dir.File("missing-cert.pem");
    ExpectFailedCleanly(RunFailingStart(dir, socket,
                                        {"--listen=127.0.0.1:0", "--tls-cert=" + cert,
                                         "--tls-key=" + dir.File("missing-key.pem")}),
                        cert);
  }
  {
    SCOPED_TRACE("the socket's directory does not exist");
    const std::string missing = dir.File("missing/gradsyncd.sock");
    ExpectFailedCleanly(RunFailingStart(dir, missing, {"--listen="}), missing);
  }
}

// A pid that is certainly dead here: a child we started and reaped.
pid_t DeadPid() {
  auto child = Process::Fork([] { return 0; });
  if (!child.ok()) return -1;
  const pid_t pid = child->pid();
  child->Wait(kBound);
  return pid;
}

// Root's daemon used to remove every "<prefix>.<dead pid>.*" it saw: another
// user's daemon's segments included, and those of a daemon in another pid
// namespace (a container), whose pid is dead only from here.
TEST(StartupSegmentsTest, SweepKeepsOtherUsersAndOtherPidNamespacesSegments) {
  if (const std::string why = OtherUser::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  const std::string prefix = UniquePrefix("sweep");
  SegmentCleanup cleanup;
  const pid_t dead = DeadPid();
  ASSERT_GT(dead, 0);
  ASSERT_NE(ipc::OwnPidNamespace(), 0u);
  // What a SIGKILLed daemon of ours left: the sweep's job.
  const std::string own_stale = cleanup.Add(ipc::SegmentName(prefix, dead, "node1.0a"));
  // Recorded by a daemon in another pid namespace under a pid dead here.
  const std::string other_namespace =
      cleanup.Add(absl::StrCat(prefix, ".", dead, ".node1.0b.pidns", ipc::OwnPidNamespace() + 1));
  const std::string other_user = cleanup.Add(ipc::SegmentName(prefix, dead, "node1.0c"));
  for (const std::string& name : {own_stale, other_namespace}) {
    ASSERT_TRUE(ipc::SharedSegment::Create(name, 4096).ok()) << name;
  }
  auto creator = Process::Fork([&]() -> int {
    if (setgid(OtherUser::kUid) != 0 || setuid(OtherUser::kUid) != 0) return 2;
    return ipc::SharedSegment::Create(other_user, 4096).ok() ? 0 : 3;
  });
  ASSERT_TRUE(creator.ok()) << creator.status();
  ASSERT_EQ(creator->Wait(kBound).code, 0);

  ScratchDir dir("gssweep");
  Process daemon = Process::Spawn({Runfile("daemon/gradsyncd"), "--socket=" + dir.File("d.sock"),
                                   "--listen=", "--shm-prefix=" + prefix, "--local-size=1"},
                                  dir.File("daemon.log"));
  ASSERT_TRUE(WaitForSocket(daemon, dir.File("d.sock"), kBound)) << daemon.Log();
  // The sweep ran before the socket listened.
  EXPECT_FALSE(SegmentExists(own_stale)) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("event=stale_segment_removed name=" + own_stale));
  EXPECT_TRUE(SegmentExists(other_user)) << "another user's segment was removed\n" << daemon.Log();
  EXPECT_TRUE(SegmentExists(other_namespace)) << "a segment of another pid namespace was removed\n"
                                              << daemon.Log();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(kBound).code, 0) << daemon.Log();
}

// The record is the daemon's own: one started in a fresh pid namespace
// (as a container's would be) names its segments with that namespace, not
// ours, so the sweep above keeps them.
TEST(StartupSegmentsTest, ADaemonInAnotherPidNamespaceRecordsThatNamespace) {
  if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0) {
    GTEST_SKIP() << "needs root and /usr/bin/unshare for a new pid namespace";
  }
  const std::string prefix = UniquePrefix("pidns");
  ScratchDir dir("gspidns");
  Process daemon = Process::Spawn(
      {"/usr/bin/unshare", "--pid", "--kill-child=SIGTERM", Runfile("daemon/gradsyncd"),
       "--socket=" + dir.File("d.sock"), "--listen=", "--shm-prefix=" + prefix, "--local-size=1"},
      dir.File("daemon.log"));
  ASSERT_TRUE(WaitForSocket(daemon, dir.File("d.sock"), kBound)) << daemon.Log();
  const std::vector<std::string> node = SegmentsWithPrefix(prefix + ".");
  ASSERT_EQ(node.size(), 1u) << daemon.Log();
  // Its pid there is 1 (it is the namespace's first process).
  EXPECT_THAT(node[0], ::testing::StartsWith(prefix + ".1.node1."));
  const size_t tag = node[0].rfind(".pidns");
  ASSERT_NE(tag, std::string::npos) << node[0];
  EXPECT_NE(node[0].substr(tag), absl::StrCat(".pidns", ipc::OwnPidNamespace())) << node[0];
  // unshare waits for its child, the daemon (its pid here is unshare's
  // only child): stop the daemon, whose clean stop removes its segment.
  const std::string children =
      ReadFile(absl::StrCat("/proc/", daemon.pid(), "/task/", daemon.pid(), "/children"));
  const pid_t inner = std::atoi(children.c_str());
  ASSERT_GT(inner, 0) << "unshare's children: '" << children << "'";
  ASSERT_EQ(kill(inner, SIGTERM), 0);
  EXPECT_TRUE(daemon.Wait(kBound).exited) << daemon.Log();
  WaitUntil([&] { return SegmentsWithPrefix(prefix + ".").empty(); }, kBound);
  SegmentCleanup cleanup;
  for (const std::string& name : SegmentsWithPrefix(prefix + ".")) cleanup.Add(name);
  EXPECT_THAT(SegmentsWithPrefix(prefix + "."), ::testing::IsEmpty()) << daemon.Log();
}

}  // namespace
}  // namespace gradsync::testing
