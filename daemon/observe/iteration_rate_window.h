// IterationRateWindow: how fast a job runs now, from its last few iteration
// completions (steady-clock ns), not averaged since the job started: a
// start-up of seconds would make a fast job look slow for a long time, and
// a config change's switch iteration is chosen from this rate.
//
// Threads: Record is called by the scheduler thread (no allocation); PerSecond
// from any thread.
#ifndef GRADSYNC_DAEMON_OBSERVE_ITERATION_RATE_WINDOW_H_
#define GRADSYNC_DAEMON_OBSERVE_ITERATION_RATE_WINDOW_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class IterationRateWindow {
 public:
  static constexpr size_t kWindow = 16;  // completions kept
  static constexpr size_t kShort = 4;    // a sub-window that follows a speed-up sooner

  // One iteration ran from `start_ns` (its first mark) to `end_ns`.
  void Record(int64_t start_ns, int64_t end_ns) ABSL_LOCKS_EXCLUDED(mu_);

  // Iterations per second: the faster of the rate over the last kWindow
  // completions and over the last kShort (erring fast is safe: a switch
  // iteration further ahead). With one completion, 1 / its duration (from
  // its first mark, so faster than the real rate); 0 with none.
  double PerSecond() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Over the last n (>= 2) completions, or as many as are kept.
  double RateOverLocked(uint64_t n) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::array<int64_t, kWindow> ends_ns_ ABSL_GUARDED_BY(mu_){};  // a ring
  uint64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_duration_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_ITERATION_RATE_WINDOW_H_
