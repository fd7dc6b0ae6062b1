#include "daemon/observe/job_stats.h"

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "daemon/observe/trace_directory.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

constexpr size_t kKeepErrors = 16;
constexpr size_t kKeepStalls = 16;

void Fill(const LatencyStats& s, v1::LatencyStats* out) { FillLatencyStats(s, out); }

}  // namespace

void FillLatencyStats(const LatencyStats& s, v1::LatencyStats* out) {
  const LatencyStats::Summary sum = s.Summarize();
  out->set_last_us(sum.last_us);
  out->set_p50_us(sum.p50_us);
  out->set_p99_us(sum.p99_us);
  for (int64_t bound : LatencyStats::kHistogramBoundsUs) out->add_histogram_bounds_us(bound);
  for (uint64_t count : sum.histogram_counts) out->add_histogram_counts(count);
  out->set_histogram_count(sum.histogram_total);
  out->set_histogram_sum_us(sum.histogram_sum_us);
}

JobStats::JobStats(int rank_offset, int world_size, size_t recorder_events, std::string trace_dir,
                   std::string job_id, int node_rank, int num_nodes,
                   std::vector<std::string> tensor_names)
    : rank_offset_(rank_offset),
      world_size_(world_size),
      trace_dir_(std::move(trace_dir)),
      job_id_(std::move(job_id)),
      node_rank_(node_rank),
      num_nodes_(num_nodes),
      tensor_names_(std::move(tensor_names)),
      recorder_(recorder_events),
      stragglers_(job_id_, node_rank, num_nodes) {
  stragglers_.set_named_listener([this](uint64_t iteration, int rank) {
    recorder_.Record(TraceEventType::kTrainerStraggler, iteration, static_cast<uint32_t>(rank));
  });
}

JobStats::~JobStats() {
  if (timeline_ != nullptr) timeline_->Unfollow(&recorder_);
}

void JobStats::StreamTo(TimelineWriter* timeline) {
  timeline_ = timeline;
  timeline_->Follow(&recorder_, TimelineSource{job_id_, num_nodes_, tensor_names_});
}

JobStats::Bucket& JobStats::BucketAt(uint32_t id) {
  absl::MutexLock lock(&mu_);
  // Grows only when a plan with more buckets appears: at most a few times.
  while (buckets_.size() <= id) buckets_.push_back(std::make_unique<Bucket>());
  return *buckets_[id];
}

void JobStats::OnReady(uint64_t iteration, int local_rank, uint32_t tensor, bool unused,
                       int64_t ns) {
  recorder_.Record(
      TraceEvent{ns, iteration, static_cast<uint32_t>(rank_offset_ + local_rank), tensor,
                 unused ? TraceEventType::kTrainerUnused : TraceEventType::kTrainerReady});
}

void JobStats::OnBucketFirstReady(uint64_t iteration, uint32_t bucket, int64_t ns) {
  recorder_.Record(TraceEvent{ns, iteration, bucket, kNoTensor, TraceEventType::kBucketFirstReady});
}

void JobStats::OnBucketLastReady(uint64_t iteration, uint32_t bucket, int64_t ns) {
  recorder_.Record(TraceEvent{ns, iteration, bucket, kNoTensor, TraceEventType::kBucketLastReady});
}

void JobStats::OnBucketDone(const BucketTimeline& t) {
  const uint64_t it = t.iteration;
  recorder_.Record(TraceEvent{t.launch_ns, it, t.bucket, kNoTensor, TraceEventType::kBucketLaunch});
  recorder_.Record(
      TraceEvent{t.local_done_ns, it, t.bucket, kNoTensor, TraceEventType::kBucketLocalReduceDone});
  if (num_nodes_ > 1) {
    recorder_.Record(TraceEvent{t.collective_done_ns, it, t.bucket, kNoTensor,
                                TraceEventType::kBucketCollectiveDone});
  }
  recorder_.Record(TraceEvent{t.done_ns, it, t.bucket, kNoTensor, TraceEventType::kBucketComplete});

  Bucket& b = BucketAt(t.bucket);
  b.total.RecordInterval(t.first_ready_ns, t.done_ns);
  b.wait_for_ready.RecordInterval(t.first_ready_ns, t.last_ready_ns);
  // The four phases add up to the bucket's reduction: local reduce is
  // everything but the collective and the write-back.
  b.local_reduce.Record((t.done_ns - t.launch_ns) - (t.collective_done_ns - t.local_done_ns) -
                        t.write_back_ns);
  b.collective.RecordInterval(t.local_done_ns, t.collective_done_ns);
  b.write_back.Record(t.write_back_ns);
  b.count.fetch_add(1, std::memory_order_relaxed);
  b.bytes.store(t.bytes, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  pending_collective_ns_ += t.done_ns - t.launch_ns;
}

void JobStats::OnIterationDone(uint64_t iteration, uint64_t bytes_per_trainer, int64_t start_ns,
                               int64_t end_ns) {
  rate_window_.Record(start_ns, end_ns);
  if (iteration_durations_ != nullptr) iteration_durations_->RecordInterval(start_ns, end_ns);
  if (iteration_listener_) iteration_listener_(iteration, bytes_per_trainer, end_ns);
  iterations_.fetch_add(1, std::memory_order_relaxed);
  bytes_reduced_.fetch_add(bytes_per_trainer, std::memory_order_relaxed);
  bytes_per_iteration_.store(bytes_per_trainer, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  last_iteration_bytes_ = bytes_per_trainer;
  last_collective_ns_ = pending_collective_ns_;
  pending_collective_ns_ = 0;
}

void JobStats::OnNonFiniteSkipped(uint64_t, const std::string& trainer) {
  absl::MutexLock lock(&mu_);
  ++nonfinite_skipped_;
  // Keyed by trainer: a job has a bounded number of them.
  ++nonfinite_by_culprit_[trainer.empty() ? "another node" : trainer];
}

void JobStats::OnStall(uint64_t iteration, uint32_t bucket, double waited_s,
                       const char* description) {
  {
    absl::MutexLock lock(&mu_);
    v1::StallReport r;
    r.set_iteration(iteration);
    r.set_bucket(bucket);
    r.set_waited_s(waited_s);
    r.set_description(description);
    stalls_.push_back(std::move(r));
    if (stalls_.size() > kKeepStalls) stalls_.pop_front();
  }
  if (stall_listener_) {
    stall_listener_(absl::StrCat("bucket ", bucket, " waited ", static_cast<int>(waited_s),
                                 " s: ", description));
  }
  WriteTrace(absl::StrCat("stall: bucket ", bucket, " of iteration ", iteration));
}

void JobStats::OnError(const std::string& message, bool write_trace) {
  {
    absl::MutexLock lock(&mu_);
    ++errors_;
    recent_errors_.push_back(message);
    if (recent_errors_.size() > kKeepErrors) recent_errors_.pop_front();
  }
  if (write_trace) WriteTrace("error: " + message);
}

void JobStats::WriteTrace(const std::string& reason) {
  if (trace_dir_.empty()) return;
  if (absl::Status room = MakeRoomForTrace(trace_dir_, kMaxKeptTraces); !room.ok()) {
    spdlog::error("event=trace_write_failed dir={} error={}", LogToken(trace_dir_),
                  LogValue(room.message()));
    return;
  }
  const std::string path =
      absl::StrCat(trace_dir_, "/", TraceFileName(job_id_, node_rank_, MonotonicNowNs()));
  TraceMetadata meta;
  meta.node_rank = node_rank_;
  meta.num_nodes = num_nodes_;
  meta.job_id = job_id_;
  meta.reason = reason;
  meta.end_ns = MonotonicNowNs();
  meta.tensor_names = tensor_names_;
  absl::Status st = recorder_.WriteTraceFile(path, meta);
  if (st.ok()) {
    spdlog::warn("event=trace_written path={} reason={}", LogToken(path), LogValue(reason));
  } else {
    spdlog::error("event=trace_write_failed path={} error={}", LogToken(path),
                  LogValue(st.message()));
  }
}

TraceMetadata JobStats::Metadata(const std::string& reason) const {
  TraceMetadata meta;
  meta.node_rank = node_rank_;
  meta.num_nodes = num_nodes_;
  meta.job_id = job_id_;
  meta.reason = reason;
  meta.tensor_names = tensor_names_;
  return meta;
}

std::string JobStats::TraceJson(const std::string& reason) const {
  return ToChromeTraceJson(recorder_.Snapshot(), Metadata(reason));
}

JobStats::BoundedTrace JobStats::TraceJsonWithin(const std::string& reason,
                                                 size_t max_bytes) const {
  TraceSnapshot snapshot = recorder_.Snapshot();
  TraceMetadata meta = Metadata(reason);
  BoundedTrace out{ToChromeTraceJson(snapshot, meta), 0};
  while (out.json.size() > max_bytes && !snapshot.events.empty()) {
    // JSON size is about proportional to the events: keep the newest share
    // that should fit, less a margin, and render again.
    const double fits = 0.9 * static_cast<double>(max_bytes) / static_cast<double>(out.json.size());
    const size_t keep =
        std::min(snapshot.events.size() - 1, static_cast<size_t>(snapshot.events.size() * fits));
    const size_t drop = snapshot.events.size() - keep;
    snapshot.events.erase(snapshot.events.begin(), snapshot.events.begin() + drop);
    out.dropped_events += drop;
    meta.reason = absl::StrCat(reason, " (the oldest ", out.dropped_events,
                               " events left out to fit ", max_bytes, " bytes)");
    out.json = ToChromeTraceJson(snapshot, meta);
  }
  return out;
}

void JobStats::FillStats(v1::Stats* out, const std::vector<uint32_t>& tensors_per_bucket) const {
  absl::MutexLock lock(&mu_);
  for (size_t id = 0; id < buckets_.size(); ++id) {
    const Bucket& b = *buckets_[id];
    v1::BucketStats* bs = out->add_buckets();
    bs->set_id(static_cast<uint32_t>(id));
    bs->set_bytes(b.bytes.load());
    bs->set_tensor_count(id < tensors_per_bucket.size() ? tensors_per_bucket[id] : 0);
    bs->set_count(b.count.load());
    Fill(b.total, bs->mutable_total());
    Fill(b.wait_for_ready, bs->mutable_wait_for_ready());
    Fill(b.local_reduce, bs->mutable_local_reduce());
    Fill(b.collective, bs->mutable_collective());
    Fill(b.write_back, bs->mutable_write_back());
  }
  out->set_iterations(iterations_.load());
  out->set_bytes_reduced(bytes_reduced_.load());
  // nccl-tests: algbw = bytes / time of the reduction (launch -> done,
  // summed over the iteration's buckets); busbw = algbw * 2(n-1)/n, n the
  // world size the stats report (it follows the active membership).
  if (last_collective_ns_ > 0) {
    const double algbw = last_iteration_bytes_ / (last_collective_ns_ / 1e9) / 1e9;
    const int n = out->world_size() > 0 ? out->world_size() : world_size_;
    out->set_algbw_gbps(algbw);
    out->set_busbw_gbps(n > 1 ? algbw * 2.0 * (n - 1) / n : algbw);
  }
  out->set_errors(errors_);
  for (const std::string& e : recent_errors_) out->add_recent_errors(e);
  for (const v1::StallReport& s : stalls_) *out->add_stalls() = s;
  stragglers_.Fill(out->mutable_stragglers(), out->mutable_straggler_settings());
  out->set_nonfinite_skipped_iterations(nonfinite_skipped_);
  for (const auto& [culprit, n] : nonfinite_by_culprit_) {
    (*out->mutable_nonfinite_skipped_by_culprit())[culprit] = n;
  }
}

}  // namespace gradsync
