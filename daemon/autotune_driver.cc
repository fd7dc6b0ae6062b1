#include "daemon/autotune_driver.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "spdlog/spdlog.h"

namespace gradsync {

AutotuneDriver::AutotuneDriver(EarliestIteration earliest, Publish publish)
    : earliest_(std::move(earliest)), publish_(std::move(publish)), thread_([this] { Loop(); }) {}

AutotuneDriver::~AutotuneDriver() { Stop(); }

void AutotuneDriver::Stop() {
  {
    absl::MutexLock lock(&queue_mu_);
    stop_ = true;
    accepting_ = false;
    queue_.clear();
  }
  if (thread_.joinable()) thread_.join();
}

void AutotuneDriver::OnWorldFormed(const TuningSeat& seat) {
  absl::MutexLock lock(&queue_mu_);
  if (stop_) return;
  ++seat_sequence_;
  accepting_ = seat.here;
  queue_.push_back(SeatChange{seat, seat_sequence_});
}

void AutotuneDriver::OnIterationDone(uint64_t job, uint64_t iteration, uint64_t bytes,
                                     int64_t end_ns) {
  absl::MutexLock lock(&queue_mu_);
  if (!accepting_) return;
  queue_.push_back(Report{job, iteration, bytes, end_ns});
}

void AutotuneDriver::Loop() {
  std::vector<Event> batch;
  uint64_t sequence = 0;  // the seat the reports handled belong to
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
    for (const Event& e : batch) {
      if (const SeatChange* change = std::get_if<SeatChange>(&e)) {
        sequence = change->sequence;
        if (HandleSeat(*change)) StopReports(sequence);
      } else if (HandleReport(std::get<Report>(e))) {
        StopReports(sequence);
      }
    }
    batch.clear();
  }
}

void AutotuneDriver::StopReports(uint64_t sequence) {
  absl::MutexLock lock(&queue_mu_);
  if (sequence != seat_sequence_) return;  // a newer world formed: it decides
  accepting_ = false;
  // Reports queued meanwhile are dropped; a seat queued after them is not.
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [](const Event& e) { return std::holds_alternative<Report>(e); }),
               queue_.end());
}

bool AutotuneDriver::HandleSeat(const SeatChange& change) {
  const TuningSeat& seat = change.seat;
  absl::MutexLock lock(&state_mu_);
  const bool was_tuning = seat_.here && tuner_.has_value() && !choice_in_effect_;
  if (seat.resumed && seat.here && seat_.here && choice_in_effect_) {
    // Every survivor runs the choice already (a re-formation keeps the caps).
    seat_ = seat;
    spdlog::info("event=autotune_kept generation={} at_iteration={}", seat.generation, chosen_at_);
    return true;
  }
  seat_ = seat;
  tuner_.reset();
  chosen_at_ = 0;
  choice_in_effect_ = false;
  if (!seat.here) {
    state_ =
        absl::StrCat("node_rank=", seat.tuner_node_rank, " tunes (the first member of generation ",
                     seat.generation, "); this node applies its choices");
    spdlog::info("event=autotune_seat generation={} tuner_node_rank={} here=false resumed={}",
                 seat.generation, seat.tuner_node_rank, seat.resumed);
    return true;
  }
  // A re-formation drops what was placed and not yet reached on every node
  // alike: tuning afresh among the survivors is the only consistent resume.
  state_ = seat.resumed ? "waiting for the re-formed generation's first iterations"
                        : "waiting for the job's first iterations";
  spdlog::info(
      "event=autotune_seat generation={} tuner_node_rank={} here=true resumed={} "
      "restarted={} first_iteration={}",
      seat.generation, seat.tuner_node_rank, seat.resumed, was_tuning || seat.resumed,
      seat.first_iteration);
  return false;
}

bool AutotuneDriver::HandleReport(const Report& r) {
  uint64_t generation = 0;
  std::optional<CapsCandidate> best;  // every candidate scored: publish it
  {
    absl::MutexLock lock(&state_mu_);
    if (!seat_.here) return true;
    if (r.job != seat_.job) return false;  // an ended job's last report
    generation = seat_.generation;
    if (tuner_ && tuner_->done()) {
      // Chosen: watched until its iteration completed, after which a
      // re-formation keeps it.
      if (r.iteration < chosen_at_) return false;
      choice_in_effect_ = true;
      spdlog::info("event=autotune_in_effect generation={} at_iteration={} iteration={}",
                   generation, chosen_at_, r.iteration);
      return true;
    }
    if (tuner_) {
      if (!tuner_->OnIterationDone(r.iteration, r.end_ns)) return false;
      LogScoresLocked();
      best = tuner_->results()[*tuner_->choice()].caps;
    } else {
      if (r.iteration < seat_.first_iteration + kFirstPlacedAfter) return false;
      state_ = "placing candidates";
    }
  }
  // The config log may be a network away (etcd): published without the
  // lock, so stats never wait on it. Only this thread changes the state.
  if (best) return PublishChoice(*best, generation);
  return !PlaceCandidates(static_cast<double>(r.bytes) / (1 << 20), generation);
}

bool AutotuneDriver::PlaceCandidates(double gradient_mb, uint64_t generation) {
  BucketAutotuner tuner(AutotuneCandidates(0.25, 200, gradient_mb));
  uint64_t at = earliest_();
  for (size_t i = 0; i < tuner.results().size(); ++i) {
    const CapsCandidate& c = tuner.results()[i].caps;
    absl::StatusOr<uint64_t> placed = publish_(c, at, generation);
    if (!placed.ok()) {
      spdlog::warn("event=autotune_abandoned generation={} reason={}", generation,
                   LogValue(placed.status().message()));
      absl::MutexLock lock(&state_mu_);
      state_ =
          absl::StrCat("abandoned: generation ", generation, " ended while placing candidates");
      return false;
    }
    tuner.Place(i, *placed);
    spdlog::info(
        "event=autotune_candidate index={} first_bucket_cap_mb={} bucket_cap_mb={} "
        "at_iteration={} generation={}",
        i, c.first_bucket_cap_mb, c.bucket_cap_mb, *placed, generation);
    at = *placed + tuner.span();
  }
  absl::MutexLock lock(&state_mu_);
  tuner_ = std::move(tuner);
  state_ = "tuning";
  return true;
}

void AutotuneDriver::LogScoresLocked() const {
  for (size_t i = 0; i < tuner_->results().size(); ++i) {
    const BucketAutotuner::Result& c = tuner_->results()[i];
    spdlog::info(
        "event=autotune_score index={} first_bucket_cap_mb={} bucket_cap_mb={} "
        "at_iteration={} median_step_s={:.6f} iterations={}",
        i, c.caps.first_bucket_cap_mb, c.caps.bucket_cap_mb, c.at_iteration, c.score_s,
        c.step_s.size());
  }
}

bool AutotuneDriver::PublishChoice(const CapsCandidate& best, uint64_t generation) {
  absl::StatusOr<uint64_t> at = publish_(best, earliest_(), generation);
  absl::MutexLock lock(&state_mu_);
  if (!at.ok()) {
    state_ =
        absl::StrCat("abandoned: generation ", generation, " ended before the choice was applied");
    spdlog::warn("event=autotune_abandoned generation={} reason={}", generation,
                 LogValue(at.status().message()));
    return true;
  }
  chosen_at_ = *at;
  state_ = "chosen";
  const BucketAutotuner::Result& chosen = tuner_->results()[*tuner_->choice()];
  spdlog::info(
      "event=autotune_chosen index={} first_bucket_cap_mb={} bucket_cap_mb={} "
      "median_step_s={:.6f} at_iteration={} generation={}",
      *tuner_->choice(), best.first_bucket_cap_mb, best.bucket_cap_mb, chosen.score_s, *at,
      generation);
  return false;
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
