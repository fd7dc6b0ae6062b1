// The average divided inside Gloo's ring (ring_average.h) against the old
// formula: two real GlooBackends (two ranks on threads of this process,
// real TCP on loopback, Gloo's in-memory HashStore) sum the same inputs
// with AllreduceSum and then x / d, and with AllreduceAverage; every
// element must match bit for bit on both nodes, for every divisor a job of
// 2 nodes x 1-3 trainers uses, odd lengths, pieces of several Gloo
// segments, and NaN / Inf / overflow, whose check must flag exactly the
// results that are not finite. Half-precision and small pieces must take
// the old path (the sum alone).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backends/gloo_backend.h"
#include "daemon/backends/worker_arenas.h"
#include "gtest/gtest.h"
#include "tests/multinode/two_gloo_backends.h"

namespace gradsync::testing {
namespace {

using RingAverageTest = TwoGlooBackendsTest;

// Values in every regime: normal, tiny (subnormal once divided), huge
// (some sums overflow), negative, zero.
template <typename T>
std::vector<T> Inputs(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mantissa(-2.0, 2.0);
  std::uniform_int_distribution<int> exponent(std::numeric_limits<T>::min_exponent - 3,
                                              std::numeric_limits<T>::max_exponent - 1);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(std::ldexp(mantissa(rng), exponent(rng)));
  v[0] = T(0);
  v[1] = std::numeric_limits<T>::denorm_min();
  return v;
}

template <typename T>
struct NodeResult {
  std::vector<T> old_way;  // AllreduceSum, then x / d
  std::vector<T> ring;     // AllreduceAverage, then what the worker's writer does
  std::vector<T> copy;     // the writer's copy into another trainer's arena
  RingAverageOutcome outcome;
  bool non_finite = false;  // the writer's verdict
};

constexpr DType DTypeOf(float) { return DType::kFloat32; }
constexpr DType DTypeOf(double) { return DType::kFloat64; }

// Both ways on both nodes; `inputs[r]` is node r's local sum.
template <typename T>
void AverageBothWays(const std::vector<T> (&inputs)[2], int divisor, bool check,
                     NodeResult<T> (&out)[2], std::unique_ptr<GlooBackend> (&backends)[2]) {
  const size_t n = inputs[0].size();
  const DType dtype = DTypeOf(T{});
  absl::Status summed[2], averaged[2];
  const auto run = [&](int r) {
    NodeResult<T>& res = out[r];
    res.old_way = inputs[r];
    summed[r] = backends[r]->AllreduceSum(res.old_way.data(), n, dtype);
    for (T& x : res.old_way) x = x / static_cast<T>(divisor);
    res.ring = inputs[r];
    averaged[r] =
        backends[r]->AllreduceAverage(res.ring.data(), n, dtype, divisor, check, &res.outcome);
    res.copy.assign(n, T(7));
    res.non_finite = CopyAverage(reinterpret_cast<const char*>(res.ring.data()), n, dtype,
                                 res.outcome.averaged_begin, res.outcome.averaged_end,
                                 {reinterpret_cast<char*>(res.copy.data())}, check) ||
                     res.outcome.non_finite;
  };
  OnBothNodes(run);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(summed[r].ok()) << "node " << r << ": " << summed[r];
    ASSERT_TRUE(averaged[r].ok()) << "node " << r << ": " << averaged[r];
  }
}

template <typename T>
void ExpectSameBits(const NodeResult<T> (&out)[2], bool check, const std::string& what) {
  for (int r = 0; r < 2; ++r) {
    const NodeResult<T>& res = out[r];
    ASSERT_TRUE(res.outcome.divided) << what << ", node " << r << ": the ring did not divide";
    bool any_non_finite = false;
    for (size_t i = 0; i < res.old_way.size(); ++i) {
      ASSERT_EQ(std::memcmp(&res.ring[i], &res.old_way[i], sizeof(T)), 0)
          << what << ", node " << r << ", element " << i << ": ring " << res.ring[i]
          << ", old formula " << res.old_way[i];
      ASSERT_EQ(std::memcmp(&res.copy[i], &res.old_way[i], sizeof(T)), 0)
          << what << ", node " << r << ", copy, element " << i;
      any_non_finite = any_non_finite || !std::isfinite(res.old_way[i]);
    }
    const ElementRange owned = RingOwnedElements(res.old_way.size(), sizeof(T), r);
    ASSERT_EQ(res.outcome.averaged_begin, owned.begin) << what << ", node " << r;
    ASSERT_EQ(res.outcome.averaged_end, owned.end) << what << ", node " << r;
    EXPECT_EQ(res.non_finite, check && any_non_finite)
        << what << ", node " << r << ": the check's verdict (averaged here: ["
        << res.outcome.averaged_begin << ", " << res.outcome.averaged_end << "))";
  }
}

template <typename T>
void ExpectRingEqualsOldFormula(std::unique_ptr<GlooBackend> (&backends)[2]) {
  // Past the gather's 256 KiB; odd; several of Gloo's 1 MiB segments per
  // node (8 MiB + 3 elements of float32).
  for (const size_t n : {size_t{65537}, size_t{100003}, (size_t{1} << 21) + 3}) {
    // 2 nodes x 1, 2 or 3 trainers, and 1 + 2 trainers.
    for (const int divisor : {2, 4, 6, 3}) {
      const std::vector<T> inputs[2] = {Inputs<T>(n, n + divisor), Inputs<T>(n, 7 * n + divisor)};
      NodeResult<T> out[2];
      AverageBothWays(inputs, divisor, /*check=*/true, out, backends);
      ExpectSameBits(out, true, absl::StrCat(n, " elements / ", divisor));
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST_F(RingAverageTest, Float32AverageEqualsSumThenDivideBitForBit) {
  ExpectRingEqualsOldFormula<float>(backends_);
}

TEST_F(RingAverageTest, Float64AverageEqualsSumThenDivideBitForBit) {
  ExpectRingEqualsOldFormula<double>(backends_);
}

// Checked, each node names the first of its own inputs in the elements it
// averaged that is NaN or Inf, with its value; nothing else (the peer's
// inputs are the peer's to name, its other elements its scan's).
template <typename T>
void ExpectOwnInputCulprits(const std::vector<T> (&inputs)[2], const NodeResult<T> (&out)[2],
                            bool check, const std::string& what) {
  for (int r = 0; r < 2; ++r) {
    const RingAverageOutcome& o = out[r].outcome;
    const ElementRange owned = RingOwnedElements(inputs[r].size(), sizeof(T), r);
    size_t first = owned.end;
    for (size_t i = owned.begin; i < owned.end && first == owned.end; ++i) {
      if (!std::isfinite(inputs[r][i])) first = i;
    }
    const bool expected = check && first != owned.end;
    ASSERT_EQ(o.input_non_finite, expected) << what << ", node " << r;
    if (!expected) continue;
    EXPECT_EQ(o.input_element, first) << what << ", node " << r;
    const double want = static_cast<double>(inputs[r][first]);
    EXPECT_TRUE(std::isnan(want) ? std::isnan(o.input_value) : o.input_value == want)
        << what << ", node " << r << ": value " << o.input_value << ", not " << want;
  }
}

// Each non-finite kind on either node, in the chunk this node averages and
// in the peer's, and a sum that overflows: equal bits, and the check flags
// it on both nodes (off: never).
template <typename T>
void ExpectNonFiniteFlaggedOnBothNodes(std::unique_ptr<GlooBackend> (&backends)[2]) {
  constexpr size_t n = 100001;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const T inf = std::numeric_limits<T>::infinity();
  const T big = std::numeric_limits<T>::max();
  const T one = T(1);
  struct Case {
    const char* what;
    size_t at;
    T node0, node1;
    size_t also_at = 0;  // a second bad input on node 0 (0: none)
    T also = T(0);
  };
  const Case cases[] = {{"NaN on node 0, first chunk", 5, nan, one},
                        {"NaN on node 1, last element", n - 1, one, nan},
                        {"Inf on node 0, second chunk", n - 7, inf, one},
                        {"-Inf on node 1, first element", 0, one, -inf},
                        {"-Inf on node 1, first chunk", 17, one, -inf},
                        {"NaN on node 0 in both chunks", n - 3, nan, one, 1000, -inf},
                        {"Inf then NaN in node 0's chunk", 3000, inf, one, 2000, nan},
                        {"NaN on both nodes, either chunk", 9, one, nan, n - 2, nan},
                        {"Inf + -Inf", n / 2, inf, -inf},
                        {"an overflowing sum", n / 3, big, big}};
  for (const Case& c : cases) {
    for (const bool check : {true, false}) {
      std::vector<T> inputs[2] = {std::vector<T>(n, T(0.5)), std::vector<T>(n, T(0.25))};
      inputs[0][c.at] = c.node0;
      inputs[1][c.at] = c.node1;
      if (c.also_at != 0) inputs[0][c.also_at] = c.also;
      NodeResult<T> out[2];
      AverageBothWays(inputs, 4, check, out, backends);
      const std::string what = absl::StrCat(c.what, check ? ", checked" : ", unchecked");
      ExpectSameBits(out, check, what);
      ExpectOwnInputCulprits(inputs, out, check, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST_F(RingAverageTest, Float32NonFiniteIsFlaggedExactlyAsBefore) {
  ExpectNonFiniteFlaggedOnBothNodes<float>(backends_);
}

TEST_F(RingAverageTest, Float64NonFiniteIsFlaggedExactlyAsBefore) {
  ExpectNonFiniteFlaggedOnBothNodes<double>(backends_);
}

// Where the ring cannot divide it returns the sum, untouched, and says so:
// the caller divides as before.
TEST_F(RingAverageTest, HalfPrecisionAndSmallPiecesReturnTheSumUndivided) {
  struct Case {
    DType dtype;
    size_t count;
  };
  for (const Case c : {Case{DType::kFloat16, 100001}, Case{DType::kBFloat16, 100001},
                       Case{DType::kFloat32, 1001}, Case{DType::kFloat64, 1001}}) {
    const size_t bytes = c.count * DTypeSize(c.dtype);
    std::vector<uint8_t> sums[2], averages[2];
    RingAverageOutcome outcome[2];
    absl::Status summed[2], averaged[2];
    OnBothNodes([&](int r) {
      // 0x3c00 is 1.0 in fp16, 0x3f80 in bf16; as bytes of a float: finite.
      sums[r].assign(bytes, 0);
      for (size_t i = 0; i + 1 < bytes; i += 2) sums[r][i + 1] = 0x3c;
      averages[r] = sums[r];
      summed[r] = backends_[r]->AllreduceSum(sums[r].data(), c.count, c.dtype);
      averaged[r] = backends_[r]->AllreduceAverage(averages[r].data(), c.count, c.dtype, 4,
                                                   /*check=*/true, &outcome[r]);
    });
    for (int r = 0; r < 2; ++r) {
      const std::string what = absl::StrCat(DTypeName(c.dtype), " x ", c.count, ", node ", r);
      ASSERT_TRUE(summed[r].ok()) << what << ": " << summed[r];
      ASSERT_TRUE(averaged[r].ok()) << what << ": " << averaged[r];
      EXPECT_FALSE(outcome[r].divided) << what;
      EXPECT_EQ(sums[r], averages[r]) << what << ": not the plain sum";
    }
  }
}

}  // namespace
}  // namespace gradsync::testing
