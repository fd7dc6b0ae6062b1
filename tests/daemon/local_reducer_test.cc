// The local reduction's arithmetic: sum over trainers / world size, written
// back to every trainer, for every dtype, span layout and thread count, with
// and without the non-finite check (its kernels write the same results) —
// against a straightforward double-precision reference; fp16/bf16 results
// bit for bit against the reducer's contract (sum in fp32, divide, round
// once to nearest even, reference rounding from half_reference.h).
#include "daemon/engine/local_reducer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>

#include "common/half.h"
#include "daemon/engine/bucket_pieces.h"
#include "tests/daemon/half_reference.h"

namespace gradsync {
namespace {

// A backend that really spans "nodes": it adds a known remote contribution,
// to check the multi-node path's staging, widening and write-back.
class AddConstantBackend final : public Backend {
 public:
  explicit AddConstantBackend(double remote) : remote_(remote) {}
  std::string name() const override { return "test-add"; }
  int num_nodes() const override { return 2; }
  absl::Status AllreduceSum(void* data, size_t count, DType dtype) override {
    calls++;
    counts.push_back(count);
    if (dtype == DType::kFloat64) {
      for (size_t i = 0; i < count; ++i) static_cast<double*>(data)[i] += remote_;
    } else if (dtype == DType::kFloat32) {
      for (size_t i = 0; i < count; ++i) static_cast<float*>(data)[i] += float(remote_);
    } else {
      return absl::InternalError("halves must be widened before the backend");
    }
    return absl::OkStatus();
  }
  void Abort(const std::string&) override {}
  int calls = 0;
  std::vector<size_t> counts;  // of every call, in order

 private:
  double remote_;
};

double Load(DType t, const uint8_t* p, size_t i) {
  switch (t) {
    case DType::kFloat32:
      return reinterpret_cast<const float*>(p)[i];
    case DType::kFloat64:
      return reinterpret_cast<const double*>(p)[i];
    case DType::kFloat16:
      return Float16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case DType::kBFloat16:
      return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

void Store(DType t, uint8_t* p, size_t i, double v) {
  switch (t) {
    case DType::kFloat32:
      reinterpret_cast<float*>(p)[i] = float(v);
      break;
    case DType::kFloat64:
      reinterpret_cast<double*>(p)[i] = v;
      break;
    case DType::kFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = FloatToFloat16(float(v));
      break;
    case DType::kBFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = FloatToBFloat16(float(v));
      break;
  }
}

struct Case {
  DType dtype;
  int trainers;
  size_t threads;
  bool remote;
  bool single_span;  // one span: the in-place cross-node path for fp32/fp64
  bool check;        // with the non-finite check (a NonFiniteReport)
};

// gtest prints a parameter it does not know as raw bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << DTypeName(c.dtype) << ", " << c.trainers << " trainers, " << c.threads << " threads, "
      << (c.remote ? "across nodes" : "one node") << ", "
      << (c.single_span ? "one span" : "several spans") << (c.check ? ", non-finite check" : "");
}

class LocalReducerTest : public ::testing::TestWithParam<Case> {};

TEST_P(LocalReducerTest, AveragesIntoEveryTrainer) {
  const Case c = GetParam();
  const size_t esize = DTypeSize(c.dtype);
  // Two spans with a gap (bytes outside the spans must stay untouched), and
  // sizes that are not multiples of the chunk size.
  const std::vector<ReduceSpan> spans =
      c.single_span ? std::vector<ReduceSpan>{{4096, 100003 * esize}}
                    : std::vector<ReduceSpan>{{64, 3 * esize}, {4096, 100003 * esize}};
  const size_t arena_bytes = 4096 + 100003 * esize + 64;
  std::vector<std::vector<uint8_t>> arenas(c.trainers, std::vector<uint8_t>(arena_bytes, 0xAB));
  std::mt19937 gen(42);
  std::uniform_int_distribution<int> small(-64, 64);  // exact in every dtype
  const int world = c.trainers * (c.remote ? 2 : 1);
  const double remote = c.remote ? 3.5 : 0.0;
  // sums[s][i]: the exact sum over every rank (exact in fp32 as well).
  std::vector<std::vector<double>> sums;
  for (const ReduceSpan& s : spans) sums.emplace_back(s.bytes / esize, remote);
  for (auto& a : arenas) {
    for (size_t s = 0; s < spans.size(); ++s) {
      for (size_t i = 0; i < sums[s].size(); ++i) {
        const double v = small(gen) / 4.0;
        Store(c.dtype, a.data() + spans[s].offset, i, v);
        sums[s][i] += v;
      }
    }
  }
  std::vector<std::vector<double>> expected = sums;
  for (auto& e : expected) {
    for (double& v : e) v /= world;
  }
  std::vector<uint8_t*> ptrs;
  for (auto& a : arenas) ptrs.push_back(a.data());
  uint64_t staging = 0;
  for (const ReduceSpan& s : spans) staging += LocalReducer::StagingBytes(s.bytes, c.dtype);
  LocalReducer reducer(c.threads, c.remote ? staging : 0);
  AddConstantBackend add(remote);
  LocalBackend local;
  Backend& backend = c.remote ? static_cast<Backend&>(add) : local;
  ReduceTimings timings;
  NonFiniteReport report;
  ASSERT_TRUE(
      reducer.Reduce(ptrs, spans, c.dtype, world, backend, &timings, 0, c.check ? &report : nullptr)
          .ok());
  EXPECT_FALSE(report.result_non_finite);
  if (c.remote) {
    EXPECT_EQ(add.calls, 1);
    // The copy back into the arenas after the collective is timed on its own
    // (BucketStats.write_back), as a part of the local reduce.
    EXPECT_GT(timings.write_back_ns, 0);
    EXPECT_LE(timings.write_back_ns, timings.local_reduce_ns);
  } else {
    EXPECT_EQ(timings.write_back_ns, 0) << "one node: the write-back is fused into the sum";
  }
  const bool half = c.dtype == DType::kFloat16 || c.dtype == DType::kBFloat16;
  const testing::HalfFormat& format = c.dtype == DType::kFloat16 ? testing::kFp16 : testing::kBf16;
  const double tol = c.dtype == DType::kFloat64 ? 1e-15 : 1e-6;
  for (int t = 0; t < c.trainers; ++t) {
    for (size_t s = 0; s < spans.size(); ++s) {
      for (size_t i = 0; i < expected[s].size(); ++i) {
        if (half) {
          // The fp32 sum is exact here, so the fp32 quotient is the one the
          // reducer computes; it must then be rounded once, to nearest even.
          const float quotient = static_cast<float>(sums[s][i]) / static_cast<float>(world);
          const uint16_t got =
              reinterpret_cast<const uint16_t*>(arenas[t].data() + spans[s].offset)[i];
          ASSERT_EQ(got, testing::RoundToHalf(format, quotient))
              << "trainer " << t << " span " << s << " element " << i << " sum " << sums[s][i]
              << " world " << world;
          continue;
        }
        const double got = Load(c.dtype, arenas[t].data() + spans[s].offset, i);
        ASSERT_NEAR(got, expected[s][i], tol * (1 + std::fabs(expected[s][i])))
            << "trainer " << t << " span " << s << " element " << i;
      }
    }
    // Bytes outside the spans are untouched.
    EXPECT_EQ(arenas[t][0], 0xAB);
    EXPECT_EQ(arenas[t][64 + 3 * esize], 0xAB);
    EXPECT_EQ(arenas[t][4095], 0xAB);
    EXPECT_EQ(arenas[t][arena_bytes - 1], 0xAB);
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> out;
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (int trainers : {1, 2, 3}) {
      for (size_t threads : {1, 2}) {
        for (bool remote : {false, true}) {
          for (bool single : {false, true}) {
            for (bool check : {false, true}) {
              out.push_back({d, trainers, threads, remote, single, check});
            }
          }
        }
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, LocalReducerTest, ::testing::ValuesIn(AllCases()));

// An elastic job's kept copies, written by the reducer's own passes: the
// kept sums hold exactly each piece's collective input and the kept result
// exactly the average every trainer got (bit for bit, at the arena's
// offsets), on every path (in place, the reducer's staging, a backend's
// own staging; one trainer, checked or not); and an iteration redone from
// the kept sums, after the arenas were overwritten, gives the same bits.
class RecordingBackend final : public Backend {
 public:
  RecordingBackend(double remote, bool offers_staging)
      : remote_(remote), offers_staging_(offers_staging) {}
  std::string name() const override { return "test-recording"; }
  int num_nodes() const override { return 2; }
  absl::Status AllreduceSum(void* data, size_t count, DType dtype) override {
    const size_t bytes = count * DTypeSize(dtype);
    inputs.insert(inputs.end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + bytes);
    for (size_t i = 0; i < count; ++i) {
      if (dtype == DType::kFloat64) static_cast<double*>(data)[i] += remote_;
      if (dtype == DType::kFloat32) static_cast<float*>(data)[i] += float(remote_);
    }
    return absl::OkStatus();
  }
  uint8_t* Staging(uint64_t bytes) override {
    if (!offers_staging_) return nullptr;
    if (staging_.size() < bytes) staging_.resize(bytes);
    return staging_.data();
  }
  void Abort(const std::string&) override {}
  std::vector<uint8_t> inputs;  // every collective's input, in order

 private:
  double remote_;
  bool offers_staging_;
  std::vector<uint8_t> staging_;
};

struct KeptCase {
  DType dtype;
  int trainers;
  bool backend_staging;  // else one span: in place for fp32/fp64
  bool check;
};

void PrintTo(const KeptCase& c, std::ostream* os) {
  *os << DTypeName(c.dtype) << ", " << c.trainers << " trainers, "
      << (c.backend_staging ? "the backend's staging" : "no backend staging")
      << (c.check ? ", non-finite check" : "");
}

class KeptCopiesTest : public ::testing::TestWithParam<KeptCase> {};

TEST_P(KeptCopiesTest,
       TheKeptSumsResultAndInputCopiesAreExactlyTheCollectivesInputAverageAndInputs) {
  const KeptCase c = GetParam();
  const size_t esize = DTypeSize(c.dtype);
  // More than one piece (kPieceBytes of staged elements) in every dtype.
  const size_t elements = 2'300'001;
  const std::vector<ReduceSpan> spans =
      c.backend_staging ? std::vector<ReduceSpan>{{64, 5 * esize}, {4096, (elements - 5) * esize}}
                        : std::vector<ReduceSpan>{{4096, elements * esize}};
  const size_t arena_bytes = 4096 + elements * esize + 64;
  std::vector<std::vector<uint8_t>> arenas(c.trainers, std::vector<uint8_t>(arena_bytes, 0xAB));
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> value(-3, 3);  // inexact sums: rounding shows
  for (auto& a : arenas) {
    for (const ReduceSpan& s : spans) {
      for (size_t i = 0; i < s.bytes / esize; ++i)
        Store(c.dtype, a.data() + s.offset, i, value(gen));
    }
  }
  const std::vector<std::vector<uint8_t>> inputs = arenas;
  std::vector<uint8_t*> ptrs;
  for (auto& a : arenas) ptrs.push_back(a.data());
  const uint64_t staged = LocalReducer::StagingBytes(elements * esize, c.dtype);
  LocalReducer reducer(2, staged);
  const int world = 2 * c.trainers;
  std::vector<uint8_t> sums(staged, 0xCD), result(arena_bytes, 0xCD);
  KeptSums kept{sums.data(), 0};
  KeptResultSink sink{result.data(), false};
  NonFiniteReport report;
  // Each trainer's input as the sum pass read it, at its arena offsets
  // (two or more trainers: the scheduler keeps none for one).
  const bool copied = c.trainers >= 2;
  std::vector<std::vector<uint8_t>> copies(c.trainers, std::vector<uint8_t>(arena_bytes, 0xCD));
  std::vector<uint8_t*> copy_ptrs;
  for (auto& copy : copies) copy_ptrs.push_back(copy.data());
  RecordingBackend first(0.75, c.backend_staging);
  ASSERT_TRUE(reducer
                  .Reduce(ptrs, spans, c.dtype, world, first, nullptr, 0,
                          c.check ? &report : nullptr, &kept, &sink, copied ? &copy_ptrs : nullptr)
                  .ok());
  for (int t = 0; copied && t < c.trainers; ++t) {
    for (const ReduceSpan& s : spans) {
      ASSERT_EQ(std::memcmp(copies[t].data() + s.offset, inputs[t].data() + s.offset, s.bytes), 0)
          << "trainer " << t << "'s input copy differs at span offset " << s.offset;
    }
  }
  EXPECT_FALSE(report.result_non_finite);
  EXPECT_EQ(kept.pieces, CountBucketPieces(elements, staged / elements, kPieceBytes));
  ASSERT_EQ(first.inputs.size(), sums.size());
  EXPECT_TRUE(first.inputs == sums) << "the kept sums differ from the collectives' input";
  EXPECT_TRUE(sink.written);
  const std::vector<std::vector<uint8_t>> averaged = arenas;
  for (const ReduceSpan& s : spans) {
    for (int t = 0; t < c.trainers; ++t) {
      ASSERT_EQ(std::memcmp(arenas[t].data() + s.offset, arenas[0].data() + s.offset, s.bytes), 0);
    }
    ASSERT_EQ(std::memcmp(result.data() + s.offset, arenas[0].data() + s.offset, s.bytes), 0)
        << "the kept result differs from the average at span offset " << s.offset;
    ASSERT_NE(std::memcmp(arenas[0].data() + s.offset, inputs[0].data() + s.offset, s.bytes), 0);
  }
  EXPECT_EQ(result[0], 0xCD) << "the kept result is written only at the spans";
  EXPECT_EQ(result[arena_bytes - 1], 0xCD);

  // Redone from the kept sums: the arenas' current content is never read.
  for (auto& a : arenas) {
    for (const ReduceSpan& s : spans) std::memset(a.data() + s.offset, 0x3C, s.bytes);
  }
  std::fill(result.begin(), result.end(), 0xCD);
  RecordingBackend redo(0.75, c.backend_staging);
  ASSERT_TRUE(reducer
                  .Reduce(ptrs, spans, c.dtype, world, redo, nullptr, 0,
                          c.check ? &report : nullptr, &kept, &sink)
                  .ok());
  EXPECT_TRUE(redo.inputs == first.inputs);
  EXPECT_TRUE(arenas == averaged) << "the redone iteration's average differs";
  for (const ReduceSpan& s : spans) {
    ASSERT_EQ(std::memcmp(result.data() + s.offset, arenas[0].data() + s.offset, s.bytes), 0);
  }
}

std::vector<KeptCase> KeptCases() {
  std::vector<KeptCase> out;
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (int trainers : {1, 2, 3}) {
      for (bool backend_staging : {false, true}) {
        for (bool check : {false, true}) out.push_back({d, trainers, backend_staging, check});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllPaths, KeptCopiesTest, ::testing::ValuesIn(KeptCases()));

// A bucket over kPieceBytes goes across nodes in pieces (their collectives
// pipelined), cut the same whether this node's trainers reduce it or have
// all joined (zeros): every node must issue the same collectives. Pieces
// cross span boundaries; the average is still exact in every element.
class PiecewiseTest : public ::testing::TestWithParam<DType> {};

TEST_P(PiecewiseTest, ABigBucketCrossesNodesInPiecesWithTheSameResult) {
  const DType dtype = GetParam();
  const size_t esize = DTypeSize(dtype);
  const size_t first_elems = 3'000'001, second_elems = 2'500'003;
  const uint64_t second_offset = (64 + first_elems * esize + 4095) / 4096 * 4096 + 4096;
  const std::vector<ReduceSpan> spans = {{64, first_elems * esize},
                                         {second_offset, second_elems * esize}};
  const size_t arena_bytes = second_offset + second_elems * esize + 64;
  const int trainers = 2, world = 4;  // 2 nodes x 2 trainers
  const double remote = 1.5;
  std::vector<std::vector<uint8_t>> arenas(trainers, std::vector<uint8_t>(arena_bytes, 0xAB));
  std::vector<std::vector<double>> sums = {std::vector<double>(first_elems, remote),
                                           std::vector<double>(second_elems, remote)};
  for (int t = 0; t < trainers; ++t) {
    for (size_t s = 0; s < spans.size(); ++s) {
      for (size_t i = 0; i < sums[s].size(); ++i) {
        const double v = static_cast<double>(static_cast<int>((i * 7 + s * 3 + t) % 33) - 16) / 2;
        Store(dtype, arenas[t].data() + spans[s].offset, i, v);
        sums[s][i] += v;
      }
    }
  }
  std::vector<uint8_t*> ptrs;
  for (auto& a : arenas) ptrs.push_back(a.data());
  const uint64_t total = first_elems + second_elems;
  const size_t staged_size = dtype == DType::kFloat64 ? 8 : 4;
  LocalReducer reducer(2, total * staged_size);
  AddConstantBackend add(remote);
  ReduceTimings timings;
  ASSERT_TRUE(reducer.Reduce(ptrs, spans, dtype, world, add, &timings).ok());

  std::vector<BucketPiece> pieces;
  CutBucketPieces(total, staged_size, kPieceBytes, &pieces);
  ASSERT_GT(pieces.size(), 2u);
  std::vector<size_t> expected_counts;
  for (const BucketPiece& p : pieces) expected_counts.push_back(p.count);
  EXPECT_EQ(add.counts, expected_counts);
  EXPECT_GT(timings.write_back_ns, 0);

  for (int t = 0; t < trainers; ++t) {
    for (size_t s = 0; s < spans.size(); ++s) {
      for (size_t i = 0; i < sums[s].size(); ++i) {
        const float quotient = static_cast<float>(sums[s][i]) / static_cast<float>(world);
        const double want = dtype == DType::kFloat64 ? sums[s][i] / world : quotient;
        ASSERT_EQ(Load(dtype, arenas[t].data() + spans[s].offset, i), want)
            << "trainer " << t << " span " << s << " element " << i;
      }
    }
    EXPECT_EQ(arenas[t][63], 0xAB);
    EXPECT_EQ(arenas[t][second_offset - 1], 0xAB);
    EXPECT_EQ(arenas[t][arena_bytes - 1], 0xAB);
  }

  // A node whose trainers all joined sends zeros in the same pieces.
  AddConstantBackend joined(0);
  ASSERT_TRUE(reducer.Reduce({}, spans, dtype, world, joined, &timings).ok());
  EXPECT_EQ(joined.counts, expected_counts);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PiecewiseTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64, DType::kBFloat16));

}  // namespace
}  // namespace gradsync
