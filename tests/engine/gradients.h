// The gradients the engine tests write, and the check that what came back
// is their average over the world.
#ifndef GRADSYNC_TESTS_ENGINE_GRADIENTS_H_
#define GRADSYNC_TESTS_ENGINE_GRADIENTS_H_

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "tests/engine/in_memory_trainers.h"

namespace gradsync::testing {

// A small model: sizes differ (odd counts, one much larger) so offsets,
// spans, padding and bucket boundaries are all exercised.
inline Layout TestLayout(DType dtype) {
  return {{"embed.weight", dtype, 1000}, {"fc1.weight", dtype, 300}, {"fc1.bias", dtype, 17},
          {"fc2.weight", dtype, 129},    {"fc2.bias", dtype, 3},     {"head.weight", dtype, 64}};
}

inline size_t TensorIndex(const Layout& layout, const std::string& name) {
  for (size_t i = 0; i < layout.size(); ++i) {
    if (layout[i].name == name) return i;
  }
  ADD_FAILURE() << "no tensor " << name;
  return 0;
}

// Global rank `rank`'s gradient at element `e` of tensor `t` in iteration
// `it`: distinct per rank, tensor, element and iteration (a mix-up shows),
// multiples of 1/8 below 32 (exact even in bf16).
inline double GradientValue(int rank, size_t t, size_t e, uint64_t it) {
  return 0.5 * rank + 0.25 * double(t % 4) + 0.125 * double(e % 11) - double(it % 3);
}

// sums[t][e]: the sum over local trainers of what they stored.
using Sums = std::vector<std::vector<double>>;

inline Sums ZeroSums(const Layout& layout) {
  Sums s;
  for (const TensorInfo& t : layout) s.emplace_back(t.numel, 0.0);
  return s;
}

// Writes GradientValue into trainer `tr` (global rank `rank`) and adds what
// was stored (rounded to the dtype) to `sums`.
inline void WriteGradients(InMemoryTrainer& tr, int rank, uint64_t it, Sums* sums) {
  const Layout& layout = tr.layout();
  for (size_t t = 0; t < layout.size(); ++t) {
    for (size_t e = 0; e < layout[t].numel; ++e) {
      (*sums)[t][e] += tr.SetRounded(t, e, GradientValue(rank, t, e, it));
    }
  }
}

// One ulp of the dtype near 1, relative: sums are accumulated in fp32 (or
// fp64) and rounded to the dtype once.
inline double RelativeTolerance(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 1e-6;
    case DType::kFloat64:
      return 1e-12;
    case DType::kFloat16:
      return 1.0 / 1024;
    case DType::kBFloat16:
      return 1.0 / 128;
  }
  return 0;
}

// Every element of every tensor in `tr` equals (sums + remote) / world_size.
inline ::testing::AssertionResult HoldsAverage(const InMemoryTrainer& tr, const Sums& sums,
                                               double remote, int world_size) {
  const Layout& layout = tr.layout();
  size_t wrong = 0;
  std::string first;
  for (size_t t = 0; t < layout.size(); ++t) {
    const double rel = RelativeTolerance(layout[t].dtype);
    for (size_t e = 0; e < layout[t].numel; ++e) {
      const double want = (sums[t][e] + remote) / world_size;
      const double got = tr.Get(t, e);
      if (std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want))) continue;
      if (wrong++ < 3) {
        absl::StrAppend(&first, "\n  ", layout[t].name, "[", e, "] = ", got, ", want ", want);
      }
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << wrong << " elements differ from the average:" << first;
}

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_ENGINE_GRADIENTS_H_
