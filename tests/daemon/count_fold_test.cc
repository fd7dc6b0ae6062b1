// The per-iteration counts folded into a small bucket's collective: what N
// nodes' limbs sum to (elementwise, in the bucket's dtype, as the ring
// does) decodes to the exact sum of their counts.
#include "daemon/backends/count_fold.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Every node's counts encoded, summed node by node in T (the collective's
// arithmetic), decoded.
template <typename T>
std::vector<double> SumAcrossNodes(const std::vector<std::vector<double>>& per_node, DType dtype) {
  const size_t n = per_node[0].size();
  std::vector<T> total(n * kCountLimbs, T(0)), limbs(n * kCountLimbs);
  for (const std::vector<double>& counts : per_node) {
    EXPECT_TRUE(EncodeCounts(counts.data(), n, dtype, limbs.data()).ok());
    for (size_t i = 0; i < limbs.size(); ++i) total[i] += limbs[i];
  }
  std::vector<double> out(n);
  DecodeCounts(total.data(), n, dtype, out.data());
  return out;
}

// The scheduler's layout for `nodes` nodes: 3 job-wide counts, then one
// slot per node (only its own filled) for no_sync counts and config versions.
std::vector<std::vector<double>> AgreementOf(int nodes, double trainers, double no_sync,
                                             double version) {
  std::vector<std::vector<double>> per_node(nodes, std::vector<double>(3 + 2 * nodes, 0));
  for (int k = 0; k < nodes; ++k) {
    per_node[k][0] = trainers;
    per_node[k][3 + k] = no_sync;
    per_node[k][3 + nodes + k] = version + k;
  }
  return per_node;
}

TEST(CountFold, Float32SumsAreExactUpTo255NodesAndCountsNear2To53) {
  for (int nodes : {2, 3, 17, 255}) {
    // 2^53 - 1 in a node's own slot; trainers summed over every node.
    const double big = 9007199254740991.0;
    const auto per_node = AgreementOf(nodes, 65535, big, 123456789);
    const std::vector<double> got = SumAcrossNodes<float>(per_node, DType::kFloat32);
    EXPECT_EQ(got[0], 65535.0 * nodes) << nodes;
    EXPECT_EQ(got[1], 0) << nodes;
    for (int k = 0; k < nodes; ++k) {
      EXPECT_EQ(got[3 + k], big) << nodes << " node " << k;
      EXPECT_EQ(got[3 + nodes + k], 123456789.0 + k) << nodes << " node " << k;
    }
  }
}

TEST(CountFold, Float64SumsAreExact) {
  const auto per_node = AgreementOf(4, 2, 7, 1ull << 40);
  const std::vector<double> got = SumAcrossNodes<double>(per_node, DType::kFloat64);
  EXPECT_EQ(got[0], 8);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(got[3 + k], 7);
    EXPECT_EQ(got[3 + 4 + k], static_cast<double>((1ull << 40) + k));
  }
}

TEST(CountFold, RefusesCountsThatAreNotWholeNumbersBelow2To53) {
  float limbs[kCountLimbs * 1];
  for (double bad : {-1.0, 0.5, 9007199254740992.0, std::nan("")}) {
    const absl::Status st = EncodeCounts(&bad, 1, DType::kFloat32, limbs);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("count 0")) << bad;
  }
}

TEST(CountFold, FoldsOnlySmallFloatBucketsOnAnExactWire) {
  EXPECT_TRUE(CanFoldCounts(1024, DType::kFloat32, WireDType::kOff, 2, 7));
  EXPECT_TRUE(CanFoldCounts(1024, DType::kFloat64, WireDType::kBFloat16, 2, 7));
  EXPECT_TRUE(CanFoldCounts(kCountFoldMaxBytes / 4, DType::kFloat32, WireDType::kOff, 255, 7));
  // A 16-bit wire rounds (and pre-scales) float32.
  EXPECT_FALSE(CanFoldCounts(1024, DType::kFloat32, WireDType::kBFloat16, 2, 7));
  EXPECT_FALSE(CanFoldCounts(1024, DType::kFloat32, WireDType::kFloat16, 2, 7));
  EXPECT_FALSE(CanFoldCounts(kCountFoldMaxBytes / 4 + 1, DType::kFloat32, WireDType::kOff, 2, 7));
  EXPECT_FALSE(CanFoldCounts(1024, DType::kFloat32, WireDType::kOff, 256, 7));  // limb sums
  EXPECT_FALSE(CanFoldCounts(1024, DType::kFloat32, WireDType::kOff, 1, 7));
  EXPECT_FALSE(CanFoldCounts(1024, DType::kFloat32, WireDType::kOff, 2, 0));
  EXPECT_FALSE(CanFoldCounts(1024, DType::kFloat16, WireDType::kOff, 2, 7));
}

}  // namespace
}  // namespace gradsync
