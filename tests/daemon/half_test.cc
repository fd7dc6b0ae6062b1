// common/half.h's conversions, bit for bit, against the search-and-compare
// reference in half_reference.h: every bf16 and fp16 encoding to float and
// back, every midpoint (tie) between neighbouring encodings and the floats
// just around it, random float bit patterns, and named cases. Ties are what
// tell round-to-nearest-even from truncation or round-half-up.
#include "common/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "tests/daemon/half_reference.h"

namespace gradsync {
namespace {

using testing::BitsOf;
using testing::Decode;
using testing::FloatFromBits;
using testing::HalfFormat;
using testing::kBf16;
using testing::kFp16;
using testing::RoundToHalf;

bool IsHalfNan(const HalfFormat& f, uint16_t bits) { return (bits & 0x7fffu) > f.inf; }

// A half's quiet bit: the top mantissa bit.
uint16_t QuietBit(const HalfFormat& f) { return uint16_t(1u << (f.mantissa_bits - 1)); }

struct Conversions {
  const HalfFormat& format;
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
  const char* name;
};

const Conversions kBf16Conversions{kBf16, &BFloat16ToFloat, &FloatToBFloat16, "bf16"};
const Conversions kFp16Conversions{kFp16, &Float16ToFloat, &FloatToFloat16, "fp16"};

// FloatToX(x) equals the reference bit for bit; a NaN stays a quiet NaN of
// the same sign (its payload is not specified).
void ExpectRoundsLikeReference(const Conversions& c, float x) {
  const uint16_t got = c.from_float(x);
  if (std::isnan(x)) {
    ASSERT_TRUE(IsHalfNan(c.format, got))
        << c.name << " of float bits " << std::hex << BitsOf(x) << " gave " << got;
    ASSERT_EQ(got & 0x8000u, std::signbit(x) ? 0x8000u : 0u)
        << c.name << " " << std::hex << BitsOf(x);
    ASSERT_NE(got & QuietBit(c.format), 0) << c.name << " " << std::hex << BitsOf(x);
    return;
  }
  const uint16_t want = RoundToHalf(c.format, x);
  ASSERT_EQ(got, want) << c.name << " of float bits 0x" << std::hex << BitsOf(x) << " (" << x
                       << ")";
}

// gtest names the parameter in failure messages.
void PrintTo(const Conversions& c, std::ostream* os) { *os << c.name; }

class HalfConversionTest : public ::testing::TestWithParam<Conversions> {};

TEST_P(HalfConversionTest, EveryEncodingConvertsToItsExactFloatValue) {
  const Conversions& c = GetParam();
  for (uint32_t v = 0; v <= 0xffffu; ++v) {
    const float got = c.to_float(static_cast<uint16_t>(v));
    if (IsHalfNan(c.format, static_cast<uint16_t>(v))) {
      EXPECT_TRUE(std::isnan(got)) << c.name << " 0x" << std::hex << v;
      EXPECT_EQ(std::signbit(got), (v & 0x8000u) != 0) << c.name << " 0x" << std::hex << v;
      continue;
    }
    // Bits, not ==: -0 must stay -0.
    const float want = static_cast<float>(Decode(c.format, static_cast<uint16_t>(v)));
    ASSERT_EQ(BitsOf(got), BitsOf(want)) << c.name << " 0x" << std::hex << v;
  }
}

TEST_P(HalfConversionTest, EveryEncodingSurvivesTheRoundTripThroughFloat) {
  const Conversions& c = GetParam();
  for (uint32_t v = 0; v <= 0xffffu; ++v) {
    const uint16_t h = static_cast<uint16_t>(v);
    const uint16_t back = c.from_float(c.to_float(h));
    if (IsHalfNan(c.format, h)) {
      EXPECT_TRUE(IsHalfNan(c.format, back)) << c.name << " 0x" << std::hex << v;
    } else {
      ASSERT_EQ(back, h) << c.name << " 0x" << std::hex << v;
    }
  }
}

// Between every pair of neighbouring encodings (subnormals, the carry into
// the next binade, the largest finite value and infinity included): the
// exact midpoint, which is a tie, and the floats just below and above it.
TEST_P(HalfConversionTest, TiesRoundToEvenAndTheirNeighboursToTheNearest) {
  const Conversions& c = GetParam();
  for (uint16_t lo = 0; lo < c.format.inf; ++lo) {
    for (double sign : {1.0, -1.0}) {
      // Magnitudes; lo + 1 may be infinity's encoding, which decodes to 2^(emax+1).
      const double a = testing::DecodeMagnitude(c.format, lo);
      const double b = testing::DecodeMagnitude(c.format, lo + 1);
      const float mid = static_cast<float>(sign * (a + b) / 2);  // exact: few significant bits
      ASSERT_EQ(static_cast<double>(mid), sign * (a + b) / 2);
      ASSERT_NO_FATAL_FAILURE(ExpectRoundsLikeReference(c, mid));
      ASSERT_NO_FATAL_FAILURE(ExpectRoundsLikeReference(c, std::nextafter(mid, 0.0f)));
      ASSERT_NO_FATAL_FAILURE(ExpectRoundsLikeReference(c, std::nextafter(mid, sign * INFINITY)));
      // A tie goes to whichever neighbour has an even encoding.
      const uint16_t even = lo % 2 == 0 ? lo : lo + 1;
      ASSERT_EQ(c.from_float(mid), (sign < 0 ? 0x8000u : 0u) | even)
          << c.name << " midpoint above 0x" << std::hex << lo;
    }
  }
}

TEST_P(HalfConversionTest, RandomFloatsRoundLikeTheReference) {
  const Conversions& c = GetParam();
  std::mt19937 gen(20261123);
  for (int i = 0; i < (1 << 21); ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectRoundsLikeReference(c, FloatFromBits(gen())));
  }
}

TEST_P(HalfConversionTest, InfinitiesNansAndZerosKeepTheirKindAndSign) {
  const Conversions& c = GetParam();
  for (uint32_t bits :
       {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,  // quiet NaNs
        0x7f800001u, 0xff800001u,  // signalling, payload only in the low bits
        0x7fa00000u, 0x7fffffffu, 0x00000001u, 0x80000001u}) {
    ASSERT_NO_FATAL_FAILURE(ExpectRoundsLikeReference(c, FloatFromBits(bits)));
  }
  EXPECT_EQ(c.from_float(INFINITY), c.format.inf);
  EXPECT_EQ(c.from_float(-INFINITY), 0x8000u | c.format.inf);
  EXPECT_EQ(c.from_float(-0.0f), 0x8000u);
  EXPECT_TRUE(std::isinf(c.to_float(c.format.inf)));
}

INSTANTIATE_TEST_SUITE_P(Formats, HalfConversionTest,
                         ::testing::Values(kBf16Conversions, kFp16Conversions),
                         [](const ::testing::TestParamInfo<Conversions>& info) {
                           return std::string(info.param.name);
                         });

// Named cases, written out by hand so a reader can check them.
TEST(BFloat16, RoundsTiesToEven) {
  // bf16 keeps 7 mantissa bits: the spacing above 1 is 2^-7.
  // 1 + 3*2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3.0f / 256), 0x3f82u);
  EXPECT_EQ(FloatToBFloat16(-(1.0f + 3.0f / 256)), 0xbf82u);
  // 1 + 5*2^-8 lies halfway between 1 + 2^-6 (even) and 1 + 3*2^-7 (odd): down.
  EXPECT_EQ(FloatToBFloat16(1.0f + 5.0f / 256), 0x3f82u);
  // 1 + 2^-8 lies halfway between 1 (even) and 1 + 2^-7: down.
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3f80u);
  // Just above a tie rounds up even when the lower neighbour is even.
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256 + 1.0f / (1 << 20)), 0x3f81u);
  // The largest float below 2 carries into the exponent: 2.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3fffffffu)), 0x4000u);
  // Halfway between the largest finite bf16 and 2^128: infinity.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7f7f8000u)), 0x7f80u);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7f7fffffu)), 0x7f80u);  // FLT_MAX
}

TEST(BFloat16, RoundsSubnormalsOnTheirOwnGrid) {
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x00008000u)), 0x0000u);  // tie: 0 is even
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x00018000u)), 0x0002u);  // tie: 2 is even
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x00008001u)), 0x0001u);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x007fffffu)), 0x0080u);  // up to the smallest normal
  EXPECT_EQ(BFloat16ToFloat(0x0001u), std::ldexp(1.0f, -133));
}

TEST(Float16, RoundsTiesToEven) {
  // fp16 keeps 10 mantissa bits: the spacing above 1 is 2^-10.
  EXPECT_EQ(FloatToFloat16(1.0f + 3.0f / 2048), 0x3c02u);  // tie, up to even
  EXPECT_EQ(FloatToFloat16(1.0f + 5.0f / 2048), 0x3c02u);  // tie, down to even
  EXPECT_EQ(FloatToFloat16(1.0f + 1.0f / 2048), 0x3c00u);  // tie, down to 1
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7bffu);            // the largest finite fp16
  EXPECT_EQ(FloatToFloat16(65519.0f), 0x7bffu);
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00u);  // halfway to 2^16: infinity
}

TEST(Float16, RoundsSubnormalsOnTheirOwnGrid) {
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -25)), 0x0000u);     // tie: 0 is even
  EXPECT_EQ(FloatToFloat16(std::ldexp(3.0f, -25)), 0x0002u);     // tie: 2 is even
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001u);     // the smallest subnormal
  EXPECT_EQ(FloatToFloat16(std::ldexp(1023.5f, -24)), 0x0400u);  // tie: up to the smallest normal
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -26)), 0x0000u);
  EXPECT_EQ(Float16ToFloat(0x0001u), std::ldexp(1.0f, -24));
}

}  // namespace
}  // namespace gradsync
