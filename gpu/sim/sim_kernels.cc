#include "gpu/sim/sim_kernels.h"

#include <cstdint>
#include <cstring>

#include "common/half.h"

namespace gradsync::gpu::sim {
namespace {

// Exponent bits all ones (Inf or NaN), as the CUDA kernel tests them.
bool NotFinite(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}
bool NotFinite(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
}

// Element i of every source is read before dst[i] is written: dst may alias
// a source. `flag` non-null: the non-finite check (sim_kernels.h).
template <typename T, typename Acc, typename Load, typename Store, typename Bad>
void SumAs(void* dst, const std::vector<const void*>& srcs, size_t count, Acc scale, Load load,
           Store store, Bad not_finite, uint32_t* flag, uint32_t token) {
  T* out = static_cast<T*>(dst);
  bool hit = false;
  for (size_t i = 0; i < count; ++i) {
    const T first = static_cast<const T*>(srcs[0])[i];
    Acc acc = load(first);
    for (size_t k = 1; k < srcs.size(); ++k) acc += load(static_cast<const T*>(srcs[k])[i]);
    T result = store(acc * scale);
    if (flag != nullptr && not_finite(result)) {
      result = first;
      hit = true;
    }
    out[i] = result;
  }
  if (hit) *flag = token;
}

}  // namespace

void SumKernel(void* dst, const std::vector<const void*>& srcs, size_t count, DType dtype,
               double scale, uint32_t* flag, uint32_t token) {
  if (srcs.empty()) return;
  switch (dtype) {
    case DType::kFloat32:
      SumAs<float, float>(
          dst, srcs, count, static_cast<float>(scale), [](float v) { return v; },
          [](float v) { return v; }, [](float v) { return NotFinite(v); }, flag, token);
      return;
    case DType::kFloat64:
      SumAs<double, double>(
          dst, srcs, count, scale, [](double v) { return v; }, [](double v) { return v; },
          [](double v) { return NotFinite(v); }, flag, token);
      return;
    case DType::kFloat16:
      SumAs<uint16_t, float>(
          dst, srcs, count, static_cast<float>(scale), Float16ToFloat, FloatToFloat16,
          [](uint16_t v) { return (v & 0x7c00u) == 0x7c00u; }, flag, token);
      return;
    case DType::kBFloat16:
      SumAs<uint16_t, float>(
          dst, srcs, count, static_cast<float>(scale), BFloat16ToFloat, FloatToBFloat16,
          [](uint16_t v) { return (v & 0x7f80u) == 0x7f80u; }, flag, token);
      return;
  }
}

}  // namespace gradsync::gpu::sim
