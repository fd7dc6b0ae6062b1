// How long the engine tests wait for what must happen.
//
// A passing run never gets near the bound. A broken engine makes waits run
// out; after the first one, later waits in the process get a short bound,
// so a broken build fails every case in seconds and lists them all instead
// of running the test binary into Bazel's timeout.
#ifndef GRADSYNC_TESTS_ENGINE_PATIENCE_H_
#define GRADSYNC_TESTS_ENGINE_PATIENCE_H_

#include <algorithm>
#include <atomic>

#include "absl/time/time.h"

namespace gradsync::testing {

inline constexpr absl::Duration kBound = absl::Seconds(5);
inline constexpr absl::Duration kBoundAfterGivingUp = absl::Milliseconds(250);

inline std::atomic<bool>& GaveUpOnce() {
  static std::atomic<bool> gave_up{false};
  return gave_up;
}

// The bound for a wait that wanted `wanted`.
inline absl::Duration Patience(absl::Duration wanted = kBound) {
  return GaveUpOnce().load() ? std::min(wanted, kBoundAfterGivingUp) : wanted;
}

// Call when a wait ran out: what it waited for never happened.
inline void GaveUp() { GaveUpOnce().store(true); }

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_ENGINE_PATIENCE_H_
