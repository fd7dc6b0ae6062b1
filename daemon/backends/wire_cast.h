// The casts and the reduction of the compressed cross-node hop (see
// wire_dtype.h), in place in the buffer the collective runs on.
//
// Pre-scaling: NarrowInPlace multiplies by `scale` (1 / world size) before
// rounding, so the 16-bit values are the addends of the average and the
// ring's partial sums stay within the average's magnitude; WidenInPlace
// multiplies by `unscale` (the world size) after, so the caller still sees a sum (its
// write-back divides by the world size as without compression). fp16 then
// overflows only where an element of the average itself exceeds 65504:
// such values saturate at +-65504 (the largest finite fp16) instead of
// becoming inf; inf and NaN gradients stay inf and NaN (so that an AMP
// loss scaler still sees them). bf16 has fp32's range. Rounding is to
// nearest even; sums are done in fp32 and rounded once per ring step.
#ifndef GRADSYNC_DAEMON_BACKENDS_WIRE_CAST_H_
#define GRADSYNC_DAEMON_BACKENDS_WIRE_CAST_H_

#include <cstddef>
#include <cstdint>

#include "daemon/backends/wire_dtype.h"

namespace gradsync {

// fp32 -> 16-bit in place: on return the first `count` uint16 of `data`
// hold the values (the rest of the buffer is garbage). `wire` != kOff.
void NarrowInPlace(void* data, size_t count, WireDType wire, float scale);
// The inverse: the first `count` uint16 of `data` -> `count` fp32.
void WidenInPlace(void* data, size_t count, WireDType wire, float unscale);

// Gloo's reduce function for the wire type: c[i] = a[i] + b[i] on `n`
// 16-bit elements, summed in fp32.
using WireReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);
WireReduceFn WireSum(WireDType wire);

// One element, as NarrowInPlace rounds it (tests, and documentation by code).
uint16_t NarrowOne(float value, WireDType wire);
float WidenOne(uint16_t value, WireDType wire);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_WIRE_CAST_H_
