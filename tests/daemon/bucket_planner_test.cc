// DDP's bucketing rules, on layouts chosen to hit each one.
#include "daemon/engine/bucket_planner.h"

#include <gtest/gtest.h>

#include <numeric>

namespace gradsync {
namespace {

TensorInfo F32(const std::string& name, uint64_t numel) {
  return TensorInfo{name, DType::kFloat32, numel, -1};
}

std::vector<uint32_t> Flatten(const BucketPlan& plan) {
  std::vector<uint32_t> out;
  for (const auto& b : plan.buckets) out.insert(out.end(), b.tensors.begin(), b.tensors.end());
  return out;
}

TEST(BucketPlanner, ReverseOrderFirstBucketSmallCapAndNoSplit) {
  // 4 KB each; first cap 5 KB (2 tensors would be 8 KB), cap 10 KB.
  Layout layout;
  for (int i = 0; i < 6; ++i) layout.push_back(F32("t" + std::to_string(i), 1024));
  BucketPlan plan = PlanBuckets(layout, ReverseRegistrationOrder(6), {10 * 1024, 5 * 1024});
  ASSERT_EQ(plan.buckets.size(), 4u);
  EXPECT_EQ(plan.buckets[0].tensors, (std::vector<uint32_t>{5}));     // first: small cap
  EXPECT_EQ(plan.buckets[1].tensors, (std::vector<uint32_t>{4, 3}));  // 8 KB <= 10 KB
  EXPECT_EQ(plan.buckets[2].tensors, (std::vector<uint32_t>{2, 1}));
  EXPECT_EQ(plan.buckets[3].tensors, (std::vector<uint32_t>{0}));
  for (uint32_t b = 0; b < plan.buckets.size(); ++b) {
    EXPECT_EQ(plan.buckets[b].id, b);
    for (uint32_t t : plan.buckets[b].tensors) EXPECT_EQ(plan.bucket_of_tensor[t], b);
  }
}

TEST(BucketPlanner, TensorLargerThanTheCapGetsItsOwnBucket) {
  Layout layout = {F32("small0", 10), F32("huge", 1 << 20), F32("small1", 10)};
  BucketPlan plan = PlanBuckets(layout, ReverseRegistrationOrder(3), {4096, 4096});
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[1].tensors, (std::vector<uint32_t>{1}));
  EXPECT_EQ(plan.buckets[1].bytes, 4u << 20);
}

TEST(BucketPlanner, NeverMixesDtypes) {
  Layout layout = {F32("a", 4), TensorInfo{"b", DType::kFloat64, 4, -1}, F32("c", 4),
                   TensorInfo{"d", DType::kFloat64, 4, -1}};
  BucketPlan plan = PlanBuckets(layout, ReverseRegistrationOrder(4), {1 << 20, 1 << 20});
  ASSERT_EQ(plan.buckets.size(), 2u);
  for (const auto& b : plan.buckets) {
    for (uint32_t t : b.tensors) EXPECT_EQ(layout[t].dtype, b.dtype);
  }
}

TEST(BucketPlanner, EveryTensorExactlyOnceForManyShapes) {
  for (int n : {1, 2, 7, 100}) {
    Layout layout;
    for (int i = 0; i < n; ++i) {
      layout.push_back(TensorInfo{"t" + std::to_string(i),
                                  i % 3 == 0 ? DType::kFloat64 : DType::kFloat32,
                                  uint64_t(1 + (i * 7919) % 5000), -1});
    }
    BucketPlan plan = PlanBuckets(layout, ReverseRegistrationOrder(n), {8192, 1024});
    std::vector<uint32_t> all = Flatten(plan);
    std::sort(all.begin(), all.end());
    std::vector<uint32_t> expected(n);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected) << "n=" << n;
  }
}

TEST(BucketPlanner, FollowsTheGivenOrder) {
  Layout layout;
  for (int i = 0; i < 4; ++i) layout.push_back(F32("t" + std::to_string(i), 256));  // 1 KB
  BucketPlan plan = PlanBuckets(layout, {2, 0, 3, 1}, {2048, 1024});
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].tensors, (std::vector<uint32_t>{2}));
  EXPECT_EQ(plan.buckets[1].tensors, (std::vector<uint32_t>{0, 3}));
  EXPECT_EQ(plan.buckets[2].tensors, (std::vector<uint32_t>{1}));
}

}  // namespace
}  // namespace gradsync

namespace gradsync {
namespace {

// The caps' defaults have one definition (common/defaults.h): the planner's
// and the daemon's flags agree on it.
TEST(BucketCapsDefaults, AreTheSharedDefaultsInBytes) {
  EXPECT_EQ(BucketCaps{}.cap_bytes, uint64_t{kDefaultBucketCapMib} << 20);
  EXPECT_EQ(BucketCaps{}.first_cap_bytes, uint64_t{kDefaultFirstBucketCapMib} << 20);
  EXPECT_EQ(kDefaultBucketCapMib, 25);
  EXPECT_EQ(kDefaultFirstBucketCapMib, 1);
}

}  // namespace
}  // namespace gradsync
