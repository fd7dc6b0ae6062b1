// The compressed cross-node hop's arithmetic (daemon/backends/wire_cast.h):
// casts against the reference rounding of half_reference.h, in-place
// narrowing and widening of a buffer, and the pre-scaled two-node sum
// against the fp32 sum (relative error bound, fp16 overflow).
#include "daemon/backends/wire_cast.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/daemon/half_reference.h"

namespace gradsync {
namespace {

using testing::kBf16;
using testing::kFp16;
using testing::RoundToHalf;

// Unit roundoff: 2^-8 (bf16, 8 significant bits), 2^-11 (fp16, 11).
double UnitRoundoff(WireDType wire) {
  return wire == WireDType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// fp16's subnormals (below 2^-14) are spaced 2^-24 apart: the relative
// bounds hold for normal values, this absolute slack covers the rest.
constexpr double kSubnormalSlack = 0x1p-25;

// What two nodes' ring computes for one element: each narrows its fp32
// local sum pre-scaled by 1/world_size, the sum is done in the wire type,
// and the result is widened (times world_size) in place.
std::vector<float> TwoNodeAllreduce(const std::vector<float>& a, const std::vector<float>& b,
                                    WireDType wire, int world_size) {
  std::vector<float> x = a, y = b;
  const float scale = 1.0f / static_cast<float>(world_size);
  NarrowInPlace(x.data(), x.size(), wire, scale);
  NarrowInPlace(y.data(), y.size(), wire, scale);
  WireSum(wire)(x.data(), x.data(), y.data(), x.size());  // in place, as Gloo does
  WidenInPlace(x.data(), x.size(), wire, static_cast<float>(world_size));
  return x;
}

class WireCastTest : public ::testing::TestWithParam<WireDType> {};

TEST_P(WireCastTest, NarrowOneRoundsToNearestEvenLikeTheReference) {
  const WireDType wire = GetParam();
  const auto& format = wire == WireDType::kBFloat16 ? kBf16 : kFp16;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-12, 14);
  for (int i = 0; i < 100000; ++i) {
    const float v = std::ldexp(mantissa(rng), exponent(rng));
    ASSERT_EQ(NarrowOne(v, wire), RoundToHalf(format, v)) << "value " << v;
  }
}

TEST_P(WireCastTest, InPlaceRoundTripIsWithinOneRoundingPerElement) {
  const WireDType wire = GetParam();
  // Not a multiple of the cast's chunk: the tail and chunk edges count.
  std::vector<float> values(3 * 1024 + 77);
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  for (float& v : values) v = dist(rng);
  std::vector<float> buffer = values;
  NarrowInPlace(buffer.data(), buffer.size(), wire, 1.0f);
  // The buffer's (vectorized) cast rounds every element like the reference.
  std::vector<uint16_t> narrow(values.size());
  std::memcpy(narrow.data(), buffer.data(), narrow.size() * sizeof(uint16_t));
  const auto& format = wire == WireDType::kBFloat16 ? kBf16 : kFp16;
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(narrow[i], RoundToHalf(format, values[i])) << "element " << i << ": " << values[i];
  }
  WidenInPlace(buffer.data(), buffer.size(), wire, 1.0f);
  const double u = UnitRoundoff(wire);
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_LE(std::fabs(buffer[i] - values[i]), u * std::fabs(values[i]) + kSubnormalSlack)
        << "element " << i << ": " << values[i] << " came back as " << buffer[i];
  }
}

TEST_P(WireCastTest, TwoNodeSumIsWithinTheBoundOfTheFp32Sum) {
  const WireDType wire = GetParam();
  std::vector<float> a(5000), b(5000);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = dist(rng), b[i] = dist(rng);
  const int world_size = 6;  // not a power of two: the scaling rounds too
  const std::vector<float> got = TwoNodeAllreduce(a, b, wire, world_size);
  // Two roundings per element (the cast and the sum), each within u of
  // |a| + |b| (so the bound holds under cancellation too).
  const double bound = 2 * UnitRoundoff(wire) + 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    const double exact = static_cast<double>(a[i]) + b[i];
    const double magnitude = std::fabs(a[i]) + std::fabs(b[i]);
    ASSERT_LE(std::fabs(got[i] - exact), bound * magnitude + 2 * kSubnormalSlack * world_size)
        << "element " << i << ": " << a[i] << " + " << b[i] << " gave " << got[i];
  }
}

TEST(WireCastFp16Test, PreScalingKeepsSumsAboveFp16RangeFinite) {
  // Local sums beyond 65504 whose average is within it: without the
  // 1/world_size pre-scaling the cast would overflow.
  const std::vector<float> a = {1.0e5f, -2.0e5f, 65504.0f * 3, 7.0e4f};
  const std::vector<float> b = {2.0e4f, 1.0e5f, 65504.0f, 6.0e4f};
  const std::vector<float> got = TwoNodeAllreduce(a, b, WireDType::kFloat16, 4);
  for (size_t i = 0; i < a.size(); ++i) {
    const double exact = static_cast<double>(a[i]) + b[i];
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    ASSERT_LE(std::fabs(got[i] - exact),
              2 * std::ldexp(1.0, -11) * (std::fabs(a[i]) + std::fabs(b[i])))
        << "element " << i << ": " << exact << " came back as " << got[i];
  }
}

TEST(WireCastFp16Test, AnAverageBeyondFp16RangeSaturatesInsteadOfBecomingInf) {
  const int world_size = 2;
  // Average 1e5 > 65504: the wire's largest finite value, times world_size.
  const std::vector<float> a = {1.0e5f, -3.0e5f};
  const std::vector<float> b = {1.0e5f, -1.0e5f};
  const std::vector<float> got = TwoNodeAllreduce(a, b, WireDType::kFloat16, world_size);
  EXPECT_EQ(got[0], 65504.0f * world_size);
  EXPECT_EQ(got[1], -65504.0f * world_size);
}

TEST(WireCastFp16Test, InfAndNanGradientsStayNonFinite) {
  // An AMP loss scaler must still see an overflowed gradient.
  const std::vector<float> a = {INFINITY, 1.0f, -INFINITY};
  const std::vector<float> b = {1.0f, NAN, 2.0f};
  for (WireDType wire : {WireDType::kFloat16, WireDType::kBFloat16}) {
    const std::vector<float> got = TwoNodeAllreduce(a, b, wire, 2);
    EXPECT_EQ(got[0], INFINITY) << WireDTypeName(wire);
    EXPECT_TRUE(std::isnan(got[1])) << WireDTypeName(wire);
    EXPECT_EQ(got[2], -INFINITY) << WireDTypeName(wire);
  }
}

TEST(WireDTypeTest, ParsesTheFlagSpellingsAndNamesABadValue) {
  EXPECT_EQ(*ParseWireDType("off"), WireDType::kOff);
  EXPECT_EQ(*ParseWireDType("bf16"), WireDType::kBFloat16);
  EXPECT_EQ(*ParseWireDType("FP16"), WireDType::kFloat16);
  const absl::StatusOr<WireDType> bad = ParseWireDType("int8");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'int8'"), std::string::npos) << bad.status();
}

INSTANTIATE_TEST_SUITE_P(Wire, WireCastTest,
                         ::testing::Values(WireDType::kBFloat16, WireDType::kFloat16),
                         [](const auto& info) { return std::string(WireDTypeName(info.param)); });

}  // namespace
}  // namespace gradsync
