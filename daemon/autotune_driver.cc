#include "daemon/autotune_driver.h"

#include <algorithm>

#include "common/log_value.h"
#include "spdlog/spdlog.h"

namespace gradsync {

AutotuneDriver::AutotuneDriver(EarliestIteration earliest, Publish publish)
    : earliest_(std::move(earliest)), publish_(std::move(publish)), thread_([this] { Loop(); }) {}

AutotuneDriver::~AutotuneDriver() {
  {
    absl::MutexLock lock(&queue_mu_);
    stop_ = true;
  }
  thread_.join();
}

void AutotuneDriver::OnIterationDone(uint64_t job, uint64_t iteration, uint64_t bytes,
                                     int64_t end_ns) {
  absl::MutexLock lock(&queue_mu_);
  if (job == finished_job_) return;
  queue_.push_back(Report{job, iteration, bytes, end_ns});
}

void AutotuneDriver::Loop() {
  std::vector<Report> batch;
  while (true) {
    {
      absl::MutexLock lock(&queue_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
        return stop_ || !queue_.empty();
      };
      queue_mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      batch.swap(queue_);
    }
    for (const Report& r : batch) Handle(r);
    batch.clear();
  }
}

bool AutotuneDriver::PlaceCandidates(BucketAutotuner& tuner) {
  uint64_t at = earliest_();
  for (size_t i = 0; i < tuner.results().size(); ++i) {
    const CapsCandidate& c = tuner.results()[i].caps;
    absl::StatusOr<uint64_t> placed = publish_(c, at);
    if (!placed.ok()) {
      spdlog::warn("event=autotune_abandoned reason={}", LogValue(placed.status().message()));
      return false;
    }
    tuner.Place(i, *placed);
    spdlog::info(
        "event=autotune_candidate index={} first_bucket_cap_mb={} bucket_cap_mb={} "
        "at_iteration={}",
        i, c.first_bucket_cap_mb, c.bucket_cap_mb, *placed);
    at = *placed + tuner.span();
  }
  return true;
}

void AutotuneDriver::Handle(const Report& r) {
  bool finished = false;
  {
    absl::MutexLock lock(&state_mu_);
    if (r.job != job_) {
      // A new job tunes afresh: its model (and so its best caps) may differ.
      job_ = r.job;
      tuner_.reset();
      chosen_at_ = 0;
      state_ = "waiting for the job's first iterations";
    }
    if (!tuner_ && r.iteration >= kFirstPlacedAfter) {
      BucketAutotuner tuner(
          AutotuneCandidates(0.25, 200, static_cast<double>(r.bytes) / (1 << 20)));
      if (!PlaceCandidates(tuner)) {
        state_ = "abandoned: the job ended while placing candidates";
        finished = true;
      } else {
        tuner_ = std::move(tuner);
        state_ = "tuning";
      }
    } else if (tuner_ && !tuner_->done() && tuner_->OnIterationDone(r.iteration, r.end_ns)) {
      const BucketAutotuner::Result& best = tuner_->results()[*tuner_->choice()];
      absl::StatusOr<uint64_t> at = publish_(best.caps, earliest_());
      for (size_t i = 0; i < tuner_->results().size(); ++i) {
        const BucketAutotuner::Result& c = tuner_->results()[i];
        spdlog::info(
            "event=autotune_score index={} first_bucket_cap_mb={} bucket_cap_mb={} "
            "at_iteration={} median_step_s={:.6f} iterations={}",
            i, c.caps.first_bucket_cap_mb, c.caps.bucket_cap_mb, c.at_iteration, c.score_s,
            c.step_s.size());
      }
      if (at.ok()) {
        chosen_at_ = *at;
        state_ = "chosen";
        spdlog::info(
            "event=autotune_chosen index={} first_bucket_cap_mb={} bucket_cap_mb={} "
            "median_step_s={:.6f} at_iteration={}",
            *tuner_->choice(), best.caps.first_bucket_cap_mb, best.caps.bucket_cap_mb, best.score_s,
            *at);
      } else {
        state_ = "abandoned: the job ended before the choice was applied";
        spdlog::warn("event=autotune_abandoned reason={}", LogValue(at.status().message()));
      }
      finished = true;
    }
  }
  if (finished) {
    absl::MutexLock lock(&queue_mu_);
    finished_job_ = r.job;
    // Reports of this job queued meanwhile are dropped on arrival.
    queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                                [&](const Report& q) { return q.job == r.job; }),
                 queue_.end());
  }
}

void AutotuneDriver::FillStats(v1::Stats* out) const {
  absl::MutexLock lock(&state_mu_);
  out->set_autotune_state(state_);
  out->set_autotune_choice(tuner_ && tuner_->choice() ? static_cast<int>(*tuner_->choice()) : -1);
  out->set_autotune_chosen_at_iteration(chosen_at_);
  if (!tuner_) return;
  for (const BucketAutotuner::Result& r : tuner_->results()) {
    v1::AutotuneCandidate* c = out->add_autotune_candidates();
    c->set_first_bucket_cap_mb(r.caps.first_bucket_cap_mb);
    c->set_bucket_cap_mb(r.caps.bucket_cap_mb);
    c->set_at_iteration(r.at_iteration);
    c->set_median_step_s(r.score_s);
    c->set_scored_iterations(static_cast<uint32_t>(r.step_s.size()));
  }
}

}  // namespace gradsync
