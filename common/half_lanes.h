// Eight fp16 / bf16 <-> fp32 conversions at once (x86-64 with F16C / AVX2
// only: callers compile them into functions of the same target and call
// those only where the CPU has it). The same bits as common/half.h.
#ifndef GRADSYNC_COMMON_HALF_LANES_H_
#define GRADSYNC_COMMON_HALF_LANES_H_

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include <cstdint>

namespace gradsync {

// The rounding is given in the instruction (nearest even), not taken from
// MXCSR.
__attribute__((target("avx,f16c"))) inline __m256 Float16ToFloatLanes(const uint16_t* in) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
}

__attribute__((target("avx,f16c"))) inline void FloatToFloat16Lanes(__m256 x, uint16_t* out) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

__attribute__((target("avx2"))) inline __m256 BFloat16ToFloatLanes(const uint16_t* in) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// common/half.h's FloatToBFloat16 on eight lanes: add 0x7fff plus the kept
// part's lowest bit (nearest even; a carry moves into the exponent, up to
// inf), except a NaN, which keeps its top bits with the quiet bit set.
__attribute__((target("avx2"))) inline void FloatToBFloat16Lanes(__m256 x, uint16_t* out) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // packus works within 128-bit lanes; the permute brings elements 0..7 low.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
}

}  // namespace gradsync

#endif  // x86

#endif  // GRADSYNC_COMMON_HALF_LANES_H_
