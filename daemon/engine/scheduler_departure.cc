// Scheduler: a trainer's death in an elastic job (docs/DESIGN.md, "Elastic
// jobs"). On the CPU path its node stays in (mid-iteration:
// scheduler_trainer_loss.cc); the trainer counts as joined
// (gs_join with divide_by_initial_world_size=0), so the per-iteration
// agreement, which elastic jobs always run on its own, divides by the
// trainers still active; on the GPU path the reducer leaves it out of every
// later reduction (GpuReducer::DeactivateTrainer). A reduction that fails
// on a dead trainer's readiness event lets its death, not the failure,
// decide.
#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "daemon/engine/scheduler.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// How long a reduction's error blaming a trainer waits for that trainer's
// Watch stream to report it dead: the stream polls every 100 ms, and a
// killed process's connection closes with it.
constexpr int64_t kTrainerDeathNoticeNs = 2'000'000'000;

}  // namespace

bool Scheduler::TrainerDiedMeanwhile(const Trainer& t) const {
  const int64_t until =
      MonotonicNowNs() + std::min<int64_t>(kTrainerDeathNoticeNs, options_.timeout_ms * 1000000);
  while (!t.gone.load()) {
    if (MonotonicNowNs() >= until || stop_.load(std::memory_order_acquire)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  spdlog::warn("event=reduction_failed_on_dead_trainer iteration={} trainer={}", iteration(),
               LogValue(t.Name()));
  return true;
}

void Scheduler::RequestDeparture(int local_rank, const std::string& reason) {
  {
    absl::MutexLock lock(&reform_mu_);
    departures_.emplace_back(local_rank, reason);
    departures_requested_.store(true, std::memory_order_release);
  }
  ready_bell_->Ring();
}

bool Scheduler::TakeDepartures() {
  std::vector<std::pair<int, std::string>> departures;
  {
    absl::MutexLock lock(&reform_mu_);
    departures.swap(departures_);
    departures_requested_.store(false, std::memory_order_release);
  }
  for (const auto& [local_rank, reason] : departures) {
    if (local_rank < 0 || static_cast<size_t>(local_rank) >= trainers_.size()) continue;
    Trainer& t = *trainers_[local_rank];
    if (t.joined.load(std::memory_order_relaxed) || t.departing) continue;
    // What it marked before dying may still wait in its ring: count it.
    bool progress = false;
    if (!ConsumeReadyRing(t, MonotonicNowNs(), &progress)) return false;
    if (t.joined.load(std::memory_order_relaxed)) continue;  // its last entry was a gs_join
    spdlog::warn("event=trainer_departed iteration={} trainer={} marked={}/{} reason={}",
                 iteration(), LogValue(t.Name()), t.marked_count, layout_.size(), LogValue(reason));
    if (t.marked_count == 0) {
      // Nothing of it was summed this iteration (a bucket waits for every
      // local trainer): it leaves now, this iteration already without it.
      CountAsJoined(t, /*divide_by_initial_world_size=*/false);
    } else if (t.marked_count == layout_.size()) {
      // Its gradient is complete in its segment, which the daemon still
      // maps: this iteration counts it, the next ones do not.
      t.departing = true;
    } else if (KeepsTrainerInputs()) {
      // Part of its gradient may be summed already: every node redoes the
      // iteration, this one from its survivors' copied inputs.
      if (!KeepNodeWithoutTrainer(t, reason)) return false;
    } else {
      // Part of its gradient may be summed already, part is missing, and
      // no copy of the survivors' inputs is kept here (one node left, or
      // the node's last trainer died): no average over this node's survivors can be formed,
      // but one over the other nodes can: the node leaves the job.
      const bool node_leaves = static_cast<bool>(options_.leave_job);
      (node_leaves ? options_.leave_job : fail_)(
          MakeError(v1::PEER_FAILED,
                    absl::StrCat(t.Name(), " died in iteration ", iteration(), " after marking ",
                                 t.marked_count, " of ", layout_.size(), " gradients (", reason,
                                 "): an elastic job loses a trainer only before its first or "
                                 "after its last mark of an iteration",
                                 node_leaves ? ", so its node leaves the job" : "")),
          t.local_rank);
      return false;
    }
  }
  return true;
}

void Scheduler::LeaveForIncompleteWork(const Trainer& t, const absl::Status& error) {
  options_.leave_job(
      MakeError(v1::PEER_FAILED,
                absl::StrCat(t.Name(), " died in iteration ", iteration(), " after marking all ",
                             layout_.size(),
                             " gradients, but the GPU work it queued before its marks did not "
                             "complete (",
                             error.message(), "), so its node leaves the job")),
      t.local_rank);
}

}  // namespace gradsync
