// fp16 / bf16 <-> fp32 conversions for reducing half-precision gradients:
// sums are accumulated in fp32 and rounded once (round to nearest even).
#ifndef GRADSYNC_COMMON_HALF_H_
#define GRADSYNC_COMMON_HALF_H_

#include <cstdint>
#include <cstring>

namespace gradsync {

inline float BFloat16ToFloat(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // keep NaN a (quiet) NaN
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE binary16, through the compiler's _Float16 (exact conversions).
inline float Float16ToFloat(uint16_t v) {
  _Float16 h;
  std::memcpy(&h, &v, sizeof(h));
  return static_cast<float>(h);
}

inline uint16_t FloatToFloat16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t v;
  std::memcpy(&v, &h, sizeof(v));
  return v;
}

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_HALF_H_
