// PlanArena: 64-byte aligned tensors, page-aligned contiguous buckets, and
// clear errors for plans that do not name every tensor exactly once.
#include "ipc/arena.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync::ipc {
namespace {

using ::testing::HasSubstr;

// Checks every invariant the daemon relies on for in-place reduction.
void ExpectWellFormed(const ArenaLayout& layout, const std::vector<uint64_t>& bytes,
                      const std::vector<std::vector<uint32_t>>& buckets) {
  ASSERT_EQ(layout.tensor_offsets.size(), bytes.size());
  ASSERT_EQ(layout.bucket_offsets.size(), buckets.size());
  ASSERT_EQ(layout.bucket_bytes.size(), buckets.size());
  EXPECT_EQ(layout.total_bytes % kBucketAlignment, 0u);
  uint64_t previous_bucket_end = 0;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const uint64_t start = layout.bucket_offsets[b];
    EXPECT_EQ(start % kBucketAlignment, 0u) << "bucket " << b << " is not page aligned";
    EXPECT_GE(start, previous_bucket_end) << "bucket " << b << " overlaps its predecessor";
    // The first bucket starts the arena; later ones start on the next page.
    EXPECT_EQ(start, AlignUp(previous_bucket_end, kBucketAlignment)) << "gap before bucket " << b;
    // Contiguous: each tensor follows the previous one, aligned, no gaps
    // beyond alignment padding, and the bucket's span ends with the last.
    uint64_t cursor = start;
    for (uint32_t t : buckets[b]) {
      const uint64_t offset = layout.tensor_offsets[t];
      EXPECT_EQ(offset % kTensorAlignment, 0u) << "tensor " << t;
      EXPECT_EQ(offset, AlignUp(cursor, kTensorAlignment)) << "tensor " << t << " is not packed";
      cursor = offset + bytes[t];
    }
    EXPECT_EQ(layout.bucket_bytes[b], AlignUp(cursor, kTensorAlignment) - start) << "bucket " << b;
    EXPECT_EQ(layout.bucket_bytes[b] % kTensorAlignment, 0u);
    previous_bucket_end = start + layout.bucket_bytes[b];
  }
  EXPECT_GE(layout.total_bytes, previous_bucket_end);
  EXPECT_LT(layout.total_bytes, previous_bucket_end + kBucketAlignment);
}

TEST(PlanArenaTest, SingleBucketPacksTensorsAt64ByteOffsets) {
  const std::vector<uint64_t> bytes = {4, 100, 64, 1};
  const std::vector<std::vector<uint32_t>> buckets = {{0, 1, 2, 3}};
  auto layout = PlanArena(bytes, buckets);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->tensor_offsets, (std::vector<uint64_t>{0, 64, 192, 256}));
  EXPECT_EQ(layout->bucket_offsets, (std::vector<uint64_t>{0}));
  EXPECT_EQ(layout->bucket_bytes, (std::vector<uint64_t>{320}));
  EXPECT_EQ(layout->total_bytes, 4096u);
  ExpectWellFormed(*layout, bytes, buckets);
}

TEST(PlanArenaTest, BucketsStartOnPagesInBucketOrder) {
  // Bucket order is reverse registration order, as DDP's initial plan.
  const std::vector<uint64_t> bytes = {4096, 10, 5000, 63, 65, 8192};
  const std::vector<std::vector<uint32_t>> buckets = {{5, 4}, {3, 2}, {1, 0}};
  auto layout = PlanArena(bytes, buckets);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ExpectWellFormed(*layout, bytes, buckets);
  EXPECT_EQ(layout->tensor_offsets[5], 0u);
  EXPECT_EQ(layout->tensor_offsets[4], 8192u);
  EXPECT_EQ(layout->bucket_offsets, (std::vector<uint64_t>{0, 12288, 20480}));
  EXPECT_EQ(layout->tensor_offsets[3], 12288u);
  EXPECT_EQ(layout->tensor_offsets[2], 12288u + 64);
  EXPECT_EQ(layout->tensor_offsets[1], 20480u);
  EXPECT_EQ(layout->tensor_offsets[0], 20480u + 64);
  EXPECT_EQ(layout->total_bytes, 28672u);  // tensor 0 ends at 24640
}

TEST(PlanArenaTest, TensorsNeverOverlap) {
  std::vector<uint64_t> bytes;
  std::vector<std::vector<uint32_t>> buckets(7);
  for (uint32_t t = 0; t < 200; ++t) {
    bytes.push_back(1 + (t * 7919u) % 20000);  // odd sizes, some above a page
    buckets[(t * 31u) % buckets.size()].push_back(t);
  }
  auto layout = PlanArena(bytes, buckets);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ExpectWellFormed(*layout, bytes, buckets);
  std::vector<uint8_t> owner(layout->total_bytes, 0);
  for (uint32_t t = 0; t < bytes.size(); ++t) {
    const uint64_t offset = layout->tensor_offsets[t];
    ASSERT_LE(offset + bytes[t], layout->total_bytes) << "tensor " << t << " leaves the arena";
    for (uint64_t i = offset; i < offset + bytes[t]; ++i) {
      ASSERT_EQ(owner[i], 0) << "tensor " << t << " overlaps another at byte " << i;
      owner[i] = 1;
    }
  }
}

TEST(PlanArenaTest, EmptyPlanIsEmpty) {
  auto layout = PlanArena({}, {});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->total_bytes, 0u);
  EXPECT_TRUE(layout->bucket_offsets.empty());
}

TEST(PlanArenaTest, DuplicateTensorInOneBucketIsAnError) {
  auto layout = PlanArena({8, 8}, {{0, 1, 0}});
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("tensor 0 is in two buckets"));
}

TEST(PlanArenaTest, DuplicateTensorAcrossBucketsIsAnError) {
  auto layout = PlanArena({8, 8, 8}, {{0, 1}, {2, 1}});
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("tensor 1 is in two buckets"));
}

TEST(PlanArenaTest, MissingTensorIsAnError) {
  auto layout = PlanArena({8, 8, 8}, {{0}, {2}});
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("tensor 1 is in no bucket"));
}

TEST(PlanArenaTest, UnknownTensorIsAnError) {
  auto layout = PlanArena({8, 8}, {{0, 1, 2}});
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("bucket names tensor 2 of 2"));
}

TEST(PlanArenaTest, EmptyBucketIsAnError) {
  auto layout = PlanArena({8}, {{0}, {}});
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("empty bucket"));
}

TEST(PlanArenaTest, HugeTensorIsAnError) {
  auto layout = PlanArena({8, uint64_t{1} << 60}, {{0, 1}});
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("tensor 1 is too large"));
}

// Many tensors that are each acceptable must not add up past 64 bits and
// wrap around into a small, overlapping layout.
TEST(PlanArenaTest, HugeTotalIsAnErrorNotAWrapAround) {
  const std::vector<uint64_t> bytes(70000, uint64_t{1} << 48);
  std::vector<std::vector<uint32_t>> buckets(1);
  for (uint32_t t = 0; t < bytes.size(); ++t) buckets[0].push_back(t);
  auto layout = PlanArena(bytes, buckets);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument) << layout.status();
}

TEST(AlignUpTest, RoundsUpToMultiples) {
  EXPECT_EQ(AlignUp(0, 64), 0u);
  EXPECT_EQ(AlignUp(1, 64), 64u);
  EXPECT_EQ(AlignUp(64, 64), 64u);
  EXPECT_EQ(AlignUp(65, 4096), 4096u);
}

}  // namespace
}  // namespace gradsync::ipc
