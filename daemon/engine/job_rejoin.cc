// Job: a trainer restarted on a node that stayed in a running elastic job
// (docs/DESIGN.md, "Elastic jobs"), with CPU or CUDA gradients. It attaches
// on the local rank of a trainer that died (which the scheduler counts as
// joined), keeps that trainer's rank, registers the job's layout, gets a
// segment of its own and waits for the scheduler to admit it at an
// iteration boundary X that no node has started; its gs_register then
// returns with X and the rank its catch-up gs_broadcast comes from. On the
// GPU path the scheduler opens its CUDA memory and events at that boundary,
// in its predecessor's place on the same GPU (GpuReducer::ReplaceTrainer).
#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/secure_random.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/engine/job.h"
#include "spdlog/spdlog.h"

namespace gradsync {

bool Job::TakesRejoinsLocked() const {
  return state_ == JobState::kRunning && scheduler_ && reforms();
}

absl::StatusOr<uint64_t> Job::AttachRejoiningLocked(int local_rank, int64_t pid) {
  if (local_rank < 0 || local_rank >= config_.local_size) {
    return MakeError(
        v1::INVALID_ARGUMENT,
        absl::StrCat("local rank ", local_rank, " is not in [0, ", config_.local_size,
                     ") (the daemon runs with --local-size ", config_.local_size, ")"));
  }
  std::shared_ptr<Trainer>& slot = trainers_[local_rank];
  if (slot && !slot->gone.load()) {
    return MakeError(v1::STATE,
                     absl::StrCat("local rank ", local_rank, " is already attached by pid ",
                                  slot->pid, " in the running elastic job on this daemon"));
  }
  auto t = std::make_shared<Trainer>();
  // Unguessable and never 0, as every session id (Attach).
  while (t->session_id == 0) t->session_id = SecureRandom64();
  t->local_rank = local_rank;
  t->pid = pid;
  t->attached_at = std::chrono::steady_clock::now();
  t->rejoining = true;
  // Ranks stay stable: the dead trainer's (a re-formation keeps ranks).
  t->rank = slot->rank;
  const uint64_t session = t->session_id;
  // The scheduler, broadcaster and replica checker may still point at it.
  retired_trainers_.push_back(std::move(slot));
  slot = std::move(t);
  ++attached_ever_;
  spdlog::info("event=attach_rejoining job={} local_rank={} pid={} rank={}", id_, local_rank, pid,
               slot->rank);
  return session;
}

absl::Status Job::CheckRejoiningDeviceLocked(const Trainer& t, const Layout& layout,
                                             const std::optional<GpuTrainerSpec>& cuda) const {
  const bool cuda_layout = !layout.empty() && layout[0].device >= 0;
  if (!gpu_session_) {
    if (!cuda && !cuda_layout) return absl::OkStatus();
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(t.Name(),
                                  " registered CUDA tensors to rejoin a running elastic job of "
                                  "CPU gradients (its layout must be the job's)"));
  }
  if (!cuda || !cuda_layout) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(t.Name(),
                                  " registered CPU tensors to rejoin a running elastic job of "
                                  "CUDA gradients (its layout must be the job's)"));
  }
  return gpu_session_->CheckReplacement(static_cast<size_t>(t.local_rank), *cuda, t.Name(),
                                        layout.size());
}

absl::StatusOr<RegisterResult> Job::RegisterRejoiningLocked(Trainer& t, Layout layout,
                                                            std::optional<GpuTrainerSpec> cuda,
                                                            absl::Time deadline) {
  RETURN_IF_ERROR(CheckRejoiningDeviceLocked(t, layout, cuda));
  if (auto diff = FirstDifference(layout_, layout)) {
    return MakeError(v1::MISMATCH,
                     absl::StrCat("layout mismatch on node ", config_.node_rank, ": ", t.Name(),
                                  " registered a different layout than the running job's, which "
                                  "it asks to rejoin: first difference at ",
                                  *diff));
  }
  RETURN_IF_ERROR(CreateSegmentLocked(t, LayoutHash(layout_)));
  t.layout = std::move(layout);
  // Opened by the scheduler at the boundary, never here: a collective may run now.
  t.cuda = std::move(cuda);
  t.registered = true;
  spdlog::info("event=register_rejoining job={} trainer={} iteration={}", id_, LogValue(t.Name()),
               scheduler_->iteration());
  scheduler_->RequestRejoin(&t);
  auto settled = [this, &t] {
    mu_.AssertReaderHeld();
    return t.admitted || !t.rejoin_refusal.ok() || state_ == JobState::kFailed || t.gone.load();
  };
  // Admission waits for the iteration under way and the next one's
  // agreement: allow one more timeout, as forming does.
  const bool done =
      mu_.AwaitWithTimeout(absl::Condition(&settled),
                           deadline + absl::Milliseconds(config_.timeout_ms) - MonotonicNow());
  if (t.gone.load()) return MakeError(v1::STATE, "the trainer left during registration");
  if (state_ == JobState::kFailed) return PeerError(t);
  if (!t.rejoin_refusal.ok()) return t.rejoin_refusal;
  if (!done) {
    return MakeError(v1::TIMEOUT,
                     absl::StrCat(t.Name(), " was not admitted to the running elastic job within ",
                                  2 * config_.timeout_ms / 1000.0,
                                  " s: no iteration boundary passed (the job is at iteration ",
                                  scheduler_->iteration(), ")"));
  }
  RegisterResult r;
  r.segment_name = t.segment.name();
  r.node_segment_name = node_->name();
  r.layout_hash = LayoutHash(layout_);
  r.arena_bytes = arena_.total_bytes;
  r.tensor_offsets = gpu_session_ ? flat_plan_.tensor_offsets : arena_.tensor_offsets;
  if (gpu_session_ && gpu_session_->flat()) {
    // Its predecessor's buffer, which the daemon owns: the same handle.
    r.flat_buffer_handle = gpu_session_->flat_handle(t.local_rank).ToBytes();
    r.flat_buffer_bytes = gpu_session_->flat_bytes();
  }
  r.rank = t.rank;
  r.world_size = world_.world_size;
  r.plan = scheduler_->plan();
  r.start_iteration = t.start_iteration;
  r.joined_running_job = true;
  r.catch_up_root = t.catch_up_root;
  return r;
}

void Job::OnTrainerRejoined(Trainer* fresh, uint64_t start_iteration, int catch_up_root) {
  MonotonicMutexLock lock(&mu_);
  fresh->start_iteration = start_iteration;
  fresh->catch_up_root = catch_up_root;
  fresh->admitted = true;
  if (broadcaster_) broadcaster_->ReplaceTrainer(fresh);
  if (replica_checker_) replica_checker_->ReplaceTrainer(fresh);
  spdlog::info("event=trainer_admitted job={} trainer={} start_iteration={} catch_up_root={}", id_,
               LogValue(fresh->Name()), start_iteration, catch_up_root);
}

void Job::OnTrainerRejoinRefused(Trainer* fresh, const absl::Status& error) {
  MonotonicMutexLock lock(&mu_);
  fresh->rejoin_refusal =
      MakeError(CodeOf(error), absl::StrCat(fresh->Name(),
                                            " could not take back its local rank in the running "
                                            "elastic job: ",
                                            error.message()));
  spdlog::warn("event=trainer_rejoin_refused job={} trainer={} error={}", id_,
               LogValue(fresh->Name()), LogValue(error.message()));
}

}  // namespace gradsync
