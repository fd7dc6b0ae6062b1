// MonotonicNow(): the time every deadline, timeout and staleness check uses.
//
// absl::Now() is the wall clock: NTP or an operator may step it, and a step
// of +30 s made a healthy job look 30 s silent. This reads
// std::chrono::steady_clock instead, and returns it as an absl::Time so that
// deadline code keeps absl's arithmetic (deadline - now, now + timeout).
//
// The value is a point on the steady clock's own scale (seconds since some
// boot-time epoch, shown as if since 1970): only differences and comparisons
// with other MonotonicNow() values mean anything. Never mix it with
// absl::Now(), never print it as a date, and never hand it to an API that
// expects a wall-clock absl::Time (grpc deadlines): give those a timeout
// computed as `deadline - MonotonicNow()`. Timed waits on a mutex use
// MonotonicMutex (common/monotonic_mutex.h): absl's timed waits, even with
// a timeout, sleep until a CLOCK_REALTIME deadline.
#ifndef GRADSYNC_COMMON_MONOTONIC_H_
#define GRADSYNC_COMMON_MONOTONIC_H_

#include <chrono>
#include <cstdint>
#include <functional>

#include "absl/time/time.h"

namespace gradsync {

// A steady_clock reading as an absl::Time on the monotonic scale above.
inline absl::Time FromSteadyClock(std::chrono::steady_clock::time_point t) {
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 t.time_since_epoch()));
}

inline absl::Time MonotonicNow() { return FromSteadyClock(std::chrono::steady_clock::now()); }

// The same clock in integer nanoseconds, for timestamps that hot paths
// store and subtract (bucket phases, trace events, progress stamps).
inline int64_t MonotonicNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A clock that code wanting an injectable clock (tests) takes; defaults to
// MonotonicNow.
using MonotonicClock = std::function<absl::Time()>;

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_MONOTONIC_H_
