// A producer killed with SIGKILL in the middle of a stream: the consumer
// finds a consistent ring holding only whole, in-order entries; a new
// producer can take over the same ring; and the segment is reclaimable,
// by name or, when the dead process was the daemon, by RemoveStaleSegments.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/events.h"
#include "ipc/node_segment.h"
#include "ipc/shared_segment.h"
#include "ipc/trainer_segment.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/process.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::Process;
using gradsync::testing::SegmentCleanup;
using gradsync::testing::SegmentExists;
using gradsync::testing::UniquePrefix;
using gradsync::testing::UniqueSegmentName;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kHash = 0xdead;
constexpr uint64_t kArenaBytes = 4096;
constexpr uint32_t kTensors = 50;

ReadyEvent Ready(uint64_t i) {
  ReadyEvent e{};
  e.tensor = static_cast<uint32_t>(i % kTensors);
  e.kind = static_cast<uint32_t>(ReadyKind::kReady);
  e.iteration = i / kTensors;
  e.sequence = i;
  // A torn entry would not match.
  e.no_sync_iterations = static_cast<uint32_t>(~i);
  e.checksum = static_cast<uint32_t>(~i >> 32);
  return e;
}

// Pushes Ready(first), Ready(first + 1), ... until `count` are in or
// forever (count 0), yielding while the ring is full.
int ProduceReady(const std::string& name, uint64_t first, uint64_t count) {
  auto seg = TrainerSegment::Open(name, kHash, kArenaBytes);
  if (!seg.ok()) {
    fprintf(stderr, "producer: %s\n", seg.status().ToString().c_str());
    return 1;
  }
  for (uint64_t i = first; count == 0 || i < first + count; ++i) {
    while (!seg->ready_ring().TryPush(Ready(i))) std::this_thread::yield();
  }
  return 0;
}

// Pops and checks one entry; "" if it is the expected one.
std::string CheckNext(SpscRing<ReadyEvent>& ring, uint64_t expected, PopResult* result) {
  ReadyEvent e;
  *result = ring.TryPop(&e);
  if (*result == PopResult::kCorrupt) return "ring reported corrupt";
  if (*result == PopResult::kEmpty) return "";
  const ReadyEvent want = Ready(expected);
  const absl::Status st = ValidateReadyEvent(e, {kTensors, want.iteration, expected});
  if (!st.ok()) return st.ToString();
  if (e.tensor != want.tensor || e.no_sync_iterations != want.no_sync_iterations ||
      e.checksum != want.checksum) {
    return absl::StrCat("entry ", expected, " is torn");
  }
  return "";
}

// The trainer (producer of the readiness ring) dies; the daemon (consumer,
// creator of the segment) keeps a clean ring and can reuse or reclaim it.
TEST(ProducerKillTest, KilledTrainerLeavesACleanRing) {
  constexpr int kRounds = 12;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    SegmentCleanup cleanup;
    const std::string name = cleanup.Add(UniqueSegmentName("kill"));
    TrainerSegmentSpec spec;
    spec.layout_hash = kHash;
    spec.arena_bytes = kArenaBytes;
    spec.ring_capacity = 256;
    auto daemon = TrainerSegment::Create(name, spec);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    SpscRing<ReadyEvent>& ring = daemon->ready_ring();

    auto trainer = Process::Fork([&] { return ProduceReady(name, 0, 0); });
    ASSERT_TRUE(trainer.ok()) << trainer.status();

    // Consume until a round-dependent point, then kill mid-stream; odd
    // rounds stop consuming first so the producer dies at a full ring.
    const uint64_t kill_after = 1000 + 7919u * static_cast<uint64_t>(round);
    uint64_t next = 0;
    const auto deadline = Clock::now() + seconds(30);
    while (next < kill_after) {
      PopResult r;
      const std::string error = CheckNext(ring, next, &r);
      ASSERT_EQ(error, "") << "before the kill, at entry " << next;
      if (r == PopResult::kOk) {
        ++next;
      } else {
        ASSERT_LT(Clock::now(), deadline) << "the producer stalled";
        std::this_thread::yield();
      }
    }
    if (round % 2 == 1) {
      while (ring.Size() < ring.capacity() && Clock::now() < deadline) std::this_thread::yield();
    }
    ASSERT_TRUE(trainer->Kill().ok());

    // Whatever was published is whole and in order; then the ring is empty.
    PopResult r = PopResult::kOk;
    while (true) {
      const std::string error = CheckNext(ring, next, &r);
      ASSERT_EQ(error, "") << "after the kill, at entry " << next;
      if (r != PopResult::kOk) break;
      ++next;
    }
    EXPECT_EQ(r, PopResult::kEmpty);
    EXPECT_EQ(ring.Size(), 0u);
    EXPECT_TRUE(daemon->ValidateHeader().ok());

    // A restarted trainer attaches to the same segment and goes on.
    auto restarted = Process::Fork([&] { return ProduceReady(name, next, 100); });
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    for (uint64_t end = next + 100; next < end;) {
      const std::string error = CheckNext(ring, next, &r);
      ASSERT_EQ(error, "") << "after the restart, at entry " << next;
      if (r == PopResult::kOk) {
        ++next;
      } else {
        ASSERT_LT(Clock::now(), deadline + seconds(30)) << "the restarted producer stalled";
        std::this_thread::yield();
      }
    }
    auto code = restarted->Wait(seconds(30)).ExitCode();
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);

    // Reclaimable: the name goes away and can be created afresh.
    ASSERT_TRUE(SharedSegment::Remove(name).ok());
    EXPECT_FALSE(SegmentExists(name));
    auto again = TrainerSegment::Create(name, spec);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->ready_ring().Size(), 0u);
  }
}

// The daemon (creator, producer of completions, named by its pid) dies: the
// trainer still reads a clean completion ring, and the daemon's segments
// are found stale by pid and removed.
TEST(ProducerKillTest, KilledDaemonsSegmentsAreReclaimed) {
  const std::string prefix = UniquePrefix("killd");
  SegmentCleanup cleanup;
  auto daemon = Process::Fork([&]() -> int {
    auto node = NodeSegment::Create(SegmentName(prefix, getpid(), "node"), getpid());
    TrainerSegmentSpec spec;
    spec.layout_hash = kHash;
    spec.arena_bytes = kArenaBytes;
    spec.ring_capacity = 64;
    spec.daemon_pid = getpid();
    auto trainer = TrainerSegment::Create(SegmentName(prefix, getpid(), "t0"), spec);
    if (!node.ok() || !trainer.ok()) return 1;
    for (uint64_t i = 0;; ++i) {
      CompletionEvent e{};
      e.kind = static_cast<uint32_t>(CompletionKind::kBucketDone);
      e.bucket = static_cast<uint32_t>(i % 9);
      e.iteration = i / 9;
      e.sequence = i;
      while (!trainer->completion_ring().TryPush(e)) std::this_thread::yield();
      trainer->header()->completion_bell.Ring();
      trainer->header()->daemon_heartbeat.fetch_add(1);
    }
  });
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string node_name = cleanup.Add(SegmentName(prefix, daemon->pid(), "node"));
  const std::string trainer_name = cleanup.Add(SegmentName(prefix, daemon->pid(), "t0"));

  // Attach like a trainer: the segment may not exist or be initialized yet.
  absl::StatusOr<TrainerSegment> trainer = absl::UnavailableError("not tried");
  const auto deadline = Clock::now() + seconds(30);
  while (!(trainer = TrainerSegment::Open(trainer_name, kHash, kArenaBytes)).ok()) {
    ASSERT_LT(Clock::now(), deadline) << trainer.status();
    std::this_thread::yield();
  }
  auto node = NodeSegment::Open(node_name);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->header()->daemon_pid, daemon->pid());

  uint64_t next = 0;
  auto check_entries = [&](uint64_t until) {
    CompletionEvent e;
    while (next < until) {
      const PopResult r = trainer->completion_ring().TryPop(&e);
      if (r == PopResult::kEmpty) return;
      ASSERT_EQ(r, PopResult::kOk);
      ASSERT_EQ(e.sequence, next);
      ASSERT_EQ(e.bucket, next % 9);
      ASSERT_EQ(e.iteration, next / 9);
      ++next;
    }
  };
  while (next < 5000) {
    check_entries(5000);
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_LT(Clock::now(), deadline) << "the daemon stalled at " << next;
  }
  ASSERT_TRUE(daemon->Kill().ok());
  check_entries(~uint64_t{0});
  ASSERT_FALSE(HasFatalFailure());
  CompletionEvent e;
  EXPECT_EQ(trainer->completion_ring().TryPop(&e), PopResult::kEmpty);
  EXPECT_TRUE(trainer->ValidateHeader().ok());
  const uint64_t heartbeat = trainer->header()->daemon_heartbeat.load();
  // Bumped after each entry (the kill may fall between push and bump).
  EXPECT_GE(heartbeat + 1, next);

  EXPECT_THAT(RemoveStaleSegments(prefix),
              ::testing::UnorderedElementsAre(node_name, trainer_name));
  EXPECT_FALSE(SegmentExists(node_name));
  EXPECT_FALSE(SegmentExists(trainer_name));
  EXPECT_EQ(TrainerSegment::Open(trainer_name, kHash, kArenaBytes).status().code(),
            absl::StatusCode::kNotFound);
  // Our mappings outlive the names: still readable, still consistent.
  EXPECT_TRUE(trainer->ValidateHeader().ok());
  EXPECT_EQ(trainer->header()->daemon_heartbeat.load(), heartbeat);
}

}  // namespace
}  // namespace gradsync::ipc
