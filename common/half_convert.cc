#include "common/half_convert.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GRADSYNC_HALF_CONVERT_X86 1
#endif

namespace gradsync {
namespace {

bool SoftwareForcedByEnvironment() {
  const char* env = std::getenv("GRADSYNC_HALF_CONVERSION");
  return env != nullptr && std::strcmp(env, "software") == 0;
}

std::atomic<bool>& SoftwareForced() {
  static std::atomic<bool> forced{SoftwareForcedByEnvironment()};
  return forced;
}

#if defined(GRADSYNC_HALF_CONVERT_X86)
// F16C's instructions are VEX-encoded: they need the OS to save the AVX
// state too, which __builtin_cpu_supports("avx") checks. (clang 14 knows no
// "f16c" for __builtin_cpu_supports: CPUID leaf 1 says.)
bool CpuHasF16C() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
         (ecx & bit_F16C) != 0;
}

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

// Eight at a time; the tail through common/half.h. The rounding is given
// in the instruction (nearest even), not taken from MXCSR.
__attribute__((target("avx,f16c"))) void Float16ToFloatF16C(const uint16_t* in, float* out,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = Float16ToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void FloatToFloat16F16C(const float* in, uint16_t* out,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToFloat16(in[i]);
}

__attribute__((target("avx2"))) void BFloat16ToFloatAvx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(wide, 16));
  }
  for (; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
}

// common/half.h's FloatToBFloat16 on eight lanes: add 0x7fff plus the kept
// part's lowest bit (nearest even; a carry moves into the exponent, up to
// inf), except a NaN, which keeps its top bits with the quiet bit set.
__attribute__((target("avx2"))) __m128i FloatToBFloat16x8(__m256i bits) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                            _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // packus works within 128-bit lanes; the permute brings elements 0..7 low.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
  return _mm256_castsi256_si128(packed);
}

__attribute__((target("avx2"))) void FloatToBFloat16Avx2(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), FloatToBFloat16x8(bits));
  }
  for (; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
}
#else
bool CpuHasF16C() { return false; }
bool CpuHasAvx2() { return false; }
#endif

}  // namespace

bool HardwareConvertsFloat16() {
  static const bool has = CpuHasF16C();
  return has && !SoftwareForced().load(std::memory_order_relaxed);
}

bool HardwareConvertsBFloat16() {
  static const bool has = CpuHasAvx2();
  return has && !SoftwareForced().load(std::memory_order_relaxed);
}

void ForceSoftwareHalfConversion(bool force) {
  SoftwareForced().store(force, std::memory_order_relaxed);
}

void Float16ToFloatBlock(const uint16_t* in, float* out, size_t n) {
#if defined(GRADSYNC_HALF_CONVERT_X86)
  if (HardwareConvertsFloat16()) return Float16ToFloatF16C(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = Float16ToFloat(in[i]);
}

void FloatToFloat16Block(const float* in, uint16_t* out, size_t n) {
#if defined(GRADSYNC_HALF_CONVERT_X86)
  if (HardwareConvertsFloat16()) return FloatToFloat16F16C(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = FloatToFloat16(in[i]);
}

void BFloat16ToFloatBlock(const uint16_t* in, float* out, size_t n) {
#if defined(GRADSYNC_HALF_CONVERT_X86)
  if (HardwareConvertsBFloat16()) return BFloat16ToFloatAvx2(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
}

void FloatToBFloat16Block(const float* in, uint16_t* out, size_t n) {
#if defined(GRADSYNC_HALF_CONVERT_X86)
  if (HardwareConvertsBFloat16()) return FloatToBFloat16Avx2(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
}

}  // namespace gradsync
