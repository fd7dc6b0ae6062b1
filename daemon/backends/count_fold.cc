#include "daemon/backends/count_fold.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

constexpr int kLimbBits = 16;
constexpr double kMaxCount = 9007199254740992.0;  // 2^53

template <typename T>
void Encode(const double* counts, size_t n, T* out) {
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = static_cast<uint64_t>(counts[i]);
    for (size_t l = 0; l < kCountLimbs; ++l, v >>= kLimbBits) {
      out[i * kCountLimbs + l] = static_cast<T>(v & ((1u << kLimbBits) - 1));
    }
  }
}

template <typename T>
void Decode(const T* in, size_t n, double* counts) {
  for (size_t i = 0; i < n; ++i) {
    // Each summed limb is a whole number below 2^24: the weighted sum is
    // exact in double for every total below 2^53.
    double v = 0;
    for (size_t l = kCountLimbs; l-- > 0;) {
      v = v * (1 << kLimbBits) + static_cast<double>(in[i * kCountLimbs + l]);
    }
    counts[i] = v;
  }
}

}  // namespace

bool CanFoldCounts(size_t count, DType dtype, WireDType wire, int num_nodes, size_t n) {
  if (n == 0 || num_nodes < 2 || num_nodes >= 256) return false;
  if (dtype != DType::kFloat64 && !(dtype == DType::kFloat32 && wire == WireDType::kOff)) {
    return false;
  }
  return count * DTypeSize(dtype) <= kCountFoldMaxBytes;
}

absl::Status EncodeCounts(const double* counts, size_t n, DType dtype, void* out) {
  for (size_t i = 0; i < n; ++i) {
    const double c = counts[i];
    if (!(c >= 0 && c < kMaxCount && std::floor(c) == c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("count ", i, " = ", c, " is not a whole number in [0, 2^53)"));
    }
  }
  if (dtype == DType::kFloat64) {
    Encode(counts, n, static_cast<double*>(out));
  } else {
    Encode(counts, n, static_cast<float*>(out));
  }
  return absl::OkStatus();
}

void DecodeCounts(const void* in, size_t n, DType dtype, double* counts) {
  if (dtype == DType::kFloat64) {
    Decode(static_cast<const double*>(in), n, counts);
  } else {
    Decode(static_cast<const float*>(in), n, counts);
  }
}

}  // namespace gradsync
