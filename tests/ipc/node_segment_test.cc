// NodeSegment: the daemon's node-wide segment opens in a trainer process,
// a wrong magic, version, size or mode is refused clearly, and the daemon's
// Check notices a damaged header, an unlinked name or a replaced object.
#include "ipc/node_segment.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/process.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::Process;
using gradsync::testing::SegmentCleanup;
using gradsync::testing::UniqueSegmentName;
using ::testing::HasSubstr;

class NodeSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = cleanup_.Add(UniqueSegmentName("node"));
    auto seg = NodeSegment::Create(name_, getpid());
    ASSERT_TRUE(seg.ok()) << seg.status();
    daemon_ = std::move(*seg);
  }

  SegmentCleanup cleanup_;
  std::string name_;
  NodeSegment daemon_;
};

TEST_F(NodeSegmentTest, TrainerProcessOpensIt) {
  daemon_.header()->heartbeat.store(77);
  auto child = Process::Fork([name = name_, pid = getpid()]() -> int {
    auto seg = NodeSegment::Open(name);
    if (!seg.ok()) return 1;
    if (seg->header()->daemon_pid != pid) return 2;
    if (seg->header()->heartbeat.load() != 77) return 3;
    seg->ready_bell().Ring();
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto code = child->Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_EQ(daemon_.ready_bell().Sequence(), 1u);
  struct stat st;
  ASSERT_EQ(stat(absl::StrCat("/dev/shm/", name_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(NodeSegmentTest, WrongMagicIsDataLoss) {
  daemon_.header()->magic = 0x5473636e79736447ull;  // a trainer segment's magic
  const absl::Status st = NodeSegment::Open(name_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("bad magic"));
}

TEST_F(NodeSegmentTest, WrongVersionIsFailedPrecondition) {
  daemon_.header()->layout_version = kNodeSegmentVersion + 1;
  const absl::Status st = NodeSegment::Open(name_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("layout version ", kNodeSegmentVersion + 1)));
}

TEST_F(NodeSegmentTest, WrongHeaderSizeIsFailedPrecondition) {
  daemon_.header()->header_bytes += 8;
  EXPECT_EQ(NodeSegment::Open(name_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(NodeSegmentTest, WorldWritableIsRefused) {
  ASSERT_EQ(chmod(absl::StrCat("/dev/shm/", name_).c_str(), 0666), 0);
  const absl::Status st = NodeSegment::Open(name_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
}

// The daemon's own check before each job (Daemon recreates on any error).
TEST_F(NodeSegmentTest, CheckOfAnIntactSegmentIsOk) { EXPECT_TRUE(daemon_.Check().ok()); }

TEST_F(NodeSegmentTest, CheckAfterTheMagicWasOverwrittenIsDataLossNamingIt) {
  daemon_.header()->magic = 0x6167726162616765ull;
  const absl::Status st = daemon_.Check();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("node segment ", name_, " has bad magic")));
}

TEST_F(NodeSegmentTest, CheckAfterTheVersionChangedIsDataLoss) {
  daemon_.header()->layout_version = kNodeSegmentVersion + 1;
  EXPECT_EQ(daemon_.Check().code(), absl::StatusCode::kDataLoss);
}

TEST_F(NodeSegmentTest, CheckAfterTheNameWasUnlinkedIsNotFound) {
  ASSERT_TRUE(SharedSegment::Remove(name_).ok());
  const absl::Status st = daemon_.Check();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("no longer names the daemon's segment: it was unlinked"));
  EXPECT_FALSE(daemon_.StillNamed());
}

TEST_F(NodeSegmentTest, CheckAfterAnotherObjectTookTheNameIsFailedPrecondition) {
  ASSERT_TRUE(SharedSegment::Remove(name_).ok());
  auto impostor = NodeSegment::Create(name_, getpid());
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  const absl::Status st = daemon_.Check();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("another object took the name"));
  EXPECT_TRUE(impostor->Check().ok());
}

TEST(NodeSegmentOpenTest, TooSmallIsDataLoss) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("small"));
  ASSERT_TRUE(SharedSegment::Create(name, 8).ok());
  EXPECT_EQ(NodeSegment::Open(name).status().code(), absl::StatusCode::kDataLoss);
}

TEST(NodeSegmentOpenTest, MissingIsNotFound) {
  EXPECT_EQ(NodeSegment::Open(UniqueSegmentName("missing")).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace gradsync::ipc
