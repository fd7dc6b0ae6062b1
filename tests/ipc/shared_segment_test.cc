// SharedSegment: exact modes whatever the umask, refusal of segments that
// are too open, clear errors for missing or empty segments, and removal of
// segments left behind by dead daemons (RemoveStaleSegments).
#include "ipc/shared_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/random_segment_name.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/process.h"
#include "tests/testing/small_shm.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::Process;
using gradsync::testing::SegmentCleanup;
using gradsync::testing::SegmentExists;
using gradsync::testing::UniquePrefix;
using gradsync::testing::UniqueSegmentName;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::UnorderedElementsAre;

constexpr auto kChildTimeout = std::chrono::seconds(30);
// A user other than the test's (no passwd entry needed).
constexpr uid_t kOtherUid = 48611;

struct stat StatSegment(const std::string& name) {
  struct stat st;
  std::memset(&st, 0, sizeof(st));
  EXPECT_EQ(stat(absl::StrCat("/dev/shm/", name).c_str(), &st), 0) << name;
  return st;
}

// Sets the umask for one scope: it is process-wide state.
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(umask(mask)) {}
  ~ScopedUmask() { umask(old_); }

 private:
  mode_t old_;
};

TEST(SharedSegmentTest, CreateMapsZeroedMemoryOfTheRequestedSize) {
  SegmentCleanup cleanup;
  auto seg = SharedSegment::Create(cleanup.Add(UniqueSegmentName("create")), 10000);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_TRUE(seg->valid());
  EXPECT_EQ(seg->size(), 10000u);
  const auto* bytes = static_cast<const uint8_t*>(seg->data());
  EXPECT_TRUE(std::all_of(bytes, bytes + seg->size(), [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(StatSegment(seg->name()).st_size, 10000);
}

TEST(SharedSegmentTest, ModeIsExactRegardlessOfUmask) {
  struct Case {
    mode_t umask, mode;
  };
  for (const Case c : {Case{0077, 0600}, Case{0077, 0660}, Case{0, 0600}, Case{0022, 0600},
                       Case{0027, 0660}, Case{0777, 0600}}) {
    SegmentCleanup cleanup;
    const std::string name = cleanup.Add(UniqueSegmentName("mode"));
    {
      ScopedUmask mask(c.umask);
      auto seg = SharedSegment::Create(name, 4096, c.mode);
      ASSERT_TRUE(seg.ok()) << seg.status();
    }
    EXPECT_EQ(StatSegment(name).st_mode & 07777, c.mode)
        << std::oct << "umask " << c.umask << " mode " << c.mode;
  }
}

TEST(SharedSegmentTest, DefaultModeIs0600) {
  SegmentCleanup cleanup;
  ScopedUmask mask(0);
  auto seg = SharedSegment::Create(cleanup.Add(UniqueSegmentName("default")), 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ(StatSegment(seg->name()).st_mode & 07777, 0600u);
}

TEST(SharedSegmentTest, GroupIsSet) {
  SegmentCleanup cleanup;
  const gid_t group = 65534;  // nogroup: we run as root, so any gid is allowed
  auto seg = SharedSegment::Create(cleanup.Add(UniqueSegmentName("group")), 4096, 0660, group);
  ASSERT_TRUE(seg.ok()) << seg.status();
  const struct stat st = StatSegment(seg->name());
  EXPECT_EQ(st.st_gid, group);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
}

TEST(SharedSegmentTest, BothMappingsSeeTheSameBytes) {
  SegmentCleanup cleanup;
  auto created = SharedSegment::Create(cleanup.Add(UniqueSegmentName("same")), 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  auto opened = SharedSegment::Open(created->name());
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_NE(created->data(), opened->data());
  static_cast<char*>(created->data())[100] = 'x';
  EXPECT_EQ(static_cast<const char*>(opened->data())[100], 'x');
  EXPECT_EQ(opened->size(), 4096u);
}

TEST(SharedSegmentTest, CreatingAnExistingNameFailsAndLeavesItIntact) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("exists"));
  auto first = SharedSegment::Create(name, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  static_cast<char*>(first->data())[0] = 42;

  auto second = SharedSegment::Create(name, 8192);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  // The failed Create must not have removed the owner's segment.
  ASSERT_TRUE(SegmentExists(name));
  auto reopened = SharedSegment::Open(name);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(reopened->size(), 4096u);
  EXPECT_EQ(static_cast<const char*>(reopened->data())[0], 42);
}

TEST(SharedSegmentTest, BadNamesAreInvalidArguments) {
  EXPECT_EQ(SharedSegment::Create("", 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedSegment::Create("a/b", 4096).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedSegment::Open("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedSegment::Open("a/b").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SharedSegmentTest, OpenMissingIsNotFound) {
  const std::string name = UniqueSegmentName("missing");
  auto seg = SharedSegment::Open(name);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kNotFound) << seg.status();
  EXPECT_THAT(seg.status().message(), HasSubstr(name));
}

TEST(SharedSegmentTest, RemoveMissingIsNotFound) {
  EXPECT_EQ(SharedSegment::Remove(UniqueSegmentName("missing")).code(),
            absl::StatusCode::kNotFound);
}

TEST(SharedSegmentTest, RemoveKeepsExistingMappingsValid) {
  SegmentCleanup cleanup;
  auto seg = SharedSegment::Create(cleanup.Add(UniqueSegmentName("remove")), 4096);
  ASSERT_TRUE(seg.ok()) << seg.status();
  ASSERT_TRUE(SharedSegment::Remove(seg->name()).ok());
  EXPECT_FALSE(SegmentExists(seg->name()));
  static_cast<char*>(seg->data())[4095] = 1;  // still mapped
  EXPECT_EQ(SharedSegment::Open(seg->name()).status().code(), absl::StatusCode::kNotFound);
}

TEST(SharedSegmentTest, EmptySegmentIsRefused) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("empty"));
  // Another program's empty object under our name (Create always sizes).
  const std::string path = absl::StrCat("/dev/shm/", name);
  const int fd = open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  close(fd);
  auto seg = SharedSegment::Open(name);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kFailedPrecondition) << seg.status();
  EXPECT_THAT(seg.status().message(), HasSubstr("empty"));
}

// We run as root, so the OS would let us open anything: Open must compare
// the mode against max_mode itself.
TEST(SharedSegmentTest, WorldWritableSegmentIsRefused) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("open"));
  ASSERT_TRUE(SharedSegment::Create(name, 4096).ok());
  ASSERT_EQ(chmod(absl::StrCat("/dev/shm/", name).c_str(), 0666), 0);
  auto seg = SharedSegment::Open(name);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kPermissionDenied) << seg.status();
  EXPECT_THAT(seg.status().message(), HasSubstr("0666"));
  EXPECT_THAT(seg.status().message(), HasSubstr(name));
}

TEST(SharedSegmentTest, OpenComparesModeWithMaxMode) {
  struct Case {
    mode_t mode, max_mode;
    bool ok;
  };
  for (const Case c : {Case{0600, 0600, true}, Case{0600, 0660, true}, Case{0660, 0660, true},
                       Case{0400, 0600, true}, Case{0660, 0600, false}, Case{0604, 0660, false},
                       Case{0602, 0660, false}, Case{0640, 0600, false}, Case{0700, 0600, false},
                       Case{0666, 0660, false}}) {
    SegmentCleanup cleanup;
    const std::string name = cleanup.Add(UniqueSegmentName("maxmode"));
    ASSERT_TRUE(SharedSegment::Create(name, 4096, 0600).ok());
    ASSERT_EQ(chmod(absl::StrCat("/dev/shm/", name).c_str(), c.mode), 0);
    auto seg = SharedSegment::Open(name, c.max_mode);
    if (c.ok) {
      EXPECT_TRUE(seg.ok()) << std::oct << c.mode << " vs " << c.max_mode << ": " << seg.status();
    } else {
      EXPECT_EQ(seg.status().code(), absl::StatusCode::kPermissionDenied)
          << std::oct << c.mode << " vs " << c.max_mode << ": " << seg.status();
    }
  }
}

// Another user (a child that dropped root) is refused by the OS; the
// error is PermissionDenied, not a crash or an opaque internal error.
TEST(SharedSegmentTest, OtherUserIsRefused) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("user"));
  ASSERT_TRUE(SharedSegment::Create(name, 4096, 0600).ok());
  constexpr int kCannotDropRoot = 77;
  auto child = Process::Fork([&]() -> int {
    if (setgid(65534) != 0 || setuid(65534) != 0) return kCannotDropRoot;
    auto seg = SharedSegment::Open(name);
    if (seg.ok()) return 1;
    if (seg.status().code() != absl::StatusCode::kPermissionDenied) {
      fprintf(stderr, "child: %s\n", seg.status().ToString().c_str());
      return 2;
    }
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto code = child->Wait(kChildTimeout).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  if (*code == kCannotDropRoot) GTEST_SKIP() << "cannot drop root here";
  EXPECT_EQ(*code, 0);
}

// A segment gets its pages when it is created: on a /dev/shm too small for
// it, Create fails naming the segment, what it needs and what is free —
// instead of handing out a sparse mapping whose first write past the free
// space kills the writer (SIGBUS). Runs in a child with a private 8 MiB
// /dev/shm.
TEST(SharedSegmentTest, CreateOnAFullDevShmSaysWhatItNeedsInsteadOfAMappingThatFaults) {
  if (const std::string why = gradsync::testing::SmallShmUnavailableReason(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  constexpr size_t kShm = 8u << 20, kTooBig = 12u << 20, kFits = 3u << 20;
  auto child = Process::Fork([&]() -> int {
    if (absl::Status st = gradsync::testing::MountSmallShm(kShm); !st.ok()) {
      fprintf(stderr, "child: %s\n", st.ToString().c_str());
      return 10;
    }
    // The first fits and holds its pages: the second no longer does.
    auto first = SharedSegment::Create("gs-full.first", kFits);
    if (!first.ok()) {
      fprintf(stderr, "child: first: %s\n", first.status().ToString().c_str());
      return 11;
    }
    auto second = SharedSegment::Create("gs-full.second", kTooBig);
    if (second.ok()) {
      // Today's sparse segment: touching every page is what kills the writer.
      std::memset(second->data(), 1, second->size());
      return 12;
    }
    fprintf(stderr, "child: %s\n", second.status().ToString().c_str());
    if (second.status().code() != absl::StatusCode::kResourceExhausted) return 13;
    const std::string msg(second.status().message());
    if (msg.find(absl::StrCat("segment gs-full.second needs ", kTooBig, " bytes, /dev/shm has ")) ==
            std::string::npos ||
        msg.find(" bytes free") == std::string::npos) {
      return 14;
    }
    // Nothing of the refused segment is left behind.
    if (access("/dev/shm/gs-full.second", F_OK) == 0) return 15;
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  const gradsync::testing::ExitStatus st = child->Wait(kChildTimeout);
  EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << child->Log();
}

// A segment another user made (a child that dropped root) at a name a
// trainer is given: root must refuse it too, group-shared mode or not,
// unless it names that user as the owner it expects (the daemon it verified).
TEST(SharedSegmentTest, RootRefusesASegmentOfAnotherUserUnlessItIsTheExpectedOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: a child becomes uid " << kOtherUid;
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("planted"));
  auto child = Process::Fork([&]() -> int {
    if (setgid(kOtherUid) != 0 || setuid(kOtherUid) != 0) return 77;
    return SharedSegment::Create(name, 4096, 0660).ok() ? 0 : 1;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_EQ(child->Wait(kChildTimeout).code, 0);
  ASSERT_EQ(StatSegment(name).st_uid, kOtherUid);

  auto refused = SharedSegment::Open(name);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat(name, " belongs to uid ", kOtherUid, ", not to uid 0")));
  auto wrong_owner = SharedSegment::Open(name, 0660, kOtherUid + 1);
  EXPECT_EQ(wrong_owner.status().code(), absl::StatusCode::kPermissionDenied);
  auto expected = SharedSegment::Open(name, 0660, kOtherUid);
  EXPECT_TRUE(expected.ok()) << expected.status();
}

TEST(SegmentNameTest, FollowsPrefixPidSuffixPidNamespace) {
  EXPECT_EQ(SegmentName("gradsync", 1234, "t0"),
            absl::StrCat("gradsync.1234.t0.pidns", OwnPidNamespace()));
}

// Unguessable, with prefix and pid first and the pid namespace last
// (RemoveStaleSegments reads both).
TEST(SegmentNameTest, RandomNamesKeepPrefixAndPidFirstAndNeverRepeat) {
  std::set<std::string> names;
  ASSERT_NE(OwnPidNamespace(), 0u);
  const std::string pidns = absl::StrCat("pidns", OwnPidNamespace());
  for (int i = 0; i < 1000; ++i) {
    const std::string name = RandomSegmentName("gradsync", 1234, "j1.r0");
    EXPECT_THAT(name, MatchesRegex("gradsync\\.1234\\.j1\\.r0\\.[0-9a-f]{16}\\." + pidns)) << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), 1000u);
}

// Someone planted the first name tried: the next random one is used.
TEST(SegmentNameTest, CreateUnderRandomNameSkipsAPlantedName) {
  SegmentCleanup cleanup;
  const std::string prefix = UniquePrefix("plant");
  std::vector<std::string> tried;
  auto seg =
      CreateUnderRandomName<SharedSegment>(prefix, getpid(), "t0", [&](const std::string& name) {
        tried.push_back(cleanup.Add(name));
        if (tried.size() == 1) {
          EXPECT_TRUE(SharedSegment::Create(name, 4096).ok());  // the plant
        }
        return SharedSegment::Create(name, 4096);
      });
  ASSERT_TRUE(seg.ok()) << seg.status();
  ASSERT_EQ(tried.size(), 2u);
  EXPECT_EQ(seg->name(), tried[1]);
  EXPECT_NE(tried[0], tried[1]);
}

// Every name taken: a bounded number of tries, then ALREADY_EXISTS saying so.
TEST(SegmentNameTest, CreateUnderRandomNameGivesUpAfterBoundedAttempts) {
  SegmentCleanup cleanup;
  const std::string prefix = UniquePrefix("plant");
  int tries = 0;
  auto seg =
      CreateUnderRandomName<SharedSegment>(prefix, getpid(), "t0", [&](const std::string& name) {
        ++tries;
        EXPECT_TRUE(SharedSegment::Create(cleanup.Add(name), 4096).ok());  // the plant
        return SharedSegment::Create(name, 4096);
      });
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(seg.status().message(), HasSubstr("8 random segment names were all taken"));
  EXPECT_EQ(tries, kRandomNameAttempts);
}

// A pid that is certainly dead: a child we started and reaped.
pid_t DeadPid() {
  auto child = Process::Fork([] { return 0; });
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return -1;
  const pid_t pid = child->pid();
  EXPECT_TRUE(child->Wait(kChildTimeout).ExitCode().ok());
  return pid;
}

TEST(RemoveStaleSegmentsTest, RemovesDeadPidsAndKeepsLiveOnes) {
  const std::string prefix = UniquePrefix("stale");
  SegmentCleanup cleanup;
  const pid_t dead = DeadPid();
  ASSERT_GT(dead, 0);
  // A live daemon that is not us: a sleeping child.
  auto live = Process::Fork([] {
    pause();
    return 0;
  });
  ASSERT_TRUE(live.ok()) << live.status();

  const std::string dead_a = cleanup.Add(SegmentName(prefix, dead, "node"));
  const std::string dead_b = cleanup.Add(SegmentName(prefix, dead, "t0"));
  const std::string ours = cleanup.Add(SegmentName(prefix, getpid(), "t0"));
  const std::string live_child = cleanup.Add(SegmentName(prefix, live->pid(), "t1"));
  const std::string not_a_pid = cleanup.Add(absl::StrCat(prefix, ".daemon.t0"));
  const std::string no_suffix = cleanup.Add(absl::StrCat(prefix, ".", dead));
  const std::string other_prefix = cleanup.Add(SegmentName(prefix + "x", dead, "t0"));
  for (const std::string& name :
       {dead_a, dead_b, ours, live_child, not_a_pid, no_suffix, other_prefix}) {
    ASSERT_TRUE(SharedSegment::Create(name, 4096).ok()) << name;
  }

  EXPECT_THAT(RemoveStaleSegments(prefix), UnorderedElementsAre(dead_a, dead_b));
  EXPECT_FALSE(SegmentExists(dead_a));
  EXPECT_FALSE(SegmentExists(dead_b));
  for (const std::string& name : {ours, live_child, not_a_pid, no_suffix, other_prefix}) {
    EXPECT_TRUE(SegmentExists(name)) << name << " was removed";
  }
  // Idempotent: nothing stale is left.
  EXPECT_THAT(RemoveStaleSegments(prefix), ::testing::IsEmpty());

  // Once the live daemon dies, its segment becomes stale too.
  ASSERT_TRUE(live->Kill().ok());
  EXPECT_THAT(RemoveStaleSegments(prefix), UnorderedElementsAre(live_child));
  EXPECT_TRUE(SegmentExists(ours));
}

// A daemon killed with SIGKILL stays a zombie until its launcher reaps it;
// it maps nothing any more, so its segments are stale already.
TEST(RemoveStaleSegmentsTest, ZombieCountsAsDead) {
  const std::string prefix = UniquePrefix("zombie");
  SegmentCleanup cleanup;
  auto child = Process::Fork([] { return 0; });
  ASSERT_TRUE(child.ok()) << child.status();
  // Wait for the exit without reaping (WNOWAIT): the child stays a zombie.
  siginfo_t info;
  std::memset(&info, 0, sizeof(info));
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child->pid()), &info, WEXITED | WNOWAIT), 0);
  ASSERT_EQ(kill(child->pid(), 0), 0) << "a zombie still answers kill(pid, 0)";
  const std::string name = cleanup.Add(SegmentName(prefix, child->pid(), "t0"));
  ASSERT_TRUE(SharedSegment::Create(name, 4096).ok());
  EXPECT_THAT(RemoveStaleSegments(prefix), UnorderedElementsAre(name));
  EXPECT_FALSE(SegmentExists(name));
}

// A pid says nothing about a segment this process may not judge: another
// user's (root could unlink it, and it may be that user's live daemon),
// one recorded in another pid namespace (a container's daemon, alive under
// a pid that is dead here) or one that records no namespace. Only our own,
// recorded here, with a dead pid goes.
TEST(RemoveStaleSegmentsTest, KeepsOtherUsersAndOtherPidNamespacesSegments) {
  if (geteuid() != 0) GTEST_SKIP() << "creating another user's segment needs root";
  const std::string prefix = UniquePrefix("foreign");
  SegmentCleanup cleanup;
  const pid_t dead = DeadPid();
  ASSERT_GT(dead, 0);
  ASSERT_NE(OwnPidNamespace(), 0u);
  const std::string own_stale = cleanup.Add(SegmentName(prefix, dead, "node1.a"));
  const std::string other_user = cleanup.Add(SegmentName(prefix, dead, "node1.b"));
  const std::string other_namespace =
      cleanup.Add(absl::StrCat(prefix, ".", dead, ".node1.c.pidns", OwnPidNamespace() + 1));
  const std::string unrecorded = cleanup.Add(absl::StrCat(prefix, ".", dead, ".node1.d"));
  for (const std::string& name : {own_stale, other_namespace, unrecorded}) {
    ASSERT_TRUE(SharedSegment::Create(name, 4096).ok()) << name;
  }
  constexpr uid_t kOtherUid = 48611;
  auto creator = Process::Fork([&]() -> int {
    if (setgid(kOtherUid) != 0 || setuid(kOtherUid) != 0) return 2;
    return SharedSegment::Create(other_user, 4096).ok() ? 0 : 3;
  });
  ASSERT_TRUE(creator.ok()) << creator.status();
  ASSERT_EQ(creator->Wait(kChildTimeout).code, 0);

  EXPECT_THAT(RemoveStaleSegments(prefix), UnorderedElementsAre(own_stale));
  EXPECT_FALSE(SegmentExists(own_stale));
  for (const std::string& name : {other_user, other_namespace, unrecorded}) {
    EXPECT_TRUE(SegmentExists(name)) << name << " was removed";
  }
}

}  // namespace
}  // namespace gradsync::ipc
