// common/half_convert.h: the vector paths (F16C for fp16, AVX2 for bf16)
// against the software loops, bit for bit: every fp16 / bf16 encoding to
// float, and float to half over every rounding boundary (each midpoint
// between neighbouring encodings and the floats just around it, every
// float whose dropped bits are a tie or next to one, NaN payloads,
// signalling NaNs, subnormals, -0, overflow) and random bit patterns. The
// software loops are common/half.h's conversions, which half_test checks
// against the reference rounding. Skipped where the CPU lacks the
// instructions: there the software loops are all there is.
#include "common/half_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/half.h"

namespace gradsync {
namespace {

uint32_t BitsOf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Runs `convert` once forced to software and once on the hardware path.
template <typename In, typename Out>
void BothPaths(void (*convert)(const In*, Out*, size_t), const std::vector<In>& in,
               std::vector<Out>* software, std::vector<Out>* hardware) {
  software->assign(in.size(), Out{});
  hardware->assign(in.size(), Out{});
  ForceSoftwareHalfConversion(true);
  convert(in.data(), software->data(), in.size());
  ForceSoftwareHalfConversion(false);
  convert(in.data(), hardware->data(), in.size());
}

std::vector<uint16_t> EveryHalfEncoding() {
  std::vector<uint16_t> all(65536);
  for (uint32_t v = 0; v <= 0xffffu; ++v) all[v] = static_cast<uint16_t>(v);
  return all;
}

void ExpectSameWidening(void (*widen)(const uint16_t*, float*, size_t), const char* name) {
  const std::vector<uint16_t> all = EveryHalfEncoding();
  std::vector<float> software, hardware;
  BothPaths(widen, all, &software, &hardware);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(BitsOf(hardware[i]), BitsOf(software[i]))
        << name << " 0x" << std::hex << all[i] << ": hardware 0x" << BitsOf(hardware[i])
        << ", software 0x" << BitsOf(software[i]);
  }
}

void ExpectSameNarrowing(void (*narrow)(const float*, uint16_t*, size_t),
                         const std::vector<float>& in, const char* name) {
  std::vector<uint16_t> software, hardware;
  BothPaths(narrow, in, &software, &hardware);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(hardware[i], software[i])
        << name << " of float bits 0x" << std::hex << BitsOf(in[i]) << ": hardware 0x"
        << hardware[i] << ", software 0x" << software[i];
  }
}

// Floats around every rounding boundary of a half format: for each pair of
// neighbouring non-negative encodings (the last pair: the largest finite
// value and the overflow threshold), both encodings' values, their midpoint
// (exact in float), the floats just below and above each, with both signs.
std::vector<float> AroundEveryBoundary(float (*widen)(uint16_t), uint16_t inf) {
  std::vector<float> out;
  for (uint32_t h = 0; h < inf; ++h) {
    const float lo = widen(static_cast<uint16_t>(h));
    const float hi = widen(static_cast<uint16_t>(h + 1));
    const float mid = h + 1 == inf ? std::nextafter(lo, INFINITY) : (lo + hi) / 2;
    for (float v : {lo, mid}) {
      for (float x : {std::nextafter(v, -INFINITY), v, std::nextafter(v, INFINITY)}) {
        out.push_back(x);
        out.push_back(-x);
      }
    }
  }
  return out;
}

// Every float whose bits below `cut` (the bits a normal result drops) are
// a tie or next to one, zero or all ones, for every sign, exponent and
// kept mantissa: every normal rounding boundary, the NaNs with their
// payloads (quiet and signalling), infinities, float subnormals.
std::vector<float> EveryKeptPrefix(int cut) {
  const uint32_t half_ulp = 1u << (cut - 1), ulp = 1u << cut;
  std::vector<float> out;
  for (uint64_t prefix = 0; prefix < (uint64_t{1} << (32 - cut)); ++prefix) {
    const uint32_t base = static_cast<uint32_t>(prefix << cut);
    for (uint32_t low : {0u, 1u, half_ulp - 1, half_ulp, half_ulp + 1, ulp - 1}) {
      out.push_back(FloatFromBits(base | low));
    }
  }
  return out;
}

std::vector<float> RandomFloats(size_t n) {
  std::mt19937 rng(20261127);
  std::vector<float> out(n);
  for (float& f : out) f = FloatFromBits(static_cast<uint32_t>(rng()));
  return out;
}

TEST(HalfConvertTest, EveryFloat16EncodingWidensAsInSoftware) {
  if (!HardwareConvertsFloat16()) GTEST_SKIP() << "no F16C on this CPU";
  ExpectSameWidening(&Float16ToFloatBlock, "fp16");
}

TEST(HalfConvertTest, EveryBFloat16EncodingWidensAsInSoftware) {
  if (!HardwareConvertsBFloat16()) GTEST_SKIP() << "no AVX2 on this CPU";
  ExpectSameWidening(&BFloat16ToFloatBlock, "bf16");
}

TEST(HalfConvertTest, Float16NarrowsAsInSoftwareAtEveryBoundary) {
  if (!HardwareConvertsFloat16()) GTEST_SKIP() << "no F16C on this CPU";
  ExpectSameNarrowing(&FloatToFloat16Block, AroundEveryBoundary(&Float16ToFloat, 0x7c00u), "fp16");
  ExpectSameNarrowing(&FloatToFloat16Block, EveryKeptPrefix(13), "fp16");
  ExpectSameNarrowing(&FloatToFloat16Block, RandomFloats(1 << 22), "fp16");
}

TEST(HalfConvertTest, BFloat16NarrowsAsInSoftwareAtEveryBoundary) {
  if (!HardwareConvertsBFloat16()) GTEST_SKIP() << "no AVX2 on this CPU";
  ExpectSameNarrowing(&FloatToBFloat16Block, AroundEveryBoundary(&BFloat16ToFloat, 0x7f80u),
                      "bf16");
  ExpectSameNarrowing(&FloatToBFloat16Block, EveryKeptPrefix(16), "bf16");
  ExpectSameNarrowing(&FloatToBFloat16Block, RandomFloats(1 << 22), "bf16");
}

// Every length up to three vectors and every start within one: the vector
// body and the scalar tail meet at each possible split, and nothing past
// `n` is written.
TEST(HalfConvertTest, EveryLengthAndAlignmentConvertsOnlyItsElements) {
  if (!HardwareConvertsFloat16() || !HardwareConvertsBFloat16()) GTEST_SKIP() << "no F16C/AVX2";
  const std::vector<float> values = RandomFloats(40);
  for (size_t start = 0; start < 8; ++start) {
    for (size_t n = 0; n <= 24; ++n) {
      for (auto narrow : {&FloatToFloat16Block, &FloatToBFloat16Block}) {
        std::vector<uint16_t> software(32, 0xabcd), hardware(32, 0xabcd);
        ForceSoftwareHalfConversion(true);
        narrow(values.data() + start, software.data() + start, n);
        ForceSoftwareHalfConversion(false);
        narrow(values.data() + start, hardware.data() + start, n);
        ASSERT_EQ(hardware, software) << "start " << start << " n " << n;
        for (size_t i = start + n; i < 32; ++i) ASSERT_EQ(hardware[i], 0xabcd) << i;
      }
    }
  }
}

// The switch the reducer's tests and benchmarks flip.
TEST(HalfConvertTest, ForcingSoftwareTurnsTheHardwarePathsOff) {
  ForceSoftwareHalfConversion(true);
  EXPECT_FALSE(HardwareConvertsFloat16());
  EXPECT_FALSE(HardwareConvertsBFloat16());
  ForceSoftwareHalfConversion(false);
}

}  // namespace
}  // namespace gradsync
