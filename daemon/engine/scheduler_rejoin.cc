// Scheduler: a trainer restarted on a node that stayed in an elastic job
// (CPU or GPU gradients) takes back its dead predecessor's local rank (docs/DESIGN.md,
// "Elastic jobs"). Only its node knows, so it is announced through the
// per-iteration agreement (a slot every node sums): the iteration whose
// agreement carries it ends, on every node, with kCompletionTrainersJoined
// and the catch-up root, and from the next one on the agreement counts the
// trainer active, so every node's divisor grows alike.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "daemon/engine/scheduler.h"
#include "spdlog/spdlog.h"

namespace gradsync {

void Scheduler::RequestRejoin(Trainer* fresh) {
  {
    absl::MutexLock lock(&reform_mu_);
    rejoins_.push_back(fresh);
    rejoins_requested_.store(true, std::memory_order_release);
  }
  ready_bell_->Ring();
}

void Scheduler::TakeRejoins() {
  std::vector<Trainer*> fresh;
  {
    absl::MutexLock lock(&reform_mu_);
    fresh.swap(rejoins_);
    rejoins_requested_.store(false, std::memory_order_release);
  }
  for (Trainer* t : fresh) {
    spdlog::info("event=trainer_rejoin_pending iteration={} trainer={}", iteration(),
                 LogValue(t->Name()));
    rejoins_pending_.push_back(t);
  }
}

int Scheduler::AnnounceRejoins() {
  rejoins_announced_.clear();
  // One that died while it waited is dropped; its Register has returned.
  rejoins_pending_.erase(std::remove_if(rejoins_pending_.begin(), rejoins_pending_.end(),
                                        [](const Trainer* t) { return t->gone.load(); }),
                         rejoins_pending_.end());
  for (Trainer* t : rejoins_pending_) {
    const size_t local = static_cast<size_t>(t->local_rank);
    // Its predecessor still counts in this iteration (it died after marking
    // all of it): the next agreement announces it.
    if (local >= trainers_.size() || !trainers_[local]->joined.load(std::memory_order_relaxed)) {
      continue;
    }
    rejoins_announced_.push_back(t);
  }
  return static_cast<int>(rejoins_announced_.size());
}

double Scheduler::LowestActiveRankSlot() const {
  int lowest = -1;
  for (const Trainer* t : trainers_) {
    // A trainer that died after marking all of this iteration is gone by
    // its end: it sends no state.
    if (t->joined.load(std::memory_order_relaxed) || t->departing || t->gone.load()) continue;
    if (lowest < 0 || t->rank < lowest) lowest = t->rank;
  }
  return lowest + 1.0;
}

void Scheduler::ReadJoinSlots(const double* counts, bool exchanged) {
  trainers_rejoin_ = counts[3] > 0;
  const int nodes = agreement_nodes_;
  const size_t root_slot = kAgreementHeader + 2 * static_cast<size_t>(nodes);
  if (!exchanged && nodes > 1) {
    // A GPU job without --uneven-inputs exchanges nothing: node 0, which
    // the embedded leader always keeps, holds rank 0.
    catch_up_root_ = 0;
    return;
  }
  catch_up_root_ = -1;
  for (int n = 0; n < nodes && root_slot + n < agreement_.size(); ++n) {
    const int root = static_cast<int>(counts[root_slot + n]) - 1;
    if (root >= 0 && (catch_up_root_ < 0 || root < catch_up_root_)) catch_up_root_ = root;
  }
}

void Scheduler::OpenRejoinedOnGpu() {
  if (options_.gpu == nullptr) return;
  std::vector<Trainer*> opened;
  for (Trainer* fresh : rejoins_announced_) {
    absl::Status st = fresh->cuda
                          ? options_.gpu->ReplaceTrainer(static_cast<size_t>(fresh->local_rank),
                                                         *fresh->cuda, fresh->Name())
                          : absl::InvalidArgumentError(
                                absl::StrCat(fresh->Name(),
                                             " registered no CUDA tensors to rejoin a job of CUDA "
                                             "gradients"));
    if (st.ok()) {
      opened.push_back(fresh);
      continue;
    }
    // (A device error that poisoned the context ended the process inside.)
    spdlog::error("event=trainer_rejoin_refused iteration={} trainer={} error={}", iteration(),
                  LogValue(fresh->Name()), LogValue(st.message()));
    rejoins_pending_.erase(std::remove(rejoins_pending_.begin(), rejoins_pending_.end(), fresh),
                           rejoins_pending_.end());
    if (options_.on_rejoin_refused) options_.on_rejoin_refused(fresh, st);
  }
  rejoins_announced_.swap(opened);
}

void Scheduler::TellRejoined(uint64_t start_iteration) {
  if (!options_.on_rejoined) return;
  for (Trainer* fresh : rejoins_announced_) {
    options_.on_rejoined(fresh, start_iteration, std::max(catch_up_root_, 0));
  }
}

void Scheduler::TellCatchUp(uint64_t start_iteration) const {
  if (!options_.on_catch_up) return;
  // The trainers active in the iteration that ends hold the state; a
  // rejoining trainer's predecessor counts as joined, so it is not one.
  std::vector<uint8_t> old_members(trainers_.size(), 0);
  for (size_t i = 0; i < trainers_.size(); ++i) {
    const Trainer* t = trainers_[i];
    old_members[i] = !t->joined.load(std::memory_order_relaxed) && !t->departing && !t->gone.load();
  }
  options_.on_catch_up(std::max(catch_up_root_, 0), start_iteration, std::move(old_members));
}

void Scheduler::AdmitRejoins() {
  const uint64_t start = iteration();  // already the next one
  for (Trainer* fresh : rejoins_announced_) {
    rejoins_pending_.erase(std::remove(rejoins_pending_.begin(), rejoins_pending_.end(), fresh),
                           rejoins_pending_.end());
    const size_t local = static_cast<size_t>(fresh->local_rank);
    Trainer* old = trainers_[local];
    // Its place: the dead trainer counted as joined; the fresh one is
    // active from this boundary on (remaining_ is recounted after it).
    trainers_[local] = fresh;
    arenas_[local] = fresh->segment.arena();
    fresh->marked.assign(layout_.size(), 0);
    fresh->mark_checksums.assign(layout_.size(), 0);
    fresh->marked_count = 0;
    fresh->ready_sequence = 0;
    fresh->departing = false;
    fresh->joined.store(false, std::memory_order_relaxed);
    if (old->joined.load(std::memory_order_relaxed)) {
      joined_local_.fetch_sub(1, std::memory_order_acq_rel);
    }
    RebuildActiveArenas();
    spdlog::warn("event=trainer_rejoined iteration={} trainer={} replaces_pid={} catch_up_root={}",
                 start, LogValue(fresh->Name()), old->pid, catch_up_root_);
  }
  rejoins_announced_.clear();
}

}  // namespace gradsync
