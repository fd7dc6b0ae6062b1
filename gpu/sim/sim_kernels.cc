#include "gpu/sim/sim_kernels.h"

#include <cstdint>
#include <cstring>

#include "common/half.h"

namespace gradsync::gpu::sim {
namespace {

// Element i of every source is read before dst[i] is written: dst may alias
// a source.
template <typename T, typename Acc, typename Load, typename Store>
void SumAs(void* dst, const std::vector<const void*>& srcs, size_t count, Acc scale, Load load,
           Store store) {
  T* out = static_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) {
    Acc acc = load(static_cast<const T*>(srcs[0])[i]);
    for (size_t k = 1; k < srcs.size(); ++k) acc += load(static_cast<const T*>(srcs[k])[i]);
    out[i] = store(acc * scale);
  }
}

}  // namespace

void SumKernel(void* dst, const std::vector<const void*>& srcs, size_t count, DType dtype,
               double scale) {
  if (srcs.empty()) return;
  switch (dtype) {
    case DType::kFloat32:
      SumAs<float, float>(
          dst, srcs, count, static_cast<float>(scale), [](float v) { return v; },
          [](float v) { return v; });
      return;
    case DType::kFloat64:
      SumAs<double, double>(
          dst, srcs, count, scale, [](double v) { return v; }, [](double v) { return v; });
      return;
    case DType::kFloat16:
      SumAs<uint16_t, float>(dst, srcs, count, static_cast<float>(scale), Float16ToFloat,
                             FloatToFloat16);
      return;
    case DType::kBFloat16:
      SumAs<uint16_t, float>(dst, srcs, count, static_cast<float>(scale), BFloat16ToFloat,
                             FloatToBFloat16);
      return;
  }
}

}  // namespace gradsync::gpu::sim
