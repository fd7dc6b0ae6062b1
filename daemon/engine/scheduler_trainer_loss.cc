// Scheduler: a trainer of an elastic job across nodes dies after marking
// part of an iteration (docs/DESIGN.md, "Elastic jobs"). Its node stays in
// the job and the world shrinks by that trainer: the buckets already summed
// included part of its gradient, so every node redoes the iteration over
// the remaining trainers. The other nodes redo from their kept sums; this
// node sums its survivors' inputs again, which the sum pass copied aside
// (their arenas, or on the GPU path their device memory, received the
// launched buckets' averages since).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "daemon/engine/bucket_pieces.h"
#include "daemon/engine/scheduler.h"
#include "spdlog/spdlog.h"

namespace gradsync {

bool Scheduler::NeedsTrainerInputCopies() const {
  // A node of one trainer never needs them: its last trainer's death takes
  // the node out; nor does a world of one node: nothing to redo with.
  return options_.reform && backend_ != nullptr && backend_->num_nodes() > 1 &&
         trainers_.size() >= 2;
}

void Scheduler::FollowWorldWithInputCopies(bool at_start) {
  const bool keep = NeedsTrainerInputCopies();
  if (keep == input_copies_on_) return;
  if (options_.gpu) {
    // In device memory, allocated with the plan (GpuReducer::Prepare) or now.
    const absl::Status st =
        options_.gpu->SetKeepInputs(keep, MonotonicNow() + absl::Milliseconds(options_.timeout_ms));
    if (!st.ok()) {
      // Not taken either way: a trainer's death mid-backward takes the node out.
      spdlog::warn("event=trainer_input_copies_failed iteration={} keep={} error={}", iteration(),
                   keep, LogValue(st.message()));
      input_copies_on_ = false;
      return;
    }
  } else if (keep) {
    input_copies_.assign(trainers_.size(), std::vector<uint8_t>(arena_.total_bytes));
  } else {
    std::vector<std::vector<uint8_t>>().swap(input_copies_);
  }
  input_copies_on_ = keep;
  RebuildActiveArenas();
  if (at_start) return;
  spdlog::info("event=trainer_input_copies_{} iteration={} nodes={} trainers={} arena_bytes={}",
               keep ? "started" : "stopped", iteration(), backend_->num_nodes(), trainers_.size(),
               arena_.total_bytes);
}

bool Scheduler::KeepsTrainerInputs() const {
  // The dying trainer is still active here: another one must be too.
  if (options_.gpu) return backend_->num_nodes() > 1 && options_.gpu->KeepsInputs();
  return input_copies_on_ && backend_->num_nodes() > 1 && active_arenas_.size() >= 2;
}

const std::vector<uint8_t*>* Scheduler::InputCopiesForReduce() const {
  return KeepsTrainerInputs() ? &active_copies_ : nullptr;
}

void Scheduler::RebuildActiveArenas() {
  active_arenas_.clear();
  active_copies_.clear();
  for (size_t i = 0; i < trainers_.size(); ++i) {
    if (trainers_[i]->joined.load(std::memory_order_relaxed)) continue;
    active_arenas_.push_back(arenas_[i]);
    if (!input_copies_.empty()) active_copies_.push_back(input_copies_[i].data());
  }
}

bool Scheduler::KeepNodeWithoutTrainer(Trainer& t, const std::string& reason) {
  size_t summed = options_.gpu ? options_.gpu->kept_buckets() : 0;
  for (const KeptSums& k : kept_sums_) summed += k.pieces > 0;
  spdlog::warn(
      "event=trainer_lost_mid_iteration iteration={} trainer={} marked={}/{} buckets_summed={} "
      "reason={}",
      iteration(), LogValue(t.Name()), t.marked_count, layout_.size(), summed, LogValue(reason));
  CountAsJoined(t, /*divide_by_initial_world_size=*/false);
  if (options_.gpu) {
    if (!RestoreSurvivorGpuInputs()) return false;
  } else {
    RestoreSurvivorInputs();
  }
  // Before this iteration's agreement nothing was summed with it (a redo
  // from kept sums drew on them; they are dropped above): no redo needed.
  trainer_lost_mid_iteration_ = trainer_lost_mid_iteration_ || active_agreed_;
  return true;
}

bool Scheduler::RestoreSurvivorGpuInputs() {
  // The dead trainer is deactivated (CountAsJoined): its memory is not touched.
  const absl::StatusOr<size_t> restored = options_.gpu->RestoreInputs(
      plan_, spans_, MonotonicNow() + absl::Milliseconds(options_.timeout_ms));
  if (restored.ok()) {
    spdlog::info("event=trainer_inputs_restored iteration={} buckets={}", iteration(), *restored);
    return true;
  }
  fail_(MakeError(CodeOf(restored.status()) == v1::TIMEOUT ? v1::TIMEOUT : v1::INTERNAL,
                  absl::StrCat("iteration ", iteration(),
                               ": restoring the surviving trainers' gradients after a trainer's "
                               "death: ",
                               restored.status().message())),
        -1);
  return false;
}

void Scheduler::RestoreSurvivorInputs() {
  std::vector<BucketPiece> pieces;
  for (size_t b = 0; b < kept_sums_.size(); ++b) {
    KeptSums& kept = kept_sums_[b];
    if (kept.pieces == 0) continue;
    // The pieces summed, as the reducer cut them: their elements lead the
    // bucket's spans laid end to end; the rest was never written back.
    const DType dtype = plan_.buckets[b].dtype;
    uint64_t bytes = 0;
    for (const ReduceSpan& span : spans_[b]) bytes += span.bytes;
    const size_t element = DTypeSize(dtype);
    CutBucketPieces(bytes / element, LocalReducer::StagingBytes(element, dtype), kPieceBytes,
                    &pieces);
    const BucketPiece& last = pieces[std::min(kept.pieces, pieces.size()) - 1];
    uint64_t restore = (last.first + last.count) * element;
    for (const ReduceSpan& span : spans_[b]) {
      const uint64_t n = std::min(restore, span.bytes);
      for (size_t i = 0; i < active_arenas_.size(); ++i) {
        std::memcpy(active_arenas_[i] + span.offset, active_copies_[i] + span.offset, n);
      }
      restore -= n;
    }
    // Summed again from the restored inputs, without the dead trainer.
    kept.pieces = 0;
  }
}

bool Scheduler::CountsLostTrainers() const { return options_.reform && backend_->num_nodes() > 1; }

bool Scheduler::IssueLostTrainerCount() {
  if (!CountsLostTrainers()) return true;
  // Only the node that lost the trainer knows, and it knows before this
  // bucket: the bucket waits for every local trainer's marks or its death.
  lost_trainer_count_ = trainer_lost_mid_iteration_ ? 1 : 0;
  uint64_t bytes = 0;
  for (const ReduceSpan& span : spans_[next_bucket_]) bytes += span.bytes;
  const DType dtype = plan_.buckets[next_bucket_].dtype;
  // What the bucket's collective carries (the agreement's guess, above).
  const DType staged = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  bool deferred = false;
  if (!BeginReduction(next_bucket_, MonotonicNowNs())) {
    EndReduction();
    return false;
  }
  // The GPU path's bucket goes over NCCL, which cannot carry the count:
  // it is summed on its own, before that bucket.
  const absl::Status st =
      options_.gpu ? backend_->AllreduceCounts(&lost_trainer_count_, 1)
                   : backend_->AllreduceCountsWithNext(&lost_trainer_count_, 1,
                                                       bytes / DTypeSize(dtype), staged, &deferred);
  const int64_t slot = EndReduction();
  if (slot == kStopped) return false;
  if (st.ok() && slot != kTimedOut) return true;
  CollectiveFailed(
      slot == kTimedOut && CodeOf(st) != v1::TIMEOUT
          ? TimedOut(next_bucket_, st)
          : MakeError(CodeOf(st) == v1::INTERNAL ? v1::PEER_FAILED : CodeOf(st),
                      absl::StrCat("iteration ", iteration(),
                                   ": counting the nodes that lost a trainer: ", backend_->name(),
                                   " allreduce failed: ", st.message())));
  return false;
}

bool Scheduler::IterationStands() {
  // Summed once the last bucket's collective was awaited.
  if (!CountsLostTrainers() || lost_trainer_count_ == 0) return true;
  spdlog::warn("event=iteration_redo_for_lost_trainer iteration={} nodes_that_lost_one={}",
               iteration(), lost_trainer_count_);
  lost_trainer_count_ = 0;
  RewindIteration();
  return false;
}

}  // namespace gradsync
