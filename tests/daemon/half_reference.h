// Reference fp32 -> bf16 / fp16 rounding for tests, written without the
// bit tricks of common/half.h: a half format's non-negative encodings decode
// (in double, exactly) to increasing values, so the result is found by
// searching for the two encodings around |f| and comparing |f| with their
// midpoint — round to nearest, ties to the even encoding, past the largest
// finite value to infinity (IEEE 754 with an unbounded exponent, then
// overflow).
#ifndef GRADSYNC_TESTS_DAEMON_HALF_REFERENCE_H_
#define GRADSYNC_TESTS_DAEMON_HALF_REFERENCE_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace gradsync::testing {

struct HalfFormat {
  int mantissa_bits;  // 7 for bf16, 10 for fp16
  int bias;           // 127 for bf16, 15 for fp16
  uint16_t inf;       // the +inf encoding: 0x7f80, 0x7c00
};

inline constexpr HalfFormat kBf16{7, 127, 0x7f80};
inline constexpr HalfFormat kFp16{10, 15, 0x7c00};

// The value of a non-negative encoding in [0, inf]; `inf` itself decodes
// to 2^(emax+1), the next value the exponent would reach if unbounded.
inline double DecodeMagnitude(const HalfFormat& f, uint16_t bits) {
  const int exponent = bits >> f.mantissa_bits;
  const int mantissa = bits & ((1 << f.mantissa_bits) - 1);
  if (exponent == 0) return std::ldexp(mantissa, 1 - f.bias - f.mantissa_bits);  // subnormal
  return std::ldexp((1 << f.mantissa_bits) + mantissa, exponent - f.bias - f.mantissa_bits);
}

// The encoding of the value (any sign) of a non-NaN half; sign-aware.
inline double Decode(const HalfFormat& f, uint16_t bits) {
  const uint16_t magnitude = bits & 0x7fffu;
  const double v = magnitude >= f.inf ? INFINITY : DecodeMagnitude(f, magnitude);
  return (bits & 0x8000u) ? -v : v;
}

// Round-to-nearest-even encoding of a non-NaN float.
inline uint16_t RoundToHalf(const HalfFormat& f, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (std::isinf(x)) return sign | f.inf;
  // lo: the largest encoding in [0, inf] not above |x|.
  uint16_t lo = 0, hi = f.inf;
  if (magnitude >= DecodeMagnitude(f, f.inf)) return sign | f.inf;
  while (hi - lo > 1) {
    const uint16_t m = static_cast<uint16_t>((lo + hi) / 2);
    (DecodeMagnitude(f, m) <= magnitude ? lo : hi) = m;
  }
  if (DecodeMagnitude(f, lo) == magnitude) return sign | lo;
  // Exact in double: both neighbours have at most 11 significant bits.
  const double midpoint = (DecodeMagnitude(f, lo) + DecodeMagnitude(f, lo + 1)) / 2;
  uint16_t r;
  if (magnitude < midpoint) {
    r = lo;
  } else if (magnitude > midpoint) {
    r = lo + 1;
  } else {
    r = (lo % 2 == 0) ? lo : lo + 1;  // a tie: the even encoding (lo + 1 == inf is even)
  }
  return sign | r;
}

inline float FloatFromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t BitsOf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_DAEMON_HALF_REFERENCE_H_
