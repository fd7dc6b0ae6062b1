#include "daemon/observe/iteration_rate_window.h"

#include <algorithm>

namespace gradsync {

void IterationRateWindow::Record(int64_t start_ns, int64_t end_ns) {
  absl::MutexLock lock(&mu_);
  ends_ns_[recorded_ % kWindow] = end_ns;
  ++recorded_;
  last_duration_ns_ = end_ns - start_ns;
}

double IterationRateWindow::PerSecond() const {
  absl::MutexLock lock(&mu_);
  if (recorded_ == 0) return 0;
  if (recorded_ == 1) return 1e9 / std::max<int64_t>(last_duration_ns_, 1000);
  return std::max(RateOverLocked(kWindow), RateOverLocked(kShort));
}

double IterationRateWindow::RateOverLocked(uint64_t n) const {
  n = std::min<uint64_t>({n, recorded_, kWindow});
  const int64_t newest = ends_ns_[(recorded_ - 1) % kWindow];
  const int64_t oldest = ends_ns_[(recorded_ - n) % kWindow];
  return (n - 1) * 1e9 / std::max<int64_t>(newest - oldest, 1000);
}

}  // namespace gradsync
