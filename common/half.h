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

#if defined(__FLT16_MAX__)
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
#else
// Compilers without _Float16 on this target (clang < 15 on x86-64, used for
// the thread-safety build): the same conversions on the bits.
inline float Float16ToFloat(uint16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x8000u) << 16;
  const uint32_t exponent = (v >> 10) & 0x1fu;
  const uint32_t mantissa = v & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    // inf; a NaN comes out quiet, as from the hardware conversion
    bits = sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;  // zero, subnormal: exact
    std::memcpy(&bits, &magnitude, sizeof(bits));
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | ((x >> 13) & 0x3ffu);  // a quiet NaN
  if (x < 0x38800000u) {
    // Below 2^-14: adding 0.5f makes the FPU round to the subnormal grid
    // (2^-24, nearest even); the low bits are then the half's mantissa.
    float magnitude;
    std::memcpy(&magnitude, &x, sizeof(magnitude));
    magnitude += 0.5f;
    uint32_t bits;
    std::memcpy(&bits, &magnitude, sizeof(bits));
    return sign | static_cast<uint16_t>(bits - 0x3f000000u);
  }
  // Rebias the exponent and round the 13 dropped bits to nearest even; a
  // carry moves into the exponent, and past the largest half gives inf.
  x = x - (112u << 23) + 0xfffu + ((x >> 13) & 1u);
  x >>= 13;
  return sign | static_cast<uint16_t>(x >= 0x7c00u ? 0x7c00u : x);
}
#endif

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_HALF_H_
