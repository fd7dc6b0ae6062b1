#include "daemon/observe/straggler_tracker.h"

#include <unistd.h>

#include <algorithm>
#include <map>

#include "common/log_value.h"
#include "common/monotonic.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Nearest rank over the first n of `values` (reordered): every figure is a
// lateness that was really observed.
int64_t NearestRank(std::vector<int64_t>& values, size_t n, int percent) {
  size_t rank = (n * static_cast<size_t>(percent) + 99) / 100;
  rank = std::clamp<size_t>(rank, 1, n);
  std::nth_element(values.begin(), values.begin() + static_cast<ptrdiff_t>(rank - 1),
                   values.begin() + static_cast<ptrdiff_t>(n));
  return values[rank - 1];
}

void FillHistogram(const LatencyStats& stats, v1::LatencyStats* out) {
  const LatencyStats::Summary sum = stats.Summarize();
  out->set_last_us(sum.last_us);
  for (int64_t bound : LatencyStats::kHistogramBoundsUs) out->add_histogram_bounds_us(bound);
  for (uint64_t count : sum.histogram_counts) out->add_histogram_counts(count);
  out->set_histogram_count(sum.histogram_total);
  out->set_histogram_sum_us(sum.histogram_sum_us);
}

}  // namespace

StragglerTracker::StragglerTracker(std::string job_id, int node_rank, int num_nodes)
    : job_id_(std::move(job_id)),
      node_rank_(node_rank),
      slot_index_(node_rank),
      slot_nodes_(std::max(1, num_nodes)) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) host_ = host;
}

void StragglerTracker::SetOptions(const StragglerOptions& options) {
  absl::MutexLock lock(&mu_);
  // The windows are sized at Begin: a running tracker keeps its size.
  const uint32_t window =
      windows_.empty() ? std::max<uint32_t>(options.window, 1) : options_.window;
  options_ = options;
  options_.window = window;
}

void StragglerTracker::Begin(const std::vector<TrainerId>& trainers, bool exchanged) {
  exchanged_ = exchanged;
  const size_t n = trainers.size();
  last_mark_ns_.assign(n, 0);
  bucket_mark_ns_.clear();
  buckets_ = 0;
  pending_ = false;
  pending_slack_us_.assign(n, -1);
  pending_buckets_ = 0;
  pending_bucket_slack_us_.clear();
  node_bucket_max_us_.clear();
  job_bucket_max_us_.assign(kExchangedBuckets, -1);
  absl::MutexLock lock(&mu_);
  scope_job_ = exchanged;
  scratch_.assign(options_.window, 0);
  trainers_ = trainers;
  windows_.clear();
  windows_.resize(n);
  for (Window& w : windows_) {
    w.late_us.assign(options_.window, 0);
    w.last.assign(options_.window, 0);
    w.bucket.assign(options_.window, -1);
    w.histogram = std::make_unique<LatencyStats>(1);
  }
}

void StragglerTracker::SetWorld(int node_index, int num_nodes, bool exchanged) {
  slot_index_ = node_index;
  slot_nodes_ = std::max(1, num_nodes);
  exchanged_ = exchanged;
  absl::MutexLock lock(&mu_);
  scope_job_ = exchanged;
}

void StragglerTracker::OnMark(int local_rank, uint32_t bucket, int64_t ns) {
  const size_t t = static_cast<size_t>(local_rank);
  if (local_rank < 0 || t >= last_mark_ns_.size()) return;
  if (bucket >= buckets_) {
    // A plan with more buckets: bucket-major, so growing keeps what is there.
    buckets_ = bucket + 1;
    bucket_mark_ns_.resize(buckets_ * last_mark_ns_.size(), 0);
  }
  last_mark_ns_[t] = std::max(last_mark_ns_[t], ns);
  int64_t& at = bucket_mark_ns_[bucket * last_mark_ns_.size() + t];
  at = std::max(at, ns);
}

void StragglerTracker::OnIterationDone(uint64_t iteration,
                                       const std::vector<BucketTimeline>& buckets) {
  const size_t n = last_mark_ns_.size();
  const int64_t done_ns = buckets.empty() ? 0 : buckets.back().done_ns;
  // Per bucket: each trainer's slack to that bucket's reduction returning.
  // Grows with the plan only (an allocation at a rebuild, never per iteration).
  pending_bucket_slack_us_.resize(buckets_ * n, -1);
  node_bucket_max_us_.resize(buckets_, -1);
  pending_buckets_ = buckets_;
  for (size_t b = 0; b < buckets_; ++b) {
    const int64_t bucket_done_ns = b < buckets.size() ? buckets[b].done_ns : done_ns;
    node_bucket_max_us_[b] = -1;
    for (size_t t = 0; t < n; ++t) {
      const int64_t mark = bucket_mark_ns_[b * n + t];
      const int64_t slack = mark == 0 ? -1 : std::max<int64_t>(0, bucket_done_ns - mark) / 1000;
      pending_bucket_slack_us_[b * n + t] = slack;
      node_bucket_max_us_[b] = std::max(node_bucket_max_us_[b], slack);
    }
  }
  pending_ = false;
  pending_iteration_ = iteration;
  pending_last_ = -1;
  int64_t latest_ns = 0;
  for (size_t t = 0; t < n; ++t) {
    pending_slack_us_[t] = -1;
    if (last_mark_ns_[t] == 0) continue;
    const int64_t slack_us = std::max<int64_t>(0, done_ns - last_mark_ns_[t]) / 1000;
    pending_slack_us_[t] = slack_us;
    if (!pending_ || slack_us > pending_max_us_) pending_max_us_ = slack_us;
    if (!pending_ || slack_us < pending_min_us_) pending_min_us_ = slack_us;
    // Strictly last on this node: marks seen in one pass of the scheduler
    // share a timestamp, and a tie names nobody.
    if (!pending_ || last_mark_ns_[t] > latest_ns) {
      latest_ns = last_mark_ns_[t];
      pending_last_ = static_cast<int>(t);
    } else if (last_mark_ns_[t] == latest_ns) {
      pending_last_ = -1;
    }
    pending_ = true;
  }
  std::fill(last_mark_ns_.begin(), last_mark_ns_.end(), 0);
  std::fill(bucket_mark_ns_.begin(), bucket_mark_ns_.end(), 0);
  if (!pending_ || exchanged_) return;
  absl::MutexLock lock(&mu_);
  Finish(pending_max_us_, /*node_has_last=*/true, nullptr);
}

int32_t StragglerTracker::LatestBucket(size_t t, const int64_t* job_bucket_max_us) const {
  const size_t n = last_mark_ns_.size();
  int32_t latest = -1;
  int64_t latest_us = 0;
  for (size_t b = 0; b < pending_buckets_; ++b) {
    const int64_t slack = pending_bucket_slack_us_[b * n + t];
    if (slack < 0) continue;
    int64_t first = node_bucket_max_us_[b];
    if (job_bucket_max_us != nullptr && b < kExchangedBuckets) {
      first = std::max(first, job_bucket_max_us[b]);
    }
    if (first - slack > latest_us) {
      latest_us = first - slack;
      latest = static_cast<int32_t>(b);
    }
  }
  return latest;
}

void StragglerTracker::WriteAgreement(double* slots) const {
  std::fill(slots, slots + agreement_slots(), 0.0);
  if (!pending_ || slot_index_ < 0 || slot_index_ >= slot_nodes_) return;
  slots[0] = 1;
  // +1: zero means "this node has no figures" (all its trainers joined).
  slots[kHeadSlots + kSlotsPerNode * slot_index_] = static_cast<double>(pending_max_us_ + 1);
  slots[kHeadSlots + kSlotsPerNode * slot_index_ + 1] = static_cast<double>(pending_min_us_ + 1);
  double* buckets =
      slots + kHeadSlots + kSlotsPerNode * slot_nodes_ + kExchangedBuckets * slot_index_;
  for (size_t b = 0; b < kExchangedBuckets && b < pending_buckets_; ++b) {
    buckets[b] = static_cast<double>(node_bucket_max_us_[b] + 1);
  }
}

void StragglerTracker::ReadAgreement(const double* agreement) {
  if (!pending_) return;
  const double* slots = agreement + kHeadSlots;
  int64_t job_max = pending_max_us_;
  int64_t job_min = pending_min_us_;
  for (int node = 0; node < slot_nodes_; ++node) {
    if (slots[kSlotsPerNode * node] <= 0 || slots[kSlotsPerNode * node + 1] <= 0) continue;
    job_max = std::max(job_max, static_cast<int64_t>(slots[kSlotsPerNode * node]) - 1);
    job_min = std::min(job_min, static_cast<int64_t>(slots[kSlotsPerNode * node + 1]) - 1);
  }
  // The node whose smallest slack is the job's holds its last trainer; a
  // tie between nodes names nobody.
  int last_node = -1, at_min = 0;
  for (int node = 0; node < slot_nodes_; ++node) {
    if (slots[kSlotsPerNode * node + 1] <= 0) continue;
    if (static_cast<int64_t>(slots[kSlotsPerNode * node + 1]) - 1 != job_min) continue;
    last_node = node;
    ++at_min;
  }
  if (at_min != 1) last_node = -1;
  // Per exchanged bucket, the job's largest slack (its first trainer).
  const double* buckets = slots + kSlotsPerNode * slot_nodes_;
  for (size_t b = 0; b < kExchangedBuckets; ++b) {
    job_bucket_max_us_[b] = -1;
    for (int node = 0; node < slot_nodes_; ++node) {
      const double slot = buckets[kExchangedBuckets * node + b];
      if (slot > 0)
        job_bucket_max_us_[b] = std::max(job_bucket_max_us_[b], static_cast<int64_t>(slot) - 1);
    }
  }
  absl::MutexLock lock(&mu_);
  Finish(job_max, last_node == slot_index_, job_bucket_max_us_.data());
}

void StragglerTracker::Finish(int64_t job_max_slack_us, bool node_has_last,
                              const int64_t* job_bucket_max_us) {
  pending_ = false;
  const uint32_t window = options_.window;
  for (size_t t = 0; t < windows_.size() && t < pending_slack_us_.size(); ++t) {
    if (pending_slack_us_[t] < 0) continue;
    Window& w = windows_[t];
    const size_t slot = w.count % window;
    const int64_t late_us = std::max<int64_t>(0, job_max_slack_us - pending_slack_us_[t]);
    w.late_us[slot] = late_us;
    w.last[slot] = node_has_last && pending_last_ == static_cast<int>(t);
    w.bucket[slot] = LatestBucket(t, job_bucket_max_us);
    ++w.count;
    w.histogram->Record(late_us * 1000);
    // Only a trainer last this time can have become a straggler, and one
    // already named is judged again only when its log line is due.
    if (w.last[slot] != 0 && LogDue(w)) MaybeLog(t, Judge(w, &scratch_));
  }
}

StragglerTracker::Verdict StragglerTracker::Judge(const Window& w,
                                                  std::vector<int64_t>* scratch) const {
  Verdict v;
  v.n = static_cast<uint32_t>(std::min<uint64_t>(w.count, options_.window));
  if (v.n == 0) return v;
  int64_t sum = 0;
  uint32_t last = 0;
  for (uint32_t i = 0; i < v.n; ++i) {
    (*scratch)[i] = w.late_us[i];
    sum += w.late_us[i];
    last += w.last[i];
  }
  v.mean_us = static_cast<double>(sum) / v.n;
  v.share_last = static_cast<double>(last) / v.n;
  v.p50_us = static_cast<double>(NearestRank(*scratch, v.n, 50));
  v.p99_us = static_cast<double>(NearestRank(*scratch, v.n, 99));
  v.straggler = v.n >= kMinVerdictIterations && v.share_last > options_.share &&
                v.p50_us > options_.late_ms * 1000;
  return v;
}

bool StragglerTracker::LogDue(const Window& w) const {
  return !w.logged ||
         MonotonicNowNs() - w.logged_ns >= static_cast<int64_t>(options_.log_every_s * 1e9);
}

void StragglerTracker::MaybeLog(size_t t, const Verdict& v) {
  Window& w = windows_[t];
  if (!v.straggler) return;
  w.logged = true;
  w.logged_ns = MonotonicNowNs();
  const TrainerId& id = trainers_[t];
  spdlog::warn(
      "event=straggler job={} rank={} local_rank={} node={} host={} pid={} share_last={:.2f} "
      "late_p50_ms={:.3f} late_mean_ms={:.3f} late_p99_ms={:.3f} window={} scope={}",
      LogToken(job_id_), id.rank, id.local_rank, node_rank_, LogToken(host_), id.pid, v.share_last,
      v.p50_us / 1000, v.mean_us / 1000, v.p99_us / 1000, v.n, exchanged_ ? "job" : "node_clock");
  if (named_listener_) named_listener_(pending_iteration_, id.rank);
}

void StragglerTracker::Fill(google::protobuf::RepeatedPtrField<v1::TrainerLateness>* out,
                            v1::StragglerSettings* settings) const {
  absl::MutexLock lock(&mu_);
  settings->set_window(options_.window);
  settings->set_share(options_.share);
  settings->set_late_us(options_.late_ms * 1000);
  std::vector<int64_t> scratch(options_.window);
  for (size_t t = 0; t < windows_.size(); ++t) {
    const Window& w = windows_[t];
    const TrainerId& id = trainers_[t];
    const Verdict v = Judge(w, &scratch);
    v1::TrainerLateness* row = out->Add();
    row->set_rank(id.rank);
    row->set_local_rank(id.local_rank);
    row->set_node_rank(node_rank_);
    row->set_host(host_);
    row->set_pid(id.pid);
    row->set_window_iterations(v.n);
    row->set_late_mean_us(v.mean_us);
    row->set_late_p50_us(v.p50_us);
    row->set_late_p99_us(v.p99_us);
    row->set_share_last(v.share_last);
    row->set_straggler(v.straggler);
    row->set_scope(scope_job_ ? "job" : "node clock");
    // The usual bucket: the one it was latest for most often in the window.
    std::map<int32_t, uint32_t> times;
    for (uint32_t i = 0; i < v.n; ++i) {
      if (w.bucket[i] >= 0) ++times[w.bucket[i]];
    }
    int32_t usual = -1;
    uint32_t most = 0;
    for (const auto& [bucket, count] : times) {
      if (count > most) usual = bucket, most = count;
    }
    row->set_usual_bucket(usual);
    FillHistogram(*w.histogram, row->mutable_lateness());
  }
}

}  // namespace gradsync
