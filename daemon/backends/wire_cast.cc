#include "daemon/backends/wire_cast.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/half.h"

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

template <bool kHalf>
void Narrow(uint8_t* bytes, size_t count, float scale) {
  float in[kChunk];
  uint16_t out[kChunk];
  for (size_t i = 0; i < count; i += kChunk) {
    const size_t m = std::min(kChunk, count - i);
    std::memcpy(in, bytes + i * sizeof(float), m * sizeof(float));
    for (size_t k = 0; k < m; ++k) {
      out[k] = kHalf ? ToFloat16Saturating(in[k] * scale) : FloatToBFloat16(in[k] * scale);
    }
    std::memcpy(bytes + i * sizeof(uint16_t), out, m * sizeof(uint16_t));
  }
}

template <bool kHalf>
void Widen(uint8_t* bytes, size_t count, float unscale) {
  uint16_t in[kChunk];
  float out[kChunk];
  // Backwards: the fp32 results of chunk [i, i+m) land on 16-bit elements
  // at 2i and beyond, which were all read already.
  for (size_t end = count; end > 0;) {
    const size_t m = std::min(kChunk, end);
    const size_t i = end - m;
    std::memcpy(in, bytes + i * sizeof(uint16_t), m * sizeof(uint16_t));
    for (size_t k = 0; k < m; ++k) {
      out[k] = (kHalf ? Float16ToFloat(in[k]) : BFloat16ToFloat(in[k])) * unscale;
    }
    std::memcpy(bytes + i * sizeof(float), out, m * sizeof(float));
    end = i;
  }
}

template <bool kHalf>
void Sum(void* c, const void* a, const void* b, size_t n) {
  // Gloo may pass c == a: element-wise, each read before its write.
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  auto* z = static_cast<uint16_t*>(c);
  for (size_t i = 0; i < n; ++i) {
    if (kHalf) {
      z[i] = ToFloat16Saturating(Float16ToFloat(x[i]) + Float16ToFloat(y[i]));
    } else {
      z[i] = FloatToBFloat16(BFloat16ToFloat(x[i]) + BFloat16ToFloat(y[i]));
    }
  }
}

}  // namespace

uint16_t NarrowOne(float value, WireDType wire) {
  return wire == WireDType::kFloat16 ? ToFloat16Saturating(value) : FloatToBFloat16(value);
}

float WidenOne(uint16_t value, WireDType wire) {
  return wire == WireDType::kFloat16 ? Float16ToFloat(value) : BFloat16ToFloat(value);
}

void NarrowInPlace(void* data, size_t count, WireDType wire, float scale) {
  auto* bytes = static_cast<uint8_t*>(data);
  if (wire == WireDType::kFloat16) {
    Narrow<true>(bytes, count, scale);
  } else if (wire == WireDType::kBFloat16) {
    Narrow<false>(bytes, count, scale);
  }
}

void WidenInPlace(void* data, size_t count, WireDType wire, float unscale) {
  auto* bytes = static_cast<uint8_t*>(data);
  if (wire == WireDType::kFloat16) {
    Widen<true>(bytes, count, unscale);
  } else if (wire == WireDType::kBFloat16) {
    Widen<false>(bytes, count, unscale);
  }
}

WireReduceFn WireSum(WireDType wire) {
  return wire == WireDType::kFloat16 ? &Sum<true> : &Sum<false>;
}

}  // namespace gradsync
