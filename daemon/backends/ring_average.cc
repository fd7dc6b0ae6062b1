#include "daemon/backends/ring_average.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/backends/average_math.h"
#include "daemon/backends/gather_sum.h"

namespace gradsync {

bool CanAverageInRing(size_t count, DType dtype, WireDType wire, int num_nodes) {
  if (num_nodes != 2 || count == 0) return false;
  if (dtype == DType::kFloat32 && wire != WireDType::kOff) return false;
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64) return false;
  return !UseGatherSum(count, dtype, wire, num_nodes);
}

ElementRange RingOwnedElements(size_t count, size_t element_size, int node_rank) {
  const size_t total = count * element_size;
  const size_t max_segment = gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize;
  auto round_up = [](size_t n, size_t m) { return (n + m - 1) / m * m; };
  const size_t segments = round_up(std::max((total + max_segment - 1) / max_segment, size_t{4}), 2);
  const size_t segment_bytes = round_up((total + segments - 1) / segments, element_size);
  const size_t half = segments / 2 * segment_bytes;
  const size_t r = static_cast<size_t>(node_rank);
  return {std::min(r * half, total) / element_size, std::min((r + 1) * half, total) / element_size};
}

RingAverage::RingAverage(char* base, size_t count, DType dtype, int divisor, bool check)
    : base_(base), count_(count), check_(check), divisor_(divisor) {
  const bool by_reciprocal = IsPowerOfTwo(divisor);
  if (dtype == DType::kFloat64) {
    reduce_ = by_reciprocal ? &Reduce<double, uint64_t, true> : &Reduce<double, uint64_t, false>;
  } else {
    reduce_ = by_reciprocal ? &Reduce<float, uint32_t, true> : &Reduce<float, uint32_t, false>;
  }
}

gloo::AllreduceOptions::Func RingAverage::ReduceFunction() {
  return
      [this](void* out, const void* a, const void* b, size_t n) { reduce_(*this, out, a, b, n); };
}

// gloo::sum's a + b, then the divide, in one loop. Checking, a block's
// averages go to the stack first: the check rides on the values just
// computed, and only a block with a NaN or Inf reads its own inputs again,
// before the store overwrites them.
template <typename T, typename Bits, bool kByReciprocal>
void RingAverage::Reduce(RingAverage& self, void* out, const void* a, const void* b, size_t n) {
  T* c = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  const T d = static_cast<T>(self.divisor_);
  const Divide<T, kByReciprocal> div{kByReciprocal ? T{1} / d : d};
  if (self.check_) {
    const T* own = static_cast<const T*>(OwnInput(out, a, b));
    self.own_unknown_ |= own == nullptr;
    constexpr size_t kBlock = 512;
    T block[kBlock];
    for (size_t at = 0; at < n; at += kBlock) {
      const size_t m = std::min(kBlock, n - at);
      Bits poison = 0;
      for (size_t i = 0; i < m; ++i) {
        block[i] = div(x[at + i] + y[at + i]);
        poison |= Poison<T, Bits>(block[i]);
      }
      if (poison != 0 && own != nullptr) self.NoteInput(own + at, m);
      std::memcpy(c + at, block, m * sizeof(T));
      self.poison_ |= poison;
    }
  } else {
    for (size_t i = 0; i < n; ++i) c[i] = div(x[i] + y[i]);
  }
  self.Record(out, n, sizeof(T));
}

const void* RingAverage::OwnInput(const void* out, const void* a, const void* b) {
  if (a == out) return a;
  return b == out ? b : nullptr;
}

template <typename T>
void RingAverage::NoteInput(const T* own, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isfinite(own[i])) continue;
    const size_t element = static_cast<size_t>(own + i - reinterpret_cast<const T*>(base_));
    if (!input_found_ || element < input_element_) {
      input_found_ = true;
      input_element_ = element;
      input_value_ = static_cast<double>(own[i]);
    }
    return;
  }
}

void RingAverage::Record(const void* out, size_t n, size_t element_size) {
  const char* p = static_cast<const char*>(out);
  if (p < base_ || p + n * element_size > base_ + count_ * element_size) {
    outside_ = true;
    return;
  }
  const size_t first = static_cast<size_t>(p - base_) / element_size;
  begin_ = reduced_ == 0 ? first : std::min(begin_, first);
  end_ = reduced_ == 0 ? first + n : std::max(end_, first + n);
  reduced_ += n;
}

absl::Status RingAverage::Verify() const {
  // Reduced ranges that add up to more than their span overlap.
  if (own_unknown_) {
    return absl::InternalError(
        "Gloo's ring reduced into neither of its inputs: this node's own inputs could not be "
        "checked for NaN or Inf");
  }
  if (outside_ || reduced_ > end_ - begin_) {
    return absl::InternalError(absl::StrCat(
        "Gloo's ring reduced ", reduced_, " elements of a ", count_, "-element piece in [", begin_,
        ", ", end_, ")", outside_ ? " and outside it" : "",
        " on this node: an element averaged twice would be wrong"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
