// The arithmetic of the Gloo worker's average, shared by the pass that
// divides a summed piece (worker_arenas.h) and the ring reduction that
// divides as it sums (ring_average.h): both must write the same bits.
#ifndef GRADSYNC_DAEMON_BACKENDS_AVERAGE_MATH_H_
#define GRADSYNC_DAEMON_BACKENDS_AVERAGE_MATH_H_

#include <cstring>

namespace gradsync {

#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "the average's NaN/Inf check needs IEEE x - x: build without -ffinite-math-only"
#endif

// x - x is +0 for every finite x, NaN for an Inf or a NaN: a subtract and
// an OR per element, as the daemon's own check (local_reducer.cc).
template <typename T, typename Bits>
inline Bits Poison(T v) {
  const T zero_if_finite = v - v;
  Bits bits;
  std::memcpy(&bits, &zero_if_finite, sizeof(bits));
  return bits;
}

// x / d, or x * (1 / d) where d is a power of two: 1 / d is then exact, so
// the product is the same correctly rounded x / d, bit for bit (subnormal
// results included), at a multiply's cost instead of a divide's.
template <typename T, bool kByReciprocal>
struct Divide {
  T operator()(T x) const { return kByReciprocal ? x * factor : x / factor; }
  T factor;
};

inline bool IsPowerOfTwo(int divisor) { return divisor > 0 && (divisor & (divisor - 1)) == 0; }

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_AVERAGE_MATH_H_
