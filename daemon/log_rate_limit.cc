#include "daemon/log_rate_limit.h"

#include <algorithm>
#include <utility>

namespace gradsync {

LogRateLimiter::LogRateLimiter(uint64_t burst, absl::Duration interval, absl::Duration quiet,
                               MonotonicClock clock)
    : burst_(std::max<uint64_t>(burst, 1)),
      interval_(interval),
      quiet_(quiet),
      clock_(std::move(clock)) {}

std::optional<LogRateLimiter::Line> LogRateLimiter::Admit() {
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  // A new episode; what the last one left out unreported is reported with
  // its first line.
  if (count_ > 0 && now - last_event_ >= quiet_) count_ = 0;
  last_event_ = now;
  ++count_;
  if (count_ <= burst_) {
    next_logged_ = 2 * burst_;
    last_logged_ = now;
    return Line{count_, std::exchange(suppressed_, 0)};
  }
  if (count_ >= next_logged_ || now - last_logged_ >= interval_) {
    while (next_logged_ <= count_) next_logged_ *= 2;
    const Line line{count_, suppressed_};
    suppressed_ = 0;
    last_logged_ = now;
    return line;
  }
  ++suppressed_;
  return std::nullopt;
}

}  // namespace gradsync
