// The local trust boundary, with a real second Unix user
// (tests/integration/other_user.h) against real daemons and trainers:
// another user cannot attach to a daemon even when the socket file lets it
// connect, cannot pose as the daemon to a root trainer, cannot open the
// daemon's segments, and cannot block a job by planting segments at the
// names the daemon used to pick. Skipped, saying why, unless run as root.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "ipc/shared_segment.h"
#include "tests/integration/harness.h"
#include "tests/integration/other_user.h"
#include "tests/ipc/segment_names.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kBound = seconds(30);

class LocalTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = OtherUser::Unavailable(); !why.empty()) GTEST_SKIP() << why;
  }
};

// The socket file is opened to everyone (as a careless deployment might):
// the daemon's own check of the peer must still keep the other user out.
TEST_F(LocalTrustTest, AnotherUserCannotAttachAndTheDaemonKeepsServing) {
  OtherUser other;
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  ASSERT_EQ(chmod(daemon.dir().c_str(), 0755), 0);
  ASSERT_EQ(chmod(daemon.socket().c_str(), 0666), 0);

  SpawnOptions rank0;
  rank0.env = {{"LOCAL_RANK", "0"}};
  Process intruder = Process::Spawn(other.Argv({other.Share("tests/testing/fault_trainer"),
                                                "--socket=" + daemon.socket(), "--steps=1"}),
                                    daemon.dir() + "/intruder.log", rank0);
  const ExitStatus st = intruder.Wait(kBound);
  EXPECT_EQ(st.code, kExitUnavailable) << st.ToString() << "\n" << intruder.Log();
  EXPECT_THAT(intruder.Log(),
              HasSubstr("gradsyncd at " + daemon.socket() + " (uid 0 (root) pid " +
                        std::to_string(daemon.process().pid()) + ") dropped the connection"));
  EXPECT_TRUE(WaitForLog(
      daemon.process(),
      absl::StrCat("event=peer_refused uid=", OtherUser::kUid, " pid=", intruder.pid()), kBound))
      << daemon.process().Log();
  EXPECT_THAT(daemon.process().Log(), Not(HasSubstr("event=attach")));
  ASSERT_TRUE(daemon.process().Running()) << daemon.process().Log();
  ExpectTrains(daemon, 2, "after a refused user", kBound, {"--steps=3"});
}

// Another user runs a daemon (the real gradsyncd) on the socket a root
// trainer is pointed at: the trainer refuses it before attaching, naming
// the socket and who runs it; named in $GRADSYNC_DAEMON_UID, the same daemon
// is accepted and its segments (owned by that user) are mapped.
TEST_F(LocalTrustTest, RootTrainerRefusesADaemonOfAnotherUser) {
  OtherUser other;
  ScratchDir dir("gsfake");
  ASSERT_EQ(chown(dir.path().c_str(), OtherUser::kUid, OtherUser::kUid), 0);
  const std::string socket = dir.File("gradsyncd.sock");
  const std::string prefix = UniquePrefix("fake");
  Process fake = Process::Spawn(
      other.Argv({other.Share("daemon/gradsyncd"), "--socket=" + socket,
                  "--listen=", "--shm-prefix=" + prefix, "--local-size=1", "--timeout-s=20"}),
      TestTmpDir() + "/fake_daemon.log");
  ASSERT_TRUE(WaitForSocket(fake, socket, seconds(10))) << fake.Log();

  const std::string trainer_bin = Runfile("tests/testing/fault_trainer");
  Process fooled =
      Process::Spawn({trainer_bin, "--socket=" + socket, "--steps=3"}, dir.File("trainer.log"));
  EXPECT_EQ(fooled.Wait(kBound).code, kExitUnavailable) << fooled.Log();
  EXPECT_THAT(fooled.Log(), HasSubstr(absl::StrCat("refusing the daemon at ", socket,
                                                   ": it runs as uid ", OtherUser::kUid, " pid ",
                                                   fake.pid(), ", and this trainer (uid 0)")));
  EXPECT_THAT(fake.Log(), Not(HasSubstr("event=attach")));

  SpawnOptions trusting;
  trusting.env = {{"GRADSYNC_DAEMON_UID", std::to_string(OtherUser::kUid)}};
  Process told = Process::Spawn({trainer_bin, "--socket=" + socket, "--steps=3"},
                                dir.File("told.log"), trusting);
  const ExitStatus st = told.Wait(kBound);
  EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << told.Log() << fake.Log();
  fake.Signal(SIGTERM);
  EXPECT_EQ(fake.Wait(seconds(10)).code, 0) << fake.Log();
}

// The other user can neither open the daemon's node segment nor, by
// creating segments at the names the daemon used to derive from its pid and
// job number, keep a job from running.
TEST_F(LocalTrustTest, AnotherUserCanNeitherOpenNorPlantTheDaemonsSegments) {
  Daemon daemon(1, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  const std::string owned = absl::StrCat(daemon.shm_prefix(), ".", daemon.process().pid(), ".");
  const std::vector<std::string> node = SegmentsWithPrefix(owned + "node1.");
  ASSERT_EQ(node.size(), 1u) << "the daemon's node segment";
  SegmentCleanup cleanup;
  std::vector<std::string> planted;
  for (const char* old_name : {"j1.r0", "j2.r0", "node.2"}) {
    planted.push_back(cleanup.Add(owned + old_name));
  }

  constexpr int kOpened = 2, kCannotPlant = 3, kCannotDropRoot = 77;
  auto child = Process::Fork([&]() -> int {
    if (setgid(OtherUser::kUid) != 0 || setuid(OtherUser::kUid) != 0) return kCannotDropRoot;
    auto opened = ipc::SharedSegment::Open(node[0]);
    if (opened.ok() || opened.status().code() != absl::StatusCode::kPermissionDenied) {
      return kOpened;
    }
    for (const std::string& name : planted) {
      if (!ipc::SharedSegment::Create(name, 4096, 0666).ok()) return kCannotPlant;
    }
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(child->Wait(kBound).code, 0);
  for (const std::string& name : planted) {
    struct stat st;
    ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0) << name;
    ASSERT_EQ(st.st_uid, OtherUser::kUid) << name;
  }
  ExpectTrains(daemon, 1, "the first job, with its old segment names planted", kBound,
               {"--steps=3"});
  ExpectTrains(daemon, 1, "the second job", kBound, {"--steps=3"});
}

}  // namespace
}  // namespace gradsync::testing
