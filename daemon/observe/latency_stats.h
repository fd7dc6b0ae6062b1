// LatencyStats: last / p50 / p99 of a duration over a fixed window of the
// most recent samples (one per bucket and phase; see control.proto's
// LatencyStats).
//
// The window is a ring allocated once at construction: Record() never
// allocates, so the scheduler can call it every iteration. Percentiles use
// the nearest-rank definition over the window (p50 of 1..100 is 50, p99 is
// 99), so every reported value is a latency that was really observed.
//
// Alongside the window, a histogram over fixed bounds counts every sample
// since construction: Prometheus histograms of different nodes add up
// (quantiles of windows cannot be aggregated).
//
// Thread safety: every method may be called from any thread. Record() and
// Summarize() share one absl::Mutex; Record() holds it for a few stores,
// Summarize() only while copying the window (the sort happens outside it).
#ifndef GRADSYNC_DAEMON_OBSERVE_LATENCY_STATS_H_
#define GRADSYNC_DAEMON_OBSERVE_LATENCY_STATS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class LatencyStats {
 public:
  static constexpr size_t kDefaultWindow = 1024;
  // Upper bounds of the histogram's buckets, in µs: 10 µs (a small bucket
  // on one node) to 60 s (a stalled job); +Inf is implied.
  static constexpr std::array<int64_t, 21> kHistogramBoundsUs = {
      10,    25,     50,     100,    250,     500,     1000,    2500,     5000,     10000,   25000,
      50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000, 60000000};

  struct Summary {
    double last_us = 0;  // the most recent sample
    double p50_us = 0;   // over the window; 0 when nothing was recorded
    double p99_us = 0;
    uint64_t count = 0;  // samples recorded since construction (or Reset)
    size_t window = 0;   // samples the percentiles were taken over
    // Since construction (Reset keeps them): samples <= each of
    // kHistogramBoundsUs (cumulative), all samples, and their sum.
    std::vector<uint64_t> histogram_counts;
    uint64_t histogram_total = 0;
    double histogram_sum_us = 0;
  };

  // `window` >= 1: how many recent samples the percentiles cover.
  explicit LatencyStats(size_t window = kDefaultWindow);

  LatencyStats(const LatencyStats&) = delete;
  LatencyStats& operator=(const LatencyStats&) = delete;

  // Adds one sample. Negative durations (a caller's clock mix-up) count as 0.
  void Record(int64_t duration_ns);

  // Convenience: the duration between two steady-clock timestamps.
  void RecordInterval(int64_t start_ns, int64_t end_ns) { Record(end_ns - start_ns); }

  // Allocates a scratch copy of the window; not for the hot path.
  Summary Summarize() const;

  // Forgets every sample (a plan rebuild makes old bucket figures moot).
  void Reset();

  size_t capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::unique_ptr<int64_t[]> samples_ ABSL_GUARDED_BY(mu_);  // ring of durations, ns
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;                  // next slot = count_ % capacity_
  // Per bound, not cumulative; the last slot counts samples above every bound.
  std::array<uint64_t, kHistogramBoundsUs.size() + 1> histogram_ ABSL_GUARDED_BY(mu_) = {};
  int64_t histogram_sum_ns_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_LATENCY_STATS_H_
