// Gradient element types and their sizes. The numbering is gs_dtype's and
// gradsync.v1.DType's.
#ifndef GRADSYNC_COMMON_DTYPE_H_
#define GRADSYNC_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>

namespace gradsync {

enum class DType : int32_t { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

inline constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

inline constexpr bool IsValidDType(int32_t v) { return v >= 0 && v <= 3; }

inline constexpr const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_DTYPE_H_
