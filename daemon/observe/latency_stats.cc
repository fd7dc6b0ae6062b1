#include "daemon/observe/latency_stats.h"

#include <algorithm>
#include <vector>

namespace gradsync {
namespace {

double NsToUs(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

// Nearest rank: the smallest sample with at least p% of the window at or
// below it. `sorted` is non-empty and sorted ascending.
int64_t NearestRank(const std::vector<int64_t>& sorted, int percent) {
  const size_t n = sorted.size();
  size_t rank = (n * static_cast<size_t>(percent) + 99) / 100;  // ceil(p * n / 100)
  rank = std::clamp<size_t>(rank, 1, n);
  return sorted[rank - 1];
}

}  // namespace

LatencyStats::LatencyStats(size_t window)
    : capacity_(std::max<size_t>(window, 1)), samples_(new int64_t[capacity_]()) {}

void LatencyStats::Record(int64_t duration_ns) {
  if (duration_ns < 0) duration_ns = 0;
  // The first bound the sample does not exceed; past the end: above all.
  const size_t slot = std::partition_point(kHistogramBoundsUs.begin(), kHistogramBoundsUs.end(),
                                           [duration_ns](int64_t bound_us) {
                                             return bound_us * 1000 < duration_ns;
                                           }) -
                      kHistogramBoundsUs.begin();
  absl::MutexLock lock(&mu_);
  samples_[count_ % capacity_] = duration_ns;
  ++count_;
  ++histogram_[slot];
  histogram_sum_ns_ += duration_ns;
}

LatencyStats::Summary LatencyStats::Summarize() const {
  std::vector<int64_t> window;
  Summary s;
  {
    absl::MutexLock lock(&mu_);
    s.histogram_counts.resize(kHistogramBoundsUs.size());
    uint64_t below = 0;
    for (size_t i = 0; i < kHistogramBoundsUs.size(); ++i) {
      below += histogram_[i];
      s.histogram_counts[i] = below;
    }
    s.histogram_total = below + histogram_.back();
    s.histogram_sum_us = NsToUs(histogram_sum_ns_);
    s.count = count_;
    if (count_ == 0) return s;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(count_, capacity_));
    window.assign(samples_.get(), samples_.get() + n);
    s.last_us = NsToUs(samples_[(count_ - 1) % capacity_]);
  }
  std::sort(window.begin(), window.end());
  s.window = window.size();
  s.p50_us = NsToUs(NearestRank(window, 50));
  s.p99_us = NsToUs(NearestRank(window, 99));
  return s;
}

void LatencyStats::Reset() {
  absl::MutexLock lock(&mu_);
  count_ = 0;
}

}  // namespace gradsync
