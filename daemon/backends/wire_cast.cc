#include "daemon/backends/wire_cast.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/half.h"
#include "common/half_lanes.h"

namespace gradsync {
namespace {

constexpr float kFloat16Max = 65504.0f;
// Elements converted per step: read into a local array first, so that
// writing the narrow (or wide) values over the same buffer never clobbers
// values not yet read, and no pointer of one type aliases another.
constexpr size_t kChunk = 1024;

uint16_t ToFloat16Saturating(float v) {
  // std::isfinite keeps inf (and NaN) as they are; finite values beyond
  // fp16's range would round to inf.
  if (std::isfinite(v)) v = std::clamp(v, -kFloat16Max, kFloat16Max);
  return FloatToFloat16(v);
}

// common/half.h's rounding without its early return (the tails of the
// vector loops below, and CPUs without AVX2; same results: wire_cast_test).
inline uint16_t ToBFloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// fp16 through the F16C instructions where the CPU has them: the
// compiler's _Float16 conversions are library calls per element, ~20x
// slower (measured with gloo_allreduce_bench's worker_fp16 row).
// (clang 14 knows no "f16c" for __builtin_cpu_supports: CPUID leaf 1 says.)
bool CpuHasF16C() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
         (ecx & bit_F16C) != 0;
}
const bool kHasF16C = CpuHasF16C();

__attribute__((target("avx,f16c"))) inline __m256 Saturate8(__m256 x) {
  const __m256 magnitude = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
  const __m256 is_inf = _mm256_cmp_ps(magnitude, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
  // max/min return their second operand for a NaN: NaN stays NaN.
  const __m256 clamped =
      _mm256_min_ps(_mm256_set1_ps(kFloat16Max), _mm256_max_ps(_mm256_set1_ps(-kFloat16Max), x));
  return _mm256_blendv_ps(clamped, x, is_inf);
}

__attribute__((target("avx,f16c"))) void NarrowFloat16F16C(const float* in, uint16_t* out, size_t m,
                                                           float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t k = 0;
  for (; k + 8 <= m; k += 8) {
    const __m256 x = Saturate8(_mm256_mul_ps(_mm256_loadu_ps(in + k), s));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; k < m; ++k) out[k] = ToFloat16Saturating(in[k] * scale);
}

__attribute__((target("avx,f16c"))) void WidenFloat16F16C(const uint16_t* in, float* out, size_t m,
                                                          float unscale) {
  const __m256 s = _mm256_set1_ps(unscale);
  size_t k = 0;
  for (; k + 8 <= m; k += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + k)));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(x, s));
  }
  for (; k < m; ++k) out[k] = Float16ToFloat(in[k]) * unscale;
}

__attribute__((target("avx,f16c"))) void SumFloat16F16C(void* c, const void* a, const void* b,
                                                        size_t n) {
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  auto* z = static_cast<uint16_t*>(c);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 sum =
        _mm256_add_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))),
                      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(z + i),
                     _mm256_cvtps_ph(Saturate8(sum), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) z[i] = ToFloat16Saturating(Float16ToFloat(x[i]) + Float16ToFloat(y[i]));
}

// bf16 eight at a time where the CPU has AVX2 (the compiler does not
// vectorize the scalar loops at -O2 for the baseline x86-64 target).
const bool kHasAvx2 = __builtin_cpu_supports("avx2");

__attribute__((target("avx2"))) void NarrowBFloat16Avx2(const float* in, uint16_t* out, size_t m,
                                                        float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t k = 0;
  for (; k + 8 <= m; k += 8) {
    FloatToBFloat16Lanes(_mm256_mul_ps(_mm256_loadu_ps(in + k), s), out + k);
  }
  for (; k < m; ++k) out[k] = ToBFloat16(in[k] * scale);
}

__attribute__((target("avx2"))) void WidenBFloat16Avx2(const uint16_t* in, float* out, size_t m,
                                                       float unscale) {
  const __m256 s = _mm256_set1_ps(unscale);
  size_t k = 0;
  for (; k + 8 <= m; k += 8)
    _mm256_storeu_ps(out + k, _mm256_mul_ps(BFloat16ToFloatLanes(in + k), s));
  for (; k < m; ++k) out[k] = BFloat16ToFloat(in[k]) * unscale;
}

__attribute__((target("avx2"))) void SumBFloat16Avx2(void* c, const void* a, const void* b,
                                                     size_t n) {
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  auto* z = static_cast<uint16_t*>(c);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    FloatToBFloat16Lanes(_mm256_add_ps(BFloat16ToFloatLanes(x + i), BFloat16ToFloatLanes(y + i)),
                         z + i);
  }
  for (; i < n; ++i) z[i] = ToBFloat16(BFloat16ToFloat(x[i]) + BFloat16ToFloat(y[i]));
}

void NarrowChunk(const float* in, uint16_t* out, size_t m, WireDType wire, float scale) {
  if (wire == WireDType::kBFloat16 && kHasAvx2) {
    NarrowBFloat16Avx2(in, out, m, scale);
  } else if (wire == WireDType::kBFloat16) {
    for (size_t k = 0; k < m; ++k) out[k] = ToBFloat16(in[k] * scale);
  } else if (kHasF16C) {
    NarrowFloat16F16C(in, out, m, scale);
  } else {
    for (size_t k = 0; k < m; ++k) out[k] = ToFloat16Saturating(in[k] * scale);
  }
}

void WidenChunk(const uint16_t* in, float* out, size_t m, WireDType wire, float unscale) {
  if (wire == WireDType::kBFloat16 && kHasAvx2) {
    WidenBFloat16Avx2(in, out, m, unscale);
  } else if (wire == WireDType::kBFloat16) {
    for (size_t k = 0; k < m; ++k) out[k] = BFloat16ToFloat(in[k]) * unscale;
  } else if (kHasF16C) {
    WidenFloat16F16C(in, out, m, unscale);
  } else {
    for (size_t k = 0; k < m; ++k) out[k] = Float16ToFloat(in[k]) * unscale;
  }
}

void SumBFloat16(void* c, const void* a, const void* b, size_t n) {
  // Gloo may pass c == a: element-wise, each read before its write.
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  auto* z = static_cast<uint16_t*>(c);
  for (size_t i = 0; i < n; ++i) z[i] = ToBFloat16(BFloat16ToFloat(x[i]) + BFloat16ToFloat(y[i]));
}

void SumFloat16(void* c, const void* a, const void* b, size_t n) {
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  auto* z = static_cast<uint16_t*>(c);
  for (size_t i = 0; i < n; ++i)
    z[i] = ToFloat16Saturating(Float16ToFloat(x[i]) + Float16ToFloat(y[i]));
}

}  // namespace

uint16_t NarrowOne(float value, WireDType wire) {
  return wire == WireDType::kFloat16 ? ToFloat16Saturating(value) : ToBFloat16(value);
}

float WidenOne(uint16_t value, WireDType wire) {
  return wire == WireDType::kFloat16 ? Float16ToFloat(value) : BFloat16ToFloat(value);
}

void NarrowInPlace(void* data, size_t count, WireDType wire, float scale) {
  if (wire == WireDType::kOff) return;
  auto* bytes = static_cast<uint8_t*>(data);
  float in[kChunk];
  uint16_t out[kChunk];
  for (size_t i = 0; i < count; i += kChunk) {
    const size_t m = std::min(kChunk, count - i);
    std::memcpy(in, bytes + i * sizeof(float), m * sizeof(float));
    NarrowChunk(in, out, m, wire, scale);
    std::memcpy(bytes + i * sizeof(uint16_t), out, m * sizeof(uint16_t));
  }
}

void WidenInPlace(void* data, size_t count, WireDType wire, float unscale) {
  if (wire == WireDType::kOff) return;
  auto* bytes = static_cast<uint8_t*>(data);
  uint16_t in[kChunk];
  float out[kChunk];
  // Backwards: the fp32 results of chunk [i, i+m) land on 16-bit elements
  // at 2i and beyond, which were all read already.
  for (size_t end = count; end > 0;) {
    const size_t m = std::min(kChunk, end);
    const size_t i = end - m;
    std::memcpy(in, bytes + i * sizeof(uint16_t), m * sizeof(uint16_t));
    WidenChunk(in, out, m, wire, unscale);
    std::memcpy(bytes + i * sizeof(float), out, m * sizeof(float));
    end = i;
  }
}

WireReduceFn WireSum(WireDType wire) {
  if (wire == WireDType::kBFloat16) return kHasAvx2 ? &SumBFloat16Avx2 : &SumBFloat16;
  return kHasF16C ? &SumFloat16F16C : &SumFloat16;
}

}  // namespace gradsync
