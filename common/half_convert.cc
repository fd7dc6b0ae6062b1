#include "common/half_convert.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common/half.h"
#include "common/half_lanes.h"

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

// Eight at a time (common/half_lanes.h); the tail through common/half.h.
__attribute__((target("avx,f16c"))) void Float16ToFloatF16C(const uint16_t* in, float* out,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Float16ToFloatLanes(in + i));
  for (; i < n; ++i) out[i] = Float16ToFloat(in[i]);
}

__attribute__((target("avx,f16c"))) void FloatToFloat16F16C(const float* in, uint16_t* out,
                                                            size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) FloatToFloat16Lanes(_mm256_loadu_ps(in + i), out + i);
  for (; i < n; ++i) out[i] = FloatToFloat16(in[i]);
}

__attribute__((target("avx2"))) void BFloat16ToFloatAvx2(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, BFloat16ToFloatLanes(in + i));
  for (; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
}

__attribute__((target("avx2"))) void FloatToBFloat16Avx2(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) FloatToBFloat16Lanes(_mm256_loadu_ps(in + i), out + i);
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
