// fp16 / bf16 <-> fp32 conversion of whole blocks, with the CPU's vector
// instructions where it has them (F16C for fp16, AVX2 for bf16), chosen at
// run time: the build targets any x86-64, and other architectures compile
// the software loops only. Every path gives the bits common/half.h's
// per-element conversions give (round to nearest even, -0, subnormals,
// infinities, NaN payloads; a signalling NaN comes out quiet), so which
// path ran never changes a result (tests/daemon/half_convert_test.cc).
#ifndef GRADSYNC_COMMON_HALF_CONVERT_H_
#define GRADSYNC_COMMON_HALF_CONVERT_H_

#include <cstddef>
#include <cstdint>

namespace gradsync {

// Whether the block functions below use the vector instructions: the CPU
// has them and software conversion was not forced.
bool HardwareConvertsFloat16();
bool HardwareConvertsBFloat16();

// Forces the software loops (true) or lets the CPU decide (false), for the
// whole process. Tests compare the two paths with it; GRADSYNC_HALF_CONVERSION=software
// in the environment forces software from the start (benchmarks' "before").
void ForceSoftwareHalfConversion(bool force);

// out[i] = in[i] converted, i < n. `in` and `out` must not overlap.
void Float16ToFloatBlock(const uint16_t* in, float* out, size_t n);
void FloatToFloat16Block(const float* in, uint16_t* out, size_t n);
void BFloat16ToFloatBlock(const uint16_t* in, float* out, size_t n);
void FloatToBFloat16Block(const float* in, uint16_t* out, size_t n);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_HALF_CONVERT_H_
