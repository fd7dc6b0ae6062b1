// monotonic_wait_probe: one timed wait of each kind, for monotonic_mutex_test
// to run under a faked wall clock (libfaketime). Prints
//   wall_s=<absl::Now() in seconds> await_ms=<elapsed> condvar_ms=<elapsed>
// with the elapsed times on the monotonic clock, and exits 0.
// `--impl=absl` waits with absl::Mutex instead: what MonotonicMutex replaces
// (under an offset of +1 h its waits last an hour, under -1 h they return at
// once).
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/monotonic_mutex.h"

namespace {

constexpr absl::Duration kWait = absl::Milliseconds(300);

using Clock = std::chrono::steady_clock;

long long MsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const bool absl_impl = argc > 1 && std::strcmp(argv[1], "--impl=absl") == 0;
  bool never = false;
  long long await_ms = 0, condvar_ms = 0;
  if (absl_impl) {
    absl::Mutex mu;
    absl::CondVar cv;
    absl::MutexLock lock(&mu);
    Clock::time_point start = Clock::now();
    mu.AwaitWithTimeout(absl::Condition(&never), kWait);
    await_ms = MsSince(start);
    start = Clock::now();
    cv.WaitWithTimeout(&mu, kWait);
    condvar_ms = MsSince(start);
  } else {
    gradsync::MonotonicMutex mu;
    gradsync::MonotonicCondVar cv;
    gradsync::MonotonicMutexLock lock(&mu);
    Clock::time_point start = Clock::now();
    mu.AwaitWithTimeout(absl::Condition(&never), kWait);
    await_ms = MsSince(start);
    start = Clock::now();
    cv.WaitWithTimeout(&mu, kWait);
    condvar_ms = MsSince(start);
  }
  std::printf("wall_s=%lld await_ms=%lld condvar_ms=%lld\n",
              static_cast<long long>(absl::ToUnixSeconds(absl::Now())), await_ms, condvar_ms);
  return 0;
}
