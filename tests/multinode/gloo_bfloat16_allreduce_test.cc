// GlooBackend sums bfloat16 by widening each piece into float32, summing
// that in Gloo's ring and narrowing it back, a block at a time
// (common/half_convert.h). Two real GlooBackends (two_gloo_backends.h)
// sum the same inputs; every element must equal, bit for bit, the scalar
// conversions of common/half.h around one float addition: over odd
// lengths that end inside and outside the vector lanes, values in every
// regime (subnormals, -0, the largest finite, infinities, sums that round
// up, overflow, and Inf + -Inf), with the CPU's converters and the
// software loops alike.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/half_convert.h"
#include "daemon/backends/gloo_backend.h"
#include "gtest/gtest.h"
#include "tests/multinode/two_gloo_backends.h"

namespace gradsync::testing {
namespace {

class GlooBFloat16AllreduceTest : public TwoGlooBackendsTest {
 protected:
  void TearDown() override { ForceSoftwareHalfConversion(false); }
};

bool IsNaN(uint16_t bf16) { return (bf16 & 0x7f80) == 0x7f80 && (bf16 & 0x7f) != 0; }

// Random bit patterns but NaN (which NaN a sum of two NaNs keeps depends on
// the operands' order, which the ring does not fix), with the special
// values at fixed places.
std::vector<uint16_t> Inputs(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) {
    do {
      x = static_cast<uint16_t>(rng());
    } while (IsNaN(x));
  }
  const uint16_t specials[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f7f, 0xff7f, 0x7f80, 0xff80};
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]) && i < n; ++i) {
    v[(i * 7919) % n] = specials[i];
  }
  return v;
}

uint16_t ScalarSum(uint16_t a, uint16_t b) {
  return FloatToBFloat16(BFloat16ToFloat(a) + BFloat16ToFloat(b));
}

void ExpectSumsLikeTheScalarConversions(std::unique_ptr<GlooBackend> (&backends)[2],
                                        const std::string& path) {
  for (const size_t n : {size_t{1}, size_t{7}, size_t{9}, size_t{15}, size_t{17}, size_t{31},
                         size_t{1001}, size_t{65537}}) {
    const std::vector<uint16_t> inputs[2] = {Inputs(n, n), Inputs(n, 3 * n + 1)};
    std::vector<uint16_t> sums[2] = {inputs[0], inputs[1]};
    absl::Status summed[2];
    OnBothNodes(
        [&](int r) { summed[r] = backends[r]->AllreduceSum(sums[r].data(), n, DType::kBFloat16); });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(summed[r].ok()) << path << ", " << n << " elements, node " << r << ": "
                                  << summed[r];
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = ScalarSum(inputs[0][i], inputs[1][i]);
        ASSERT_EQ(sums[r][i], want)
            << path << ", " << n << " elements, node " << r << ", element " << i << ": 0x"
            << std::hex << inputs[0][i] << " + 0x" << inputs[1][i];
      }
    }
  }
}

TEST_F(GlooBFloat16AllreduceTest, SumsBitForBitLikeTheScalarConversionsWithTheCpusConverters) {
  ForceSoftwareHalfConversion(false);
  ExpectSumsLikeTheScalarConversions(
      backends_, HardwareConvertsBFloat16() ? "AVX2 converters" : "software (no AVX2 here)");
}

TEST_F(GlooBFloat16AllreduceTest, SumsBitForBitLikeTheScalarConversionsWithTheSoftwareLoops) {
  ForceSoftwareHalfConversion(true);
  ExpectSumsLikeTheScalarConversions(backends_, "software loops");
}

}  // namespace
}  // namespace gradsync::testing
