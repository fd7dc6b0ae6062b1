#include "daemon/engine/half_average.h"

#include <algorithm>
#include <cstring>

#include "common/half_convert.h"

namespace gradsync {
namespace {

// local_reducer.cc's kStreamBlockElements: a non-finite average leaves the
// same elements unwritten.
constexpr size_t kBlock = 64;

struct Conversions {
  void (*widen)(const uint16_t*, float*, size_t);
  void (*narrow)(const float*, uint16_t*, size_t);
  uint16_t exponent_mask;
  uint16_t exponent_one;
};

Conversions ConversionsFor(DType dtype) {
  if (dtype == DType::kBFloat16) {
    return {&BFloat16ToFloatBlock, &FloatToBFloat16Block, 0x7f80u, 0x0080u};
  }
  return {&Float16ToFloatBlock, &FloatToFloat16Block, 0x7c00u, 0x0400u};
}

// Nonzero iff the half is an Inf or a NaN: an all-ones exponent plus one
// carries into the sign bit.
uint16_t NonFiniteBit(uint16_t v, const Conversions& c) {
  return static_cast<uint16_t>(((v & c.exponent_mask) + c.exponent_one) & 0x8000u);
}

uint16_t NonFiniteWord(const uint16_t* v, size_t m, const Conversions& c) {
  uint16_t word = 0;
  for (size_t i = 0; i < m; ++i) word |= NonFiniteBit(v[i], c);
  return word;
}

// average[0, m) = ((t0 + t1) + t2 ...) / divisor over elements [c, c + m).
void AverageBlock(uint16_t* const* trainers, size_t local, uint64_t c, size_t m, float divisor,
                  const Conversions& conv, uint16_t* average) {
  float acc[kBlock], wide[kBlock];
  conv.widen(trainers[0] + c, acc, m);
  for (size_t t = 1; t < local; ++t) {
    conv.widen(trainers[t] + c, wide, m);
    for (size_t i = 0; i < m; ++i) acc[i] += wide[i];
  }
  for (size_t i = 0; i < m; ++i) acc[i] /= divisor;
  conv.narrow(acc, average, m);
}

// Two trainers' short tail, checked: element by element, as the per-element
// loop writes it.
void WriteFiniteElements(const uint16_t* average, size_t m, const Conversions& conv, uint16_t* a0,
                         uint16_t* a1) {
  for (size_t i = 0; i < m; ++i) {
    if (NonFiniteBit(average[i], conv) != 0) continue;
    a0[i] = average[i];
    a1[i] = average[i];
  }
}

}  // namespace

bool AverageHalves(uint16_t* const* trainers, size_t local, uint64_t count, float divisor,
                   DType dtype, bool check) {
  const Conversions conv = ConversionsFor(dtype);
  uint16_t average[kBlock];
  bool any_bad = false;
  for (uint64_t c = 0; c < count; c += kBlock) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kBlock, count - c));
    AverageBlock(trainers, local, c, m, divisor, conv, average);
    if (check && NonFiniteWord(average, m, conv) != 0) {
      any_bad = true;
      if (local == 2 && m < kBlock) {
        WriteFiniteElements(average, m, conv, trainers[0] + c, trainers[1] + c);
        continue;
      }
      if (local > 1) continue;
    }
    for (size_t t = 0; t < local; ++t) std::memcpy(trainers[t] + c, average, m * sizeof(uint16_t));
  }
  return any_bad;
}

}  // namespace gradsync
