// TruncationGuard: a guarded mapping whose object is truncated under it
// reads zeros instead of killing the process, on any thread, and says so;
// an unguarded mapping (or one whose guard is gone) still dies of SIGBUS,
// so the handler hides nothing else. Then the daemon's two segments.
#include "ipc/truncation_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/node_segment.h"
#include "ipc/shared_segment.h"
#include "ipc/trainer_segment.h"
#include "tests/ipc/segment_names.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::SegmentCleanup;
using gradsync::testing::UniqueSegmentName;
using ::testing::HasSubstr;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// What a rogue process does: cut the object behind every mapping of it.
void Truncate(const std::string& name, off_t size) {
  const std::string path = absl::StrCat("/dev/shm/", name);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, size), 0) << path << ": " << std::strerror(errno);
  close(fd);
}

uint64_t SumBytes(const volatile uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i];
  return sum;
}

TEST(TruncationGuardTest, TruncatedToZeroReadsZerosAndIsReported) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("trunc"));
  auto seg = SharedSegment::Create(name, 4 * kPage);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto* bytes = static_cast<volatile uint8_t*>(seg->data());
  for (size_t i = 0; i < seg->size(); ++i) bytes[i] = 7;
  auto guard = TruncationGuard::Watch(seg->data(), seg->size());
  ASSERT_TRUE(guard.ok()) << guard.status();
  EXPECT_FALSE((*guard)->truncated());

  Truncate(name, 0);
  EXPECT_EQ(SumBytes(bytes, seg->size()), 0u);  // would be SIGBUS unguarded
  EXPECT_TRUE((*guard)->truncated());
  bytes[seg->size() - 1] = 1;  // writes land nowhere, and do not fault either
  EXPECT_EQ(bytes[seg->size() - 1], 1);
}

// Truncation cuts the tail: pages still inside the object stay shared, only
// the pages past the new end are replaced.
TEST(TruncationGuardTest, PagesBeforeTheCutStayShared) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("trunc"));
  auto seg = SharedSegment::Create(name, 4 * kPage);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto other = SharedSegment::Open(name);
  ASSERT_TRUE(other.ok()) << other.status();
  auto guard = TruncationGuard::Watch(seg->data(), seg->size());
  ASSERT_TRUE(guard.ok()) << guard.status();

  Truncate(name, static_cast<off_t>(kPage));
  auto* mine = static_cast<volatile uint8_t*>(seg->data());
  EXPECT_EQ(mine[2 * kPage], 0);  // faults, is replaced
  EXPECT_TRUE((*guard)->truncated());
  static_cast<volatile uint8_t*>(other->data())[10] = 42;
  EXPECT_EQ(mine[10], 42) << "the first page must still be the shared object";
}

// The daemon reads trainers' memory from its worker threads: every thread
// that faults is rescued, whichever gets there first.
TEST(TruncationGuardTest, ConcurrentFaultsOnManyThreadsAreAllRescued) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("trunc"));
  constexpr size_t kPages = 256;
  auto seg = SharedSegment::Create(name, kPages * kPage);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto guard = TruncationGuard::Watch(seg->data(), seg->size());
  ASSERT_TRUE(guard.ok()) << guard.status();
  Truncate(name, 0);
  const auto* bytes = static_cast<const volatile uint8_t*>(seg->data());
  std::vector<std::thread> threads;
  std::vector<uint64_t> sums(4, 1);
  for (size_t t = 0; t < sums.size(); ++t) {
    threads.emplace_back([&, t] { sums[t] = SumBytes(bytes, kPages * kPage); });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(sums, ::testing::Each(0u));
  EXPECT_TRUE((*guard)->truncated());
}

TEST(TruncationGuardTest, TwoGuardsOfOneMappingBothSeeIt) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("trunc"));
  auto seg = SharedSegment::Create(name, kPage);
  ASSERT_TRUE(seg.ok()) << seg.status();
  auto a = TruncationGuard::Watch(seg->data(), seg->size());
  auto b = TruncationGuard::Watch(seg->data(), seg->size());
  ASSERT_TRUE(a.ok() && b.ok());
  Truncate(name, 0);
  EXPECT_EQ(SumBytes(static_cast<volatile uint8_t*>(seg->data()), seg->size()), 0u);
  EXPECT_TRUE((*a)->truncated());
  EXPECT_TRUE((*b)->truncated());
}

using TruncationGuardDeathTest = ::testing::Test;

// The handler is installed (another mapping is guarded), yet a fault in an
// unguarded mapping kills as before: a real bug must not read zeros.
TEST(TruncationGuardDeathTest, UnguardedMappingStillDiesOfSigbus) {
  SegmentCleanup cleanup;
  const std::string guarded = cleanup.Add(UniqueSegmentName("trunc"));
  const std::string plain = cleanup.Add(UniqueSegmentName("trunc"));
  auto g = SharedSegment::Create(guarded, kPage);
  auto p = SharedSegment::Create(plain, kPage);
  ASSERT_TRUE(g.ok() && p.ok());
  auto guard = TruncationGuard::Watch(g->data(), g->size());
  ASSERT_TRUE(guard.ok()) << guard.status();
  Truncate(plain, 0);
  EXPECT_EXIT(SumBytes(static_cast<volatile uint8_t*>(p->data()), p->size()),
              ::testing::KilledBySignal(SIGBUS), "");
}

TEST(TruncationGuardDeathTest, AGuardGoneGuardsNothing) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("trunc"));
  auto seg = SharedSegment::Create(name, kPage);
  ASSERT_TRUE(seg.ok()) << seg.status();
  { ASSERT_TRUE(TruncationGuard::Watch(seg->data(), seg->size()).ok()); }
  Truncate(name, 0);
  EXPECT_EXIT(SumBytes(static_cast<volatile uint8_t*>(seg->data()), seg->size()),
              ::testing::KilledBySignal(SIGBUS), "");
}

// The daemon's segments are guarded from creation on.
TEST(TruncationGuardTest, TrainerSegmentTruncatedByItsTrainerIsReportedNotFatal) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("trunc"));
  TrainerSegmentSpec spec;
  spec.layout_hash = 1;
  spec.arena_bytes = 16 * kPage;
  auto seg = TrainerSegment::Create(name, spec);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_FALSE(seg->Truncated());
  Truncate(name, 0);
  EXPECT_EQ(SumBytes(seg->arena(), seg->arena_bytes()), 0u);
  ReadyEvent e;
  EXPECT_EQ(seg->ready_ring().TryPop(&e), PopResult::kEmpty);
  EXPECT_TRUE(seg->Truncated());
}

TEST(TruncationGuardTest, NodeSegmentTruncatedFailsItsCheckNamingIt) {
  SegmentCleanup cleanup;
  const std::string name = cleanup.Add(UniqueSegmentName("trunc"));
  auto node = NodeSegment::Create(name, getpid());
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_TRUE(node->Check().ok());
  Truncate(name, 0);
  node->header()->heartbeat.fetch_add(1);  // what the daemon's heartbeat does
  const absl::Status st = node->Check();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr(absl::StrCat("node segment ", name, " was truncated")));
}

}  // namespace
}  // namespace gradsync::ipc
