// How GlooBackend sums a small collective across nodes (gather_sum.h): which
// collectives gather, and that every node adds the gathered copies in node
// order, so every node holds the same result whatever its own rank.
#include "daemon/backends/gather_sum.h"

#include <vector>

#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(GatherSum, SmallFloat32AndFloat64BuffersAcrossNodesGather) {
  EXPECT_TRUE(UseGatherSum(1024, DType::kFloat32, WireDType::kOff, 2));  // 4 KB
  EXPECT_TRUE(UseGatherSum(1, DType::kFloat64, WireDType::kOff, 2));     // the counts
  EXPECT_TRUE(UseGatherSum(kGatherSumMaxBytes / 4 / 2, DType::kFloat32, WireDType::kOff, 2));
  EXPECT_TRUE(UseGatherSum(kGatherSumMaxBytes / 8 / 16, DType::kFloat64, WireDType::kOff, 16));
}

TEST(GatherSum, LargeBuffersOtherDtypesCompressedWiresAndOneNodeKeepTheRing) {
  // The copies of every node past the cap: n/2 times the ring's bytes.
  EXPECT_FALSE(UseGatherSum(kGatherSumMaxBytes / 4 / 2 + 1, DType::kFloat32, WireDType::kOff, 2));
  EXPECT_FALSE(UseGatherSum(kGatherSumMaxBytes / 8 / 16 + 1, DType::kFloat64, WireDType::kOff, 16));
  EXPECT_FALSE(UseGatherSum(1024, DType::kFloat32, WireDType::kBFloat16, 2));
  EXPECT_FALSE(UseGatherSum(1024, DType::kFloat32, WireDType::kFloat16, 2));
  EXPECT_FALSE(UseGatherSum(1024, DType::kFloat16, WireDType::kOff, 2));
  EXPECT_FALSE(UseGatherSum(1024, DType::kBFloat16, WireDType::kOff, 2));
  EXPECT_FALSE(UseGatherSum(1024, DType::kFloat32, WireDType::kOff, 1));
  EXPECT_FALSE(UseGatherSum(0, DType::kFloat32, WireDType::kOff, 2));
}

TEST(GatherSum, EveryNodeAddsTheCopiesInNodeOrderSoEveryNodeHoldsTheSameResult) {
  // Rounding makes the order visible: (1e8 + 1) - 1e8 = 0 in float32, while
  // adding the 1 last would keep it.
  const std::vector<float> gathered = {1e8f,  2.5f,   // node 0
                                       1.0f,  0.5f,   // node 1
                                       -1e8f, 1.0f};  // node 2
  std::vector<float> out(2, -7.0f);
  SumGathered(gathered.data(), 2, 3, out.data());
  volatile float first = 1e8f;  // not folded at compile time
  EXPECT_EQ(out[0], (first + 1.0f) + -1e8f);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 4.0f);
}

TEST(GatherSum, Float64CopiesSumElementwise) {
  const std::vector<double> gathered = {1, 2, 3, 10, 20, 30};
  std::vector<double> out(3);
  SumGathered(gathered.data(), 3, 2, out.data());
  EXPECT_EQ(out, (std::vector<double>{11, 22, 33}));
}

}  // namespace
}  // namespace gradsync
