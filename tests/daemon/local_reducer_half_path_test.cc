// LocalReducer on fp16 / bf16 gradients: the hardware conversion path
// (F16C / AVX2, daemon/engine/half_average.h) writes the same bits as the
// software per-element loops, for 1-3 trainers, odd lengths (vector tails,
// 64-element blocks, thread slices), with and without the non-finite check
// (the same report too), on inputs of every kind: random bit patterns
// (NaN payloads, signalling NaNs, infinities, subnormals, -0) and finite
// values whose averages fall on rounding ties (where two NaNs meet, see
// TwoNansMeet). Across nodes too (LocalReducerHalfWireTest): the fp32
// staged sums the collective gets, the averages written back, and an
// elastic job's kept sums, kept result and input copies. Skipped where the
// CPU lacks the instructions.
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

// Across nodes the halves are summed into fp32 staging, the collective
// runs there and the average is narrowed back: a second "node" adds a
// fixed contribution (the collective itself is not what is compared) and
// keeps every collective input, so the staged sums are compared too.
class SecondNodeBackend final : public Backend {
 public:
  explicit SecondNodeBackend(bool offers_staging) : offers_staging_(offers_staging) {}
  std::string name() const override { return "test-second-node"; }
  int num_nodes() const override { return 2; }
  absl::Status AllreduceSum(void* data, size_t count, DType dtype) override {
    if (dtype != DType::kFloat32) return absl::InternalError("halves are staged as fp32");
    auto* sums = static_cast<float*>(data);
    inputs.insert(inputs.end(), sums, sums + count);
    for (size_t i = 0; i < count; ++i) sums[i] += 0.75f;
    return absl::OkStatus();
  }
  uint8_t* Staging(uint64_t bytes) override {
    if (!offers_staging_) return nullptr;
    staging_.resize(bytes);
    return staging_.data();
  }
  void Abort(const std::string&) override {}
  std::vector<float> inputs;  // every collective's input, in order

 private:
  bool offers_staging_;
  std::vector<uint8_t> staging_;
};

struct WireCase {
  Case shape;
  bool backend_staging;
  bool elastic;  // kept sums, kept result and (2+ trainers) input copies
};

void PrintTo(const WireCase& c, std::ostream* os) {
  PrintTo(c.shape, os);
  *os << (c.backend_staging ? ", the backend's staging" : ", the reducer's staging")
      << (c.elastic ? ", elastic copies" : "");
}

struct WireOutcome {
  Outcome local;
  std::vector<float> collective_inputs;
  std::vector<uint8_t> kept_sums, kept_result;
  std::vector<std::vector<uint16_t>> input_copies;
};

WireOutcome ReduceAcrossNodesWith(bool software, const WireCase& wc,
                                  const std::vector<std::vector<uint16_t>>& inputs) {
  const Case& c = wc.shape;
  ForceSoftwareHalfConversion(software);
  WireOutcome out{{inputs, {}}, {}, {}, {}, {}};
  std::vector<uint8_t*> ptrs;
  for (auto& a : out.local.arenas) ptrs.push_back(reinterpret_cast<uint8_t*>(a.data()));
  const uint64_t bytes = c.elements * sizeof(uint16_t);
  const uint64_t staged = LocalReducer::StagingBytes(bytes, c.dtype);
  LocalReducer reducer(2, staged);
  SecondNodeBackend second(wc.backend_staging);
  out.kept_sums.assign(staged, 0xCD);
  out.kept_result.assign(bytes, 0xCD);
  KeptSums kept{out.kept_sums.data(), 0};
  KeptResultSink sink{out.kept_result.data(), false};
  const bool copied = wc.elastic && c.trainers >= 2;  // the scheduler keeps none for one
  out.input_copies.assign(copied ? c.trainers : 0, std::vector<uint16_t>(c.elements, 0xCDCD));
  std::vector<uint8_t*> copy_ptrs;
  for (auto& copy : out.input_copies) copy_ptrs.push_back(reinterpret_cast<uint8_t*>(copy.data()));
  const absl::Status status =
      reducer.Reduce(ptrs, {{0, bytes}}, c.dtype, 2 * c.trainers, second, nullptr, 0,
                     c.check ? &out.local.report : nullptr, wc.elastic ? &kept : nullptr,
                     wc.elastic ? &sink : nullptr, copied ? &copy_ptrs : nullptr);
  ForceSoftwareHalfConversion(false);
  EXPECT_TRUE(status.ok()) << status;
  out.collective_inputs = std::move(second.inputs);
  return out;
}

// The same bits, or where two NaNs met, one of them quieted (TwoNansMeet).
void ExpectSameHalves(const WireCase& c, const std::vector<std::vector<uint16_t>>& inputs,
                      const std::vector<uint16_t>& hardware, const std::vector<uint16_t>& software,
                      const char* what) {
  ASSERT_EQ(hardware.size(), software.size()) << what;
  for (size_t i = 0; i < hardware.size(); ++i) {
    const uint16_t got = hardware[i], want = software[i];
    if (got != want && TwoNansMeet(c.shape.dtype, inputs, i)) {
      ASSERT_TRUE(IsQuietedInput(c.shape.dtype, inputs, i, got)) << what << " element " << i;
      ASSERT_TRUE(IsQuietedInput(c.shape.dtype, inputs, i, want)) << what << " element " << i;
      continue;
    }
    ASSERT_EQ(got, want) << what << " element " << i << std::hex << ": hardware 0x" << got
                         << ", software 0x" << want;
  }
}

// fp32 sums: the same bits, or NaN on both where two NaN inputs met.
void ExpectSameSums(const WireCase& c, const std::vector<std::vector<uint16_t>>& inputs,
                    const float* hardware, const float* software, size_t n, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&hardware[i], &software[i], sizeof(float)) == 0) continue;
    const bool both_nan = hardware[i] != hardware[i] && software[i] != software[i];
    ASSERT_TRUE(both_nan && TwoNansMeet(c.shape.dtype, inputs, i % c.shape.elements))
        << what << " element " << i << ": hardware " << hardware[i] << ", software " << software[i];
  }
}

class LocalReducerHalfWireTest : public ::testing::TestWithParam<WireCase> {};

TEST_P(LocalReducerHalfWireTest, HardwareConversionWritesTheSoftwarePathsBitsAcrossNodes) {
  const WireCase c = GetParam();
  const Case& s = c.shape;
  if (s.dtype == DType::kFloat16 ? !HardwareConvertsFloat16() : !HardwareConvertsBFloat16()) {
    GTEST_SKIP() << "no F16C / AVX2 on this CPU";
  }
  std::mt19937 gen(static_cast<uint32_t>(s.elements * 13 + s.trainers));
  std::vector<std::vector<uint16_t>> inputs(s.trainers, std::vector<uint16_t>(s.elements));
  for (auto& a : inputs) {
    for (uint16_t& v : a)
      v = s.random_bits ? static_cast<uint16_t>(gen()) : FiniteHalf(s.dtype, gen);
  }
  const WireOutcome software = ReduceAcrossNodesWith(true, c, inputs);
  const WireOutcome hardware = ReduceAcrossNodesWith(false, c, inputs);
  ASSERT_EQ(hardware.collective_inputs.size(), software.collective_inputs.size());
  ExpectSameSums(c, inputs, hardware.collective_inputs.data(), software.collective_inputs.data(),
                 software.collective_inputs.size(), "collective input");
  for (int t = 0; t < s.trainers; ++t) {
    ExpectSameHalves(c, inputs, hardware.local.arenas[t], software.local.arenas[t], "average");
  }
  const NonFiniteReport &h = hardware.local.report, &w = software.local.report;
  EXPECT_EQ(h.result_non_finite, w.result_non_finite);
  EXPECT_EQ(h.local, w.local);
  EXPECT_EQ(h.trainer, w.trainer);
  EXPECT_EQ(h.arena_offset, w.arena_offset);
  EXPECT_EQ(std::memcmp(&h.value, &w.value, sizeof(double)), 0);
  if (!c.elastic) return;
  ExpectSameSums(c, inputs, reinterpret_cast<const float*>(hardware.kept_sums.data()),
                 reinterpret_cast<const float*>(software.kept_sums.data()), s.elements,
                 "kept sums");
  const std::vector<uint16_t> hardware_result(
      reinterpret_cast<const uint16_t*>(hardware.kept_result.data()),
      reinterpret_cast<const uint16_t*>(hardware.kept_result.data()) + s.elements);
  const std::vector<uint16_t> software_result(
      reinterpret_cast<const uint16_t*>(software.kept_result.data()),
      reinterpret_cast<const uint16_t*>(software.kept_result.data()) + s.elements);
  ExpectSameHalves(c, inputs, hardware_result, software_result, "kept result");
  EXPECT_EQ(hardware_result, hardware.local.arenas[0]) << "the kept result is the average";
  for (size_t t = 0; t < hardware.input_copies.size(); ++t) {
    EXPECT_EQ(hardware.input_copies[t], inputs[t]) << "trainer " << t << "'s input copy";
  }
}

std::vector<WireCase> WireCases() {
  std::vector<WireCase> out;
  for (const Case& shape : AllCases()) {
    for (bool backend_staging : {false, true}) {
      for (bool elastic : {false, true}) out.push_back({shape, backend_staging, elastic});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllShapes, LocalReducerHalfWireTest, ::testing::ValuesIn(WireCases()));

}  // namespace
}  // namespace gradsync
