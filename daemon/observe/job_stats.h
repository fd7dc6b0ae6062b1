// JobStats: what one job's scheduler reports, kept for GetStats and
// GetTrace — per-bucket latency windows split into wait-for-ready, local
// reduce and collective, totals, stall reports, and the flight recorder.
// Written by the scheduler thread (no allocation in steady state), read by
// the Control service.
//
// Threads: the On* methods are called by the scheduler thread (OnError also
// by whichever thread fails the job); the readers are thread-safe.
#ifndef GRADSYNC_DAEMON_OBSERVE_JOB_STATS_H_
#define GRADSYNC_DAEMON_OBSERVE_JOB_STATS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/observe/flight_recorder.h"
#include "daemon/observe/iteration_rate_window.h"
#include "daemon/observe/latency_stats.h"
#include "daemon/observe/scheduler_observer.h"
#include "daemon/observe/straggler_tracker.h"
#include "daemon/observe/timeline_writer.h"
#include "gradsync/v1/control.pb.h"

namespace gradsync {

// The proto form of `stats` (window percentiles and histogram).
void FillLatencyStats(const LatencyStats& stats, v1::LatencyStats* out);

class JobStats final : public SchedulerObserver {
 public:
  // `trace_dir`: where traces are written on stalls and timeouts.
  JobStats(int rank_offset, int world_size, size_t recorder_events, std::string trace_dir,
           std::string job_id, int node_rank, int num_nodes, std::vector<std::string> tensor_names);
  // Writes the rest of this job into the timeline, if it streams to one.
  ~JobStats() override;

  // Streams the flight recorder into the whole-run timeline (--trace-file)
  // until this JobStats goes. Call before the scheduler starts.
  void StreamTo(TimelineWriter* timeline);

  void OnReady(uint64_t iteration, int local_rank, uint32_t tensor, bool unused,
               int64_t ns) override;
  void OnBucketFirstReady(uint64_t iteration, uint32_t bucket, int64_t ns) override;
  void OnBucketLastReady(uint64_t iteration, uint32_t bucket, int64_t ns) override;
  void OnBucketDone(const BucketTimeline& timeline) override;
  void OnIterationDone(uint64_t iteration, uint64_t bytes_per_trainer, int64_t start_ns,
                       int64_t end_ns) override;
  void OnStall(uint64_t iteration, uint32_t bucket, double waited_s,
               const char* description) override;
  void OnNonFiniteSkipped(uint64_t iteration, const std::string& trainer) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Also told about stalls (the multi-node link forwards them to the leader).
  // Set before the scheduler starts.
  void set_stall_listener(std::function<void(const std::string&)> listener) {
    stall_listener_ = std::move(listener);
  }
  // Also told each iteration's completion (--autotune). Set before the
  // scheduler starts; runs on the scheduler thread, so it must be quick.
  using IterationListener =
      std::function<void(uint64_t iteration, uint64_t bytes_per_trainer, int64_t end_ns)>;
  void set_iteration_listener(IterationListener listener) {
    iteration_listener_ = std::move(listener);
  }

  // Also records each iteration's duration into `durations` (the daemon's
  // histogram across jobs, which outlives this JobStats). Set before the
  // scheduler starts; null = none.
  void set_iteration_durations(LatencyStats* durations) { iteration_durations_ = durations; }

  // A job error: counted, kept, and (for timeouts) a trace file is written.
  void OnError(const std::string& message, bool write_trace) ABSL_LOCKS_EXCLUDED(mu_);

  // Fills buckets, totals, errors and stalls (not the trainer/job header).
  void FillStats(v1::Stats* out, const std::vector<uint32_t>& tensors_per_bucket) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string TraceJson(const std::string& reason) const;
  // The trace cut to at most `max_bytes` (a gRPC message must fit): the
  // newest events kept, the oldest left out and counted (also in its reason).
  struct BoundedTrace {
    std::string json;
    uint64_t dropped_events = 0;
  };
  BoundedTrace TraceJsonWithin(const std::string& reason, size_t max_bytes) const;
  uint64_t bytes_per_iteration() const { return bytes_per_iteration_.load(); }
  // Who is the straggler (the scheduler feeds it; FillStats reports it).
  StragglerTracker& stragglers() { return stragglers_; }
  const StragglerTracker& stragglers() const { return stragglers_; }
  // Iterations per second lately (IterationRateWindow).
  double RecentIterationRate() const { return rate_window_.PerSecond(); }

 private:
  TraceMetadata Metadata(const std::string& reason) const;
  struct Bucket {
    LatencyStats total, wait_for_ready, local_reduce, collective, write_back;
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> bytes{0};
  };
  // The bucket's stats (created on first use); they have their own
  // synchronization, so the reference is used without mu_.
  Bucket& BucketAt(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void WriteTrace(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  const int rank_offset_, world_size_;
  const std::string trace_dir_, job_id_;
  const int node_rank_, num_nodes_;
  const std::vector<std::string> tensor_names_;
  FlightRecorder recorder_;
  StragglerTracker stragglers_;
  TimelineWriter* timeline_ = nullptr;  // see StreamTo

  mutable absl::Mutex mu_;  // buckets_ growth, errors, stalls, last iteration
  std::vector<std::unique_ptr<Bucket>> buckets_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> iterations_{0};
  IterationRateWindow rate_window_;
  std::atomic<uint64_t> bytes_reduced_{0};
  std::atomic<uint64_t> bytes_per_iteration_{0};
  uint64_t last_iteration_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // This iteration's launch -> done, summed over buckets.
  int64_t last_collective_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pending_collective_ns_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::string> recent_errors_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::StallReport> stalls_ ABSL_GUARDED_BY(mu_);
  uint64_t nonfinite_skipped_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, uint64_t> nonfinite_by_culprit_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&)> stall_listener_;  // see set_stall_listener
  IterationListener iteration_listener_;                    // see set_iteration_listener
  LatencyStats* iteration_durations_ = nullptr;             // see set_iteration_durations
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_JOB_STATS_H_
