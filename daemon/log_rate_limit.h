// LogRateLimiter: keeps a warning that anyone can trigger (a refused Watch,
// a client retrying in a loop) from flooding the log, while still saying
// how many there were.
//
// Within an episode (events less than `quiet` apart) the first `burst`
// events are logged; after that one is logged each time the episode's
// count doubles, and at least one per `interval` while they keep coming,
// each carrying the count and how many were left out since the previous
// logged one. Lines per episode: burst + log2(count / burst) + one per
// interval. An event after `quiet` without any starts a new episode (its
// first line reports what the previous one left out unreported).
//
// Thread-safe. Runs on the monotonic clock (common/monotonic.h; injectable).
#ifndef GRADSYNC_DAEMON_LOG_RATE_LIMIT_H_
#define GRADSYNC_DAEMON_LOG_RATE_LIMIT_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/monotonic.h"

namespace gradsync {

class LogRateLimiter {
 public:
  struct Line {
    uint64_t count = 0;       // events in this episode, this one included
    uint64_t suppressed = 0;  // events left out since the previous logged one
  };

  LogRateLimiter(uint64_t burst, absl::Duration interval, absl::Duration quiet,
                 MonotonicClock clock = MonotonicNow);

  // Call once per event: the fields to log it with, or nullopt to leave it out.
  std::optional<Line> Admit() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t burst_;
  const absl::Duration interval_, quiet_;
  const MonotonicClock clock_;
  absl::Mutex mu_;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_logged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_event_ ABSL_GUARDED_BY(mu_);
  absl::Time last_logged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_LOG_RATE_LIMIT_H_
