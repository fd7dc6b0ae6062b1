// The local reduction's fused non-finite check: for every dtype, trainer
// count, one node or two (in place and staged), and thread count, a NaN or
// Inf in one trainer's gradient is reported with that trainer, the
// element's arena offset and its value; a clean bucket reports nothing; a
// non-finite value from the other nodes is seen in the result but blamed
// on no local trainer; without a report nothing is checked. The check is
// tested once per block of elements, so bad values sit on both sides of
// every boundary the reduction has (blocks, chunks, threads' slices) and in
// the last elements, after the vector loops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/half.h"
#include "daemon/engine/local_reducer.h"

namespace gradsync {
namespace {

// Two "nodes": adds `remote` to every element (NaN: the other node's culprit).
class AddConstantBackend final : public Backend {
 public:
  explicit AddConstantBackend(double remote) : remote_(remote) {}
  std::string name() const override { return "test-add"; }
  int num_nodes() const override { return 2; }
  absl::Status AllreduceSum(void* data, size_t count, DType dtype) override {
    if (dtype == DType::kFloat64) {
      for (size_t i = 0; i < count; ++i) static_cast<double*>(data)[i] += remote_;
    } else {
      for (size_t i = 0; i < count; ++i) static_cast<float*>(data)[i] += float(remote_);
    }
    return absl::OkStatus();
  }
  void Abort(const std::string&) override {}

 private:
  double remote_;
};

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

constexpr size_t kElements = 200000;  // several chunks, and split across threads

struct Arenas {
  std::vector<std::vector<uint8_t>> memory;
  std::vector<uint8_t*> ptrs;
  Arenas(int trainers, DType dtype) {
    for (int t = 0; t < trainers; ++t) {
      memory.emplace_back(kElements * DTypeSize(dtype));
      for (size_t i = 0; i < kElements; ++i) Store(dtype, memory.back().data(), i, 0.25 * (t + 1));
    }
    for (auto& m : memory) ptrs.push_back(m.data());
  }
};

TEST(LocalReducerNonFiniteTest, NamesTheFirstBadElementsTrainerOffsetAndValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (int trainers : {1, 2, 3}) {
      for (int nodes : {1, 2}) {
        for (size_t threads : {1, 2}) {
          for (double bad : {nan, -inf}) {
            SCOPED_TRACE(testing::Message()
                         << "dtype " << DTypeName(dtype) << " trainers " << trainers << " nodes "
                         << nodes << " threads " << threads << " value " << bad);
            Arenas a(trainers, dtype);
            const int culprit = trainers - 1;
            const size_t first = 150001, second = 170000;
            Store(dtype, a.ptrs[culprit], first, bad);
            Store(dtype, a.ptrs[0], second, inf);  // later: not the one named
            LocalReducer reducer(threads, LocalReducer::StagingBytes(kElements * 8, dtype));
            LocalBackend local;
            AddConstantBackend remote(0.5);
            Backend& backend = nodes == 1 ? static_cast<Backend&>(local) : remote;
            NonFiniteReport report;
            const std::vector<ReduceSpan> spans = {{0, kElements * DTypeSize(dtype)}};
            ASSERT_TRUE(
                reducer.Reduce(a.ptrs, spans, dtype, trainers * nodes, backend, nullptr, 0, &report)
                    .ok());
            EXPECT_TRUE(report.result_non_finite);
            ASSERT_TRUE(report.local);
            EXPECT_EQ(report.trainer, size_t(culprit));
            EXPECT_EQ(report.arena_offset, first * DTypeSize(dtype));
            if (std::isnan(bad)) {
              EXPECT_TRUE(std::isnan(report.value)) << report.value;
            } else {
              EXPECT_EQ(report.value, bad);
            }
          }
        }
      }
    }
  }
}

// A bucket of 64 chunks of 2048 elements (one node: 2048 blocks of 64; two
// threads: split at element 65536) plus a 64-element block plus 3: a tail
// after the last block shorter than a 16-byte vector of fp32 or of the
// halves, whose last element is left over by fp64's 2-wide vectors too.
// Bytes enough for two threads in every dtype.
constexpr size_t kBoundaryElements = 64 * 2048 + 64 + 3;

struct Boundary {
  const char* what;
  size_t index;
};

const Boundary kBoundaries[] = {
    {"first element", 0},
    {"last element of the first block", 63},
    {"first element after a block boundary", 64},
    {"last element of a chunk", 2047},
    {"first element after a chunk boundary", 2048},
    {"last element of the first thread's slice", 32 * 2048 - 1},
    {"first element of the second thread's slice", 32 * 2048},
    {"last element of the last whole block", 64 * 2048 + 63},
    {"first element of the tail", 64 * 2048 + 64},
    {"last element: in a tail shorter than a vector", kBoundaryElements - 1},
};

TEST(LocalReducerNonFiniteTest, FindsABadValueOnEitherSideOfEveryBlockBoundaryAndInTheTail) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    const size_t esize = DTypeSize(dtype);
    for (int trainers : {1, 2, 3}) {
      for (int nodes : {1, 2}) {
        for (size_t threads : {1, 2}) {
          for (const Boundary& boundary : kBoundaries) {
            for (size_t culprit : {size_t{0}, size_t(trainers - 1)}) {
              // The value alternates, so both kinds are found at some boundary.
              const double bad = boundary.index % 2 == 0 ? nan : -inf;
              SCOPED_TRACE(testing::Message()
                           << DTypeName(dtype) << ", " << trainers << " trainers, " << nodes
                           << " nodes, " << threads << " threads, " << boundary.what << " ("
                           << boundary.index << "), trainer " << culprit << ", value " << bad);
              std::vector<std::vector<uint8_t>> memory(
                  trainers, std::vector<uint8_t>(kBoundaryElements * esize));
              std::vector<uint8_t*> arenas;
              for (int t = 0; t < trainers; ++t) {
                for (size_t i = 0; i < kBoundaryElements; ++i) {
                  Store(dtype, memory[t].data(), i, 0.5 * (t + 1));
                }
                arenas.push_back(memory[t].data());
              }
              Store(dtype, arenas[culprit], boundary.index, bad);
              LocalReducer reducer(threads,
                                   LocalReducer::StagingBytes(kBoundaryElements * 8, dtype));
              LocalBackend local;
              AddConstantBackend remote(0.5);
              Backend& backend = nodes == 1 ? static_cast<Backend&>(local) : remote;
              NonFiniteReport report;
              ASSERT_TRUE(reducer
                              .Reduce(arenas, {{0, kBoundaryElements * esize}}, dtype,
                                      trainers * nodes, backend, nullptr, 0, &report)
                              .ok());
              EXPECT_TRUE(report.result_non_finite);
              ASSERT_TRUE(report.local);
              EXPECT_EQ(report.trainer, culprit);
              EXPECT_EQ(report.arena_offset, boundary.index * esize);
              if (std::isnan(bad)) {
                EXPECT_TRUE(std::isnan(report.value)) << report.value;
              } else {
                EXPECT_EQ(report.value, bad);
              }
            }
          }
        }
      }
    }
  }
}

TEST(LocalReducerNonFiniteTest, CleanBucketReportsNothing) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    for (int nodes : {1, 2}) {
      Arenas a(2, dtype);
      LocalReducer reducer(2, LocalReducer::StagingBytes(kElements * 8, dtype));
      LocalBackend local;
      AddConstantBackend remote(0.5);
      Backend& backend = nodes == 1 ? static_cast<Backend&>(local) : remote;
      NonFiniteReport report;
      report.result_non_finite = report.local = true;  // must be reset
      ASSERT_TRUE(reducer
                      .Reduce(a.ptrs, {{0, kElements * DTypeSize(dtype)}}, dtype, 2 * nodes,
                              backend, nullptr, 0, &report)
                      .ok());
      EXPECT_FALSE(report.result_non_finite) << DTypeName(dtype) << " nodes " << nodes;
      EXPECT_FALSE(report.local);
    }
  }
}

TEST(LocalReducerNonFiniteTest, AnotherNodesNanIsSeenInTheResultButBlamesNoLocalTrainer) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kBFloat16}) {
    Arenas a(2, dtype);
    LocalReducer reducer(1, LocalReducer::StagingBytes(kElements * 8, dtype));
    AddConstantBackend remote(std::numeric_limits<double>::quiet_NaN());
    NonFiniteReport report;
    ASSERT_TRUE(reducer
                    .Reduce(a.ptrs, {{0, kElements * DTypeSize(dtype)}}, dtype, 4, remote, nullptr,
                            0, &report)
                    .ok());
    EXPECT_TRUE(report.result_non_finite) << DTypeName(dtype);
    EXPECT_FALSE(report.local) << DTypeName(dtype);
  }
}

TEST(LocalReducerNonFiniteTest, WithoutAReportTheNanPassesThrough) {
  Arenas a(2, DType::kFloat32);
  Store(DType::kFloat32, a.ptrs[1], 7, std::numeric_limits<double>::quiet_NaN());
  LocalReducer reducer(1, 0);
  LocalBackend local;
  ASSERT_TRUE(
      reducer.Reduce(a.ptrs, {{0, kElements * 4}}, DType::kFloat32, 2, local, nullptr).ok());
  EXPECT_TRUE(std::isnan(reinterpret_cast<float*>(a.ptrs[0])[7]));
  EXPECT_TRUE(std::isnan(reinterpret_cast<float*>(a.ptrs[1])[7]));
}

}  // namespace
}  // namespace gradsync
