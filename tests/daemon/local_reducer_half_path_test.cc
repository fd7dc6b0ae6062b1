// LocalReducer on fp16 / bf16 gradients: the hardware conversion path
// (F16C / AVX2, daemon/engine/half_average.h) writes the same bits as the
// software per-element loops, for 1-3 trainers, odd lengths (vector tails,
// 64-element blocks, thread slices), with and without the non-finite check
// (the same report too), on inputs of every kind: random bit patterns
// (NaN payloads, signalling NaNs, infinities, subnormals, -0) and finite
// values whose averages fall on rounding ties (where two NaNs meet, see
// TwoNansMeet). Skipped where the CPU lacks the instructions.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <vector>

#include "common/half_convert.h"
#include "daemon/backends/backend.h"
#include "daemon/engine/local_reducer.h"

namespace gradsync {
namespace {

struct Case {
  DType dtype;
  int trainers;
  size_t elements;
  bool check;
  bool random_bits;  // else finite values
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << DTypeName(c.dtype) << ", " << c.trainers << " trainers, " << c.elements << " elements"
      << (c.check ? ", non-finite check" : "") << (c.random_bits ? ", random bits" : ", finite");
}

// Finite halves: a random mantissa and sign, exponents from the subnormals
// to a few below the largest, so sums neither overflow nor all round alike.
uint16_t FiniteHalf(DType dtype, std::mt19937& gen) {
  const uint32_t r = static_cast<uint32_t>(gen());
  if (dtype == DType::kFloat16)
    return static_cast<uint16_t>((r & 0x83ffu) | ((r >> 16) % 28) << 10);
  return static_cast<uint16_t>((r & 0x807fu) | ((r >> 16) % 250) << 7);
}

bool IsNan(DType dtype, uint16_t v) {
  return (v & 0x7fffu) > (dtype == DType::kFloat16 ? 0x7c00u : 0x7f80u);
}

// Where two trainers' NaNs are added, IEEE 754 leaves open whose payload
// the sum carries, and the compiler picks the operand order (in the vector
// loops and their tails alike): there both paths must give one of those
// NaNs, quieted. Everywhere else, the same bits.
bool TwoNansMeet(DType dtype, const std::vector<std::vector<uint16_t>>& inputs, size_t i) {
  int nans = 0;
  for (const auto& a : inputs) nans += IsNan(dtype, a[i]);
  return nans >= 2;
}

bool IsQuietedInput(DType dtype, const std::vector<std::vector<uint16_t>>& inputs, size_t i,
                    uint16_t result) {
  const uint16_t quiet = dtype == DType::kFloat16 ? 0x0200u : 0x0040u;
  for (const auto& a : inputs) {
    if (IsNan(dtype, a[i]) && (a[i] | quiet) == result) return true;
  }
  return false;
}

struct Outcome {
  std::vector<std::vector<uint16_t>> arenas;
  NonFiniteReport report;
};

// Reduces fresh copies of `inputs` with the given conversion path.
Outcome ReduceWith(bool software, const Case& c, const std::vector<std::vector<uint16_t>>& inputs) {
  ForceSoftwareHalfConversion(software);
  Outcome out{inputs, {}};
  std::vector<uint8_t*> ptrs;
  for (auto& a : out.arenas) ptrs.push_back(reinterpret_cast<uint8_t*>(a.data()));
  const std::vector<ReduceSpan> spans{{0, c.elements * sizeof(uint16_t)}};
  LocalReducer reducer(2, 0);
  LocalBackend local;
  const absl::Status status = reducer.Reduce(ptrs, spans, c.dtype, c.trainers, local, nullptr, 0,
                                             c.check ? &out.report : nullptr);
  ForceSoftwareHalfConversion(false);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

class LocalReducerHalfPathTest : public ::testing::TestWithParam<Case> {};

TEST_P(LocalReducerHalfPathTest, HardwareConversionWritesTheSoftwarePathsBits) {
  const Case c = GetParam();
  if (c.dtype == DType::kFloat16 ? !HardwareConvertsFloat16() : !HardwareConvertsBFloat16()) {
    GTEST_SKIP() << "no F16C / AVX2 on this CPU";
  }
  std::mt19937 gen(static_cast<uint32_t>(c.elements * 7 + c.trainers));
  std::vector<std::vector<uint16_t>> inputs(c.trainers, std::vector<uint16_t>(c.elements));
  for (auto& a : inputs) {
    for (uint16_t& v : a)
      v = c.random_bits ? static_cast<uint16_t>(gen()) : FiniteHalf(c.dtype, gen);
  }
  const Outcome software = ReduceWith(true, c, inputs);
  const Outcome hardware = ReduceWith(false, c, inputs);
  for (int t = 0; t < c.trainers; ++t) {
    for (size_t i = 0; i < c.elements; ++i) {
      const uint16_t got = hardware.arenas[t][i], want = software.arenas[t][i];
      if (got != want && TwoNansMeet(c.dtype, inputs, i)) {
        ASSERT_TRUE(IsQuietedInput(c.dtype, inputs, i, got))
            << "element " << i << std::hex << " 0x" << got;
        ASSERT_TRUE(IsQuietedInput(c.dtype, inputs, i, want))
            << "element " << i << std::hex << " 0x" << want;
        continue;
      }
      ASSERT_EQ(got, want) << "trainer " << t << " element " << i << std::hex << ": hardware 0x"
                           << got << ", software 0x" << want;
    }
  }
  EXPECT_EQ(hardware.report.result_non_finite, software.report.result_non_finite);
  EXPECT_EQ(hardware.report.local, software.report.local);
  EXPECT_EQ(hardware.report.trainer, software.report.trainer);
  EXPECT_EQ(hardware.report.arena_offset, software.report.arena_offset);
  EXPECT_EQ(std::memcmp(&hardware.report.value, &software.report.value, sizeof(double)), 0);
}

std::vector<Case> AllCases() {
  std::vector<Case> out;
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    for (int trainers : {1, 2, 3}) {
      // Below a vector, around a 64-element block, odd; past the size at
      // which the bucket is split across threads.
      for (size_t n :
           {size_t{1}, size_t{7}, size_t{63}, size_t{65}, size_t{1001}, size_t{300007}}) {
        for (bool check : {false, true}) {
          for (bool random_bits : {false, true})
            out.push_back({d, trainers, n, check, random_bits});
        }
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllShapes, LocalReducerHalfPathTest, ::testing::ValuesIn(AllCases()));

}  // namespace
}  // namespace gradsync
