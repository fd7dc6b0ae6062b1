// Predicts the next output of a std::mt19937_64 from its 312 previous
// outputs (its whole state: tempering is invertible). Tests use it to show
// that ids an attacker sees do not give away the next one.
#ifndef GRADSYNC_TESTS_ENGINE_MT19937_64_PREDICTOR_H_
#define GRADSYNC_TESTS_ENGINE_MT19937_64_PREDICTOR_H_

#include <cstdint>
#include <vector>

namespace gradsync::testing {

inline constexpr size_t kMt64StateWords = 312;

// Undoes mt19937_64's output tempering (each xor-shift step inverted by
// iterating it until every bit is fixed).
inline uint64_t UntemperMt64(uint64_t y) {
  y ^= y >> 43;
  y ^= (y << 37) & 0xFFF7EEE000000000ull;
  uint64_t x = y;
  for (int i = 0; i < 4; ++i) x = y ^ ((x << 17) & 0x71D67FFFEDA60000ull);
  y = x;
  for (int i = 0; i < 3; ++i) x = y ^ ((x >> 29) & 0x5555555555555555ull);
  return x;
}

inline uint64_t TemperMt64(uint64_t y) {
  y ^= (y >> 29) & 0x5555555555555555ull;
  y ^= (y << 17) & 0x71D67FFFEDA60000ull;
  y ^= (y << 37) & 0xFFF7EEE000000000ull;
  y ^= y >> 43;
  return y;
}

// `last` holds the kMt64StateWords most recent outputs, oldest first.
inline uint64_t PredictNextMt64(const std::vector<uint64_t>& last) {
  auto state = [&](size_t i) { return UntemperMt64(last[i]); };
  const uint64_t mixed = (state(0) & 0xFFFFFFFF80000000ull) | (state(1) & 0x7FFFFFFFull);
  uint64_t next = state(156) ^ (mixed >> 1);
  if (mixed & 1) next ^= 0xB5026F5AA96619E9ull;
  return TemperMt64(next);
}

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_ENGINE_MT19937_64_PREDICTOR_H_
