// TrainerSegment: what the daemon creates the trainer can open and use, and
// a segment of another release, another layout, another program, too small
// or too open is refused with an error that says which.
#include "ipc/trainer_segment.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/arena.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/process.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::Process;
using gradsync::testing::SegmentCleanup;
using gradsync::testing::UniqueSegmentName;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kHash = 0x1234'5678'9abc'def0ull;
constexpr uint64_t kArenaBytes = 3 * 4096 + 100;

TrainerSegmentSpec Spec() {
  TrainerSegmentSpec spec;
  spec.layout_hash = kHash;
  spec.arena_bytes = kArenaBytes;
  spec.ring_capacity = 64;
  spec.local_rank = 2;
  spec.daemon_pid = getpid();
  return spec;
}

class TrainerSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = cleanup_.Add(UniqueSegmentName("trainer"));
    auto seg = TrainerSegment::Create(name_, Spec());
    ASSERT_TRUE(seg.ok()) << seg.status();
    daemon_ = std::move(*seg);
  }

  absl::Status OpenStatus() { return TrainerSegment::Open(name_, kHash, kArenaBytes).status(); }

  SegmentCleanup cleanup_;
  std::string name_;
  TrainerSegment daemon_;
};

TEST_F(TrainerSegmentTest, HeaderDescribesTheSpec) {
  const TrainerSegmentHeader* h = daemon_.header();
  EXPECT_EQ(h->magic, kTrainerSegmentMagic);
  EXPECT_EQ(h->layout_version, kTrainerSegmentVersion);
  EXPECT_EQ(h->layout_hash, kHash);
  EXPECT_EQ(h->arena_bytes, kArenaBytes);
  EXPECT_EQ(h->ready_capacity, 64u);
  EXPECT_EQ(h->completion_capacity, 64u);
  EXPECT_EQ(h->local_rank, 2);
  EXPECT_EQ(h->daemon_pid, getpid());
  EXPECT_EQ(daemon_.arena_bytes(), kArenaBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(daemon_.arena()) % kBucketAlignment, 0u);
  EXPECT_TRUE(daemon_.ValidateHeader().ok());
  EXPECT_EQ(daemon_.ErrorMessage(), "");
  struct stat st;
  ASSERT_EQ(stat(absl::StrCat("/dev/shm/", name_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_GE(static_cast<uint64_t>(st.st_size), h->arena_offset + kArenaBytes);
}

// The daemon and a trainer process share the rings and the arena.
TEST_F(TrainerSegmentTest, TrainerProcessSharesRingsAndArena) {
  auto child = Process::Fork([name = name_]() -> int {
    auto seg = TrainerSegment::Open(name, kHash, kArenaBytes);
    if (!seg.ok()) {
      fprintf(stderr, "child: %s\n", seg.status().ToString().c_str());
      return 1;
    }
    std::memset(seg->arena(), 0xab, kArenaBytes);  // gradients, zero copy
    for (uint64_t i = 0; i < 10; ++i) {
      ReadyEvent e{};
      e.tensor = static_cast<uint32_t>(i);
      e.kind = static_cast<uint32_t>(ReadyKind::kReady);
      e.sequence = i;
      if (!seg->ready_ring().TryPush(e)) return 2;
    }
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto code = child->Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0);
  for (uint64_t i = 0; i < 10; ++i) {
    ReadyEvent e;
    ASSERT_EQ(daemon_.ready_ring().TryPop(&e), PopResult::kOk);
    EXPECT_TRUE(ValidateReadyEvent(e, {10, 0, i}).ok());
    EXPECT_EQ(e.tensor, i);
  }
  EXPECT_EQ(daemon_.arena()[0], 0xab);
  EXPECT_EQ(daemon_.arena()[kArenaBytes - 1], 0xab);
}

TEST_F(TrainerSegmentTest, ErrorMessageReachesTheTrainer) {
  daemon_.SetError(5, "bucket 3 timed out on node 1");
  auto child = Process::Fork([name = name_]() -> int {
    auto seg = TrainerSegment::Open(name, kHash, kArenaBytes);
    if (!seg.ok()) return 1;
    if (seg->ErrorMessage() != "bucket 3 timed out on node 1") return 2;
    return seg->header()->error_code == 5 ? 0 : 3;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  auto code = child->Wait(std::chrono::seconds(30)).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST_F(TrainerSegmentTest, LongErrorMessageIsTruncated) {
  daemon_.SetError(7, std::string(5000, 'x'));
  EXPECT_EQ(daemon_.ErrorMessage(), std::string(kErrorMessageBytes - 1, 'x'));
}

TEST_F(TrainerSegmentTest, WrongVersionIsAClearError) {
  daemon_.header()->layout_version = kTrainerSegmentVersion + 1;
  const absl::Status st = OpenStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr(name_),
                    HasSubstr(absl::StrCat("layout version ", kTrainerSegmentVersion + 1)),
                    HasSubstr("different releases")));
  EXPECT_EQ(daemon_.ValidateHeader().code(), absl::StatusCode::kDataLoss);
}

TEST_F(TrainerSegmentTest, WrongMagicIsAClearError) {
  daemon_.header()->magic = 0x0123456789abcdefull;
  const absl::Status st = OpenStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), AllOf(HasSubstr("bad magic"), HasSubstr("123456789abcdef"),
                                  HasSubstr("not a gradsync trainer segment")));
}

TEST_F(TrainerSegmentTest, WrongLayoutHashIsAClearError) {
  const absl::Status st = TrainerSegment::Open(name_, kHash + 1, kArenaBytes).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(), HasSubstr("layout hash"));
}

TEST_F(TrainerSegmentTest, WrongArenaSizeIsAClearError) {
  const absl::Status st = TrainerSegment::Open(name_, kHash, kArenaBytes + 4).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("arena is ", kArenaBytes, " bytes")));
}

TEST_F(TrainerSegmentTest, TooOpenModeIsRefused) {
  ASSERT_EQ(chmod(absl::StrCat("/dev/shm/", name_).c_str(), 0666), 0);
  const absl::Status st = OpenStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_THAT(st.message(), HasSubstr("0666"));
}

TEST_F(TrainerSegmentTest, GroupModeIsAccepted) {
  ASSERT_EQ(chmod(absl::StrCat("/dev/shm/", name_).c_str(), 0660), 0);
  EXPECT_TRUE(OpenStatus().ok());
}

// A header that claims more bytes than the object has must be refused
// before anything beyond the end is touched (which would be SIGBUS).
TEST_F(TrainerSegmentTest, TruncatedSegmentIsRefused) {
  ASSERT_EQ(truncate(absl::StrCat("/dev/shm/", name_).c_str(),
                     static_cast<off_t>(daemon_.header()->arena_offset)),
            0);
  const absl::Status st = OpenStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("geometry"));
}

TEST(TrainerSegmentOpenTest, MissingIsNotFound) {
  const std::string name = UniqueSegmentName("missing");
  EXPECT_EQ(TrainerSegment::Open(name, kHash, kArenaBytes).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TrainerSegmentOpenTest, ForeignSmallSegmentIsRefused) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("small"));
  ASSERT_TRUE(SharedSegment::Create(name, 16).ok());
  const absl::Status st = TrainerSegment::Open(name, kHash, kArenaBytes).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("smaller than its header"));
}

TEST(TrainerSegmentOpenTest, ZeroedSegmentIsRefused) {
  // Created but never initialized (e.g. a daemon killed during Create).
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("zero"));
  ASSERT_TRUE(SharedSegment::Create(name, 1 << 20).ok());
  EXPECT_EQ(TrainerSegment::Open(name, kHash, kArenaBytes).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(TrainerSegmentCreateTest, BadSpecsAreInvalidArguments) {
  SegmentCleanup cleanup;
  for (uint64_t capacity : {uint64_t{0}, uint64_t{3}, uint64_t{100}, uint64_t{1} << 25}) {
    TrainerSegmentSpec spec = Spec();
    spec.ring_capacity = capacity;
    const std::string name = cleanup.Add(UniqueSegmentName("bad"));
    EXPECT_EQ(TrainerSegment::Create(name, spec).status().code(),
              absl::StatusCode::kInvalidArgument)
        << capacity;
    EXPECT_FALSE(gradsync::testing::SegmentExists(name));
  }
  // An arena size near 2^64 must not wrap the geometry into a tiny segment.
  TrainerSegmentSpec spec = Spec();
  spec.arena_bytes = ~uint64_t{0} - 100;
  const std::string name = cleanup.Add(UniqueSegmentName("huge"));
  auto seg = TrainerSegment::Create(name, spec);
  EXPECT_EQ(seg.status().code(), absl::StatusCode::kInvalidArgument) << seg.status();
}

TEST(TrainerSegmentCreateTest, ExistingNameIsAlreadyExists) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("twice"));
  ASSERT_TRUE(TrainerSegment::Create(name, Spec()).ok());
  EXPECT_EQ(TrainerSegment::Create(name, Spec()).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(TrainerSegment::Open(name, kHash, kArenaBytes).ok());
}

}  // namespace
}  // namespace gradsync::ipc
