#include "daemon/backends/ring_average.h"

#include <algorithm>

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

// gloo::sum's a + b, then the divide, in one loop; the check rides on the
// value just written.
template <typename T, typename Bits, bool kByReciprocal>
void RingAverage::Reduce(RingAverage& self, void* out, const void* a, const void* b, size_t n) {
  T* c = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  const T d = static_cast<T>(self.divisor_);
  const Divide<T, kByReciprocal> div{kByReciprocal ? T{1} / d : d};
  if (self.check_) {
    Bits poison = 0;
    for (size_t i = 0; i < n; ++i) {
      const T v = div(x[i] + y[i]);
      c[i] = v;
      poison |= Poison<T, Bits>(v);
    }
    self.poison_ |= poison;
  } else {
    for (size_t i = 0; i < n; ++i) c[i] = div(x[i] + y[i]);
  }
  self.Record(out, n, sizeof(T));
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
  if (outside_ || reduced_ > end_ - begin_) {
    return absl::InternalError(absl::StrCat(
        "Gloo's ring reduced ", reduced_, " elements of a ", count_, "-element piece in [", begin_,
        ", ", end_, ")", outside_ ? " and outside it" : "",
        " on this node: an element averaged twice would be wrong"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
