// How GlooBackend sums a small collective across nodes (gather_sum.h): which
// collectives gather, and that every node adds the gathered copies in node
// order, so every node holds the same result whatever its own rank.
#include "daemon/backends/gather_sum.h"

#include <algorithm>
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

// What the gather leaves on every node: each node's row (its elements, then
// its element count), node 0's first.
template <typename T>
std::vector<T> Gather(const std::vector<std::vector<T>>& per_node) {
  const size_t count = per_node[0].size();
  const int nodes = static_cast<int>(per_node.size());
  std::vector<T> gathered(GatherRowElements(count) * per_node.size(), T(7));
  std::vector<T> send(GatherRowElements(count));
  std::vector<T> senders_own(gathered.size());  // each sender's (poisoned) copy, unused
  for (int node = 0; node < nodes; ++node) {
    PrepareGather(per_node[node].data(), count, nodes, send.data(), senders_own.data());
    std::copy(send.begin(), send.end(), gathered.begin() + node * GatherRowElements(count));
  }
  return gathered;
}

TEST(GatherSum, EveryNodeAddsTheCopiesInNodeOrderSoEveryNodeHoldsTheSameResult) {
  // Rounding makes the order visible: (1e8 + 1) - 1e8 = 0 in float32, while
  // adding the 1 last would keep it.
  const std::vector<float> gathered = Gather<float>({{1e8f, 2.5f}, {1.0f, 0.5f}, {-1e8f, 1.0f}});
  ASSERT_EQ(CheckGatheredRows(gathered.data(), 2, 3), -1);
  std::vector<float> out(2, -7.0f);
  SumGathered(gathered.data(), 2, 3, out.data());
  volatile float first = 1e8f;  // not folded at compile time
  EXPECT_EQ(out[0], (first + 1.0f) + -1e8f);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 4.0f);
}

TEST(GatherSum, Float64CopiesSumElementwise) {
  const std::vector<double> gathered = Gather<double>({{1, 2, 3}, {10, 20, 30}});
  ASSERT_EQ(CheckGatheredRows(gathered.data(), 3, 2), -1);
  std::vector<double> out(3);
  SumGathered(gathered.data(), 3, 2, out.data());
  EXPECT_EQ(out, (std::vector<double>{11, 22, 33}));
}

TEST(GatherSum, ARowThatArrivedShortIsNamedByItsNode) {
  // This node gathers rows of 4 elements; node 1 sent a row of 3 (a
  // collective of another length): it fills only the start of node 1's
  // row, whose poisoned end stays.
  std::vector<float> gathered(GatherRowElements(4) * 3);
  std::vector<float> send(GatherRowElements(4));
  const std::vector<float> mine = {1, 2, 3, 4};
  PrepareGather(mine.data(), 4, 3, send.data(), gathered.data());
  std::copy(send.begin(), send.end(), gathered.begin());                             // node 0
  std::copy(send.begin(), send.end(), gathered.begin() + 2 * GatherRowElements(4));  // node 2
  std::vector<float> short_row(GatherRowElements(3));
  std::vector<float> scratch(GatherRowElements(3) * 3);
  const std::vector<float> three = {5, 6, 7};
  PrepareGather(three.data(), 3, 3, short_row.data(), scratch.data());
  std::copy(short_row.begin(), short_row.end(), gathered.begin() + GatherRowElements(4));
  EXPECT_EQ(CheckGatheredRows(gathered.data(), 4, 3), 1);
}

TEST(GatherSum, PrepareGatherPoisonsEveryRowsEndSoAStaleGatherIsNotTakenForANewOne) {
  const std::vector<double> data = {4, 5};
  std::vector<double> gathered = Gather<double>({data, data, data});  // the previous gather
  ASSERT_EQ(CheckGatheredRows(gathered.data(), 2, 3), -1);
  std::vector<double> send(GatherRowElements(2));
  PrepareGather(data.data(), 2, 3, send.data(), gathered.data());
  EXPECT_EQ(send, (std::vector<double>{4, 5, 2}));
  EXPECT_EQ(CheckGatheredRows(gathered.data(), 2, 3), 0);  // nothing arrived yet
}

}  // namespace
}  // namespace gradsync
