// SpscRing in one process over a real shared-memory mapping: FIFO order,
// back-pressure when full, wrap-around, and corrupt counters refused.
#include "ipc/spsc_ring.h"

#include <cstdint>

#include "gtest/gtest.h"
#include "ipc/events.h"
#include "ipc/shared_segment.h"
#include "tests/ipc/segment_names.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::SegmentCleanup;
using gradsync::testing::UniqueSegmentName;

constexpr uint64_t kCapacity = 8;

class SpscRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto seg = SharedSegment::Create(cleanup_.Add(UniqueSegmentName("ring")),
                                     SpscRing<ReadyEvent>::BytesFor(kCapacity));
    ASSERT_TRUE(seg.ok()) << seg.status();
    segment_ = std::move(*seg);
    control_ = static_cast<RingControl*>(segment_.data());
    SpscRing<ReadyEvent>::Init(control_, kCapacity);
    ring_ = SpscRing<ReadyEvent>(control_, reinterpret_cast<ReadyEvent*>(control_ + 1), kCapacity);
  }

  static ReadyEvent Event(uint64_t sequence) {
    ReadyEvent e{};
    e.tensor = static_cast<uint32_t>(sequence * 3);
    e.kind = static_cast<uint32_t>(ReadyKind::kReady);
    e.sequence = sequence;
    return e;
  }

  SegmentCleanup cleanup_;
  SharedSegment segment_;
  RingControl* control_ = nullptr;
  SpscRing<ReadyEvent> ring_;
};

TEST_F(SpscRingTest, EmptyRingPopsNothing) {
  ReadyEvent e;
  EXPECT_EQ(ring_.TryPop(&e), PopResult::kEmpty);
  EXPECT_EQ(ring_.Size(), 0u);
  EXPECT_TRUE(ring_.Validate(kCapacity).ok());
}

TEST_F(SpscRingTest, FifoAcrossManyWrapArounds) {
  uint64_t pushed = 0, popped = 0;
  for (int round = 0; round < 1000; ++round) {
    const int burst = 1 + round % static_cast<int>(kCapacity);
    for (int i = 0; i < burst; ++i) ASSERT_TRUE(ring_.TryPush(Event(pushed++)));
    EXPECT_EQ(ring_.Size(), static_cast<uint64_t>(burst));
    ReadyEvent e;
    while (ring_.TryPop(&e) == PopResult::kOk) {
      ASSERT_EQ(e.sequence, popped);
      ASSERT_EQ(e.tensor, popped * 3);
      ++popped;
    }
  }
  EXPECT_EQ(pushed, popped);
  EXPECT_GT(pushed, 10 * kCapacity);  // the slots were reused many times
}

TEST_F(SpscRingTest, FullRingRefusesWithoutOverwriting) {
  for (uint64_t i = 0; i < kCapacity; ++i) ASSERT_TRUE(ring_.TryPush(Event(i)));
  EXPECT_FALSE(ring_.TryPush(Event(99)));
  EXPECT_EQ(ring_.Size(), kCapacity);
  ReadyEvent e;
  ASSERT_EQ(ring_.TryPop(&e), PopResult::kOk);
  EXPECT_EQ(e.sequence, 0u);  // the oldest entry survived the refused push
  EXPECT_TRUE(ring_.TryPush(Event(kCapacity)));
  for (uint64_t i = 1; i <= kCapacity; ++i) {
    ASSERT_EQ(ring_.TryPop(&e), PopResult::kOk);
    EXPECT_EQ(e.sequence, i);
  }
  EXPECT_EQ(ring_.TryPop(&e), PopResult::kEmpty);
}

TEST_F(SpscRingTest, HeadBehindTailIsCorrupt) {
  ASSERT_TRUE(ring_.TryPush(Event(0)));
  control_->head.store(0);
  control_->tail.store(1);
  ReadyEvent e;
  EXPECT_EQ(ring_.TryPop(&e), PopResult::kCorrupt);
  EXPECT_EQ(control_->tail.load(), 1u);  // nothing was consumed
  EXPECT_EQ(ring_.Validate(kCapacity).code(), absl::StatusCode::kDataLoss);
  // The producer refuses too rather than overwrite unread slots.
  EXPECT_FALSE(ring_.TryPush(Event(1)));
}

TEST_F(SpscRingTest, HeadTooFarAheadIsCorrupt) {
  control_->head.store(kCapacity + 1);
  ReadyEvent e;
  EXPECT_EQ(ring_.TryPop(&e), PopResult::kCorrupt);
  EXPECT_EQ(ring_.Validate(kCapacity).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(ring_.TryPush(Event(0)));
}

TEST_F(SpscRingTest, ExactlyFullIsNotCorrupt) {
  control_->head.store(1000 + kCapacity);
  control_->tail.store(1000);
  EXPECT_TRUE(ring_.Validate(kCapacity).ok());
  ReadyEvent e;
  EXPECT_EQ(ring_.TryPop(&e), PopResult::kOk);
}

TEST_F(SpscRingTest, CapacityMismatchIsReported) {
  control_->capacity = 1u << 20;  // garbage: must not be used to index
  const absl::Status st = ring_.Validate(kCapacity);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("capacity"), absl::string_view::npos) << st;
  // The ring keeps using its own capacity: still in bounds and FIFO.
  for (uint64_t i = 0; i < kCapacity; ++i) ASSERT_TRUE(ring_.TryPush(Event(i)));
  EXPECT_FALSE(ring_.TryPush(Event(kCapacity)));
}

}  // namespace
}  // namespace gradsync::ipc
