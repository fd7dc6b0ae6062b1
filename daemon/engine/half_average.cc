#include "daemon/engine/half_average.h"

#include <algorithm>
#include <cstring>

#include "common/half_convert.h"
#include "common/half_lanes.h"

namespace gradsync {
namespace {

// local_reducer.cc's kStreamBlockElements: a non-finite average leaves the
// same elements unwritten.
constexpr size_t kCheckBlock = 64;
// Averaged at a time, then checked and copied out: still in L1.
constexpr size_t kBlock = 16 * kCheckBlock;

using LanesFn = size_t (*)(uint16_t* const*, size_t, uint64_t, size_t, float, uint16_t*);

#if defined(__x86_64__) || defined(__i386__)
template <bool kBFloat16>
__attribute__((target("avx2,f16c"))) inline __m256 WidenLanes(const uint16_t* in) {
  return kBFloat16 ? BFloat16ToFloatLanes(in) : Float16ToFloatLanes(in);
}

// Eight elements at a time: each trainer's lanes widened, summed in order,
// divided and narrowed in registers (no pass through memory in between).
// Returns how many of the m elements it averaged (a multiple of eight).
template <bool kBFloat16>
__attribute__((target("avx2,f16c"))) size_t AverageLanes(uint16_t* const* trainers, size_t local,
                                                         uint64_t c, size_t m, float divisor,
                                                         uint16_t* average) {
  const __m256 d = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + 8 <= m; i += 8) {
    __m256 acc = WidenLanes<kBFloat16>(trainers[0] + c + i);
    for (size_t t = 1; t < local; ++t) {
      acc = _mm256_add_ps(acc, WidenLanes<kBFloat16>(trainers[t] + c + i));
    }
    const __m256 quotient = _mm256_div_ps(acc, d);
    if (kBFloat16) {
      FloatToBFloat16Lanes(quotient, average + i);
    } else {
      FloatToFloat16Lanes(quotient, average + i);
    }
  }
  return i;
}

LanesFn LanesFor(DType dtype) {
  // Built for both extensions: every AVX2 CPU has F16C, the check is for form.
  if (dtype == DType::kBFloat16) {
    return HardwareConvertsBFloat16() && HardwareConvertsFloat16() ? &AverageLanes<true> : nullptr;
  }
  return HardwareConvertsFloat16() ? &AverageLanes<false> : nullptr;
}
#else
LanesFn LanesFor(DType) { return nullptr; }
#endif

struct Conversions {
  void (*widen)(const uint16_t*, float*, size_t);
  void (*narrow)(const float*, uint16_t*, size_t);
  uint16_t exponent_mask;
  uint16_t exponent_one;
  LanesFn lanes;  // null: the CPU converts no lanes (or software is forced)
};

Conversions ConversionsFor(DType dtype) {
  if (dtype == DType::kBFloat16) {
    return {&BFloat16ToFloatBlock, &FloatToBFloat16Block, 0x7f80u, 0x0080u, LanesFor(dtype)};
  }
  return {&Float16ToFloatBlock, &FloatToFloat16Block, 0x7c00u, 0x0400u, LanesFor(dtype)};
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

// average[0, m) = ((t0 + t1) + t2 ...) / divisor over elements [c, c + m),
// through whole blocks of conversions.
void AverageConverted(uint16_t* const* trainers, size_t local, uint64_t c, size_t m, float divisor,
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

// AverageConverted's result, eight lanes at a time where the CPU can.
void AverageBlock(uint16_t* const* trainers, size_t local, uint64_t c, size_t m, float divisor,
                  const Conversions& conv, uint16_t* average) {
  const size_t done =
      conv.lanes != nullptr ? conv.lanes(trainers, local, c, m, divisor, average) : 0;
  if (done < m)
    AverageConverted(trainers, local, c + done, m - done, divisor, conv, average + done);
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

// Writes average[0, m) (elements [c, c + m)) into every trainer, each
// check block only if it is finite (see AverageHalves).
void WriteChecked(const uint16_t* average, size_t m, uint16_t* const* trainers, size_t local,
                  uint64_t c, const Conversions& conv, bool* any_bad) {
  for (size_t b = 0; b < m; b += kCheckBlock) {
    const size_t n = std::min(kCheckBlock, m - b);
    if (NonFiniteWord(average + b, n, conv) != 0) {
      *any_bad = true;
      if (local == 2 && n < kCheckBlock) {
        WriteFiniteElements(average + b, n, conv, trainers[0] + c + b, trainers[1] + c + b);
        continue;
      }
      if (local > 1) continue;
    }
    for (size_t t = 0; t < local; ++t) {
      std::memcpy(trainers[t] + c + b, average + b, n * sizeof(uint16_t));
    }
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
    // A finite block (the usual case) is copied out whole.
    if (check && NonFiniteWord(average, m, conv) != 0) {
      WriteChecked(average, m, trainers, local, c, conv, &any_bad);
      continue;
    }
    for (size_t t = 0; t < local; ++t) std::memcpy(trainers[t] + c, average, m * sizeof(uint16_t));
  }
  return any_bad;
}

}  // namespace gradsync
