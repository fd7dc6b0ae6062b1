// Trainer: the daemon's view of one attached trainer process — its identity,
// its registered layout, its shared-memory segment, and the scheduler's
// per-iteration bookkeeping for it.
//
// Threads: each field below sits in one of four groups, by who may touch
// it (the Job's mutex lives in the Job, so the first group's guard is
// written in words, not as ABSL_GUARDED_BY):
//   - job-locked: guarded by the owning Job's mu_ while trainers attach and
//     register; read-only once the job runs (the scheduler reads them);
//   - atomic: any thread;
//   - guarded by `completion_mu`: the completion ring's producer side;
//   - scheduler-only: the scheduler thread's per-iteration bookkeeping.
#ifndef GRADSYNC_DAEMON_ENGINE_TRAINER_H_
#define GRADSYNC_DAEMON_ENGINE_TRAINER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/layout.h"
#include "daemon/engine/gpu_session.h"
#include "ipc/trainer_segment.h"

namespace gradsync {

struct Trainer {
  // Job-locked (Job::mu_ until the job runs, then read-only).
  uint64_t session_id = 0;
  int local_rank = 0;
  int64_t pid = 0;
  int rank = -1;  // global, once the job's world is known
  Layout layout;
  std::optional<GpuTrainerSpec> cuda;  // CUDA layouts: what it registered
  bool registered = false;
  std::chrono::steady_clock::time_point attached_at;
  ipc::TrainerSegment segment;
  // Elastic jobs: attached while the job ran, taking back the local
  // rank (and rank) of a trainer that died (Job::AttachRejoiningLocked).
  // Job-locked even while the job runs: the scheduler sets `admitted`
  // through Job::OnTrainerRejoined, with the iteration it starts at and the
  // rank its catch-up gs_broadcast comes from.
  bool rejoining = false;
  bool admitted = false;
  // GPU jobs: why the scheduler could not take it in (OK: not refused).
  absl::Status rejoin_refusal;
  uint64_t start_iteration = 0;
  int catch_up_root = 0;

  // Atomic (any thread).
  std::atomic<bool> gone{false};
  // Liveness comes from the Watch stream: a trainer that never opens it
  // (it died right after attaching) is reaped after a while.
  std::atomic<bool> watched{false};
  std::atomic<uint64_t> iterations{0};  // synced iterations completed
  // gs_join: out of data, contributes zeros until every trainer joined
  // (written by the scheduler, read by stats).
  std::atomic<bool> joined{false};

  // Guarded by completion_mu: the producer side of the completion ring (the
  // scheduler posts bucket and iteration completions, the control path
  // posts errors).
  absl::Mutex completion_mu;
  uint64_t completion_sequence ABSL_GUARDED_BY(completion_mu) = 0;

  // Scheduler-only: the iteration being collected.
  uint64_t ready_sequence = 0;
  std::vector<uint8_t> marked;  // per tensor: 0, or the ReadyKind seen
  uint32_t marked_count = 0;
  // Per tensor: the MarkChecksum its entry carried (GRADSYNC_DEBUG=detail), 0: none.
  std::vector<uint32_t> mark_checksums;
  bool divide_by_initial_world_size = true;  // what its gs_join asked
  // Elastic jobs: died after marking this iteration's gradients; leaves the
  // world when the iteration completes (scheduler thread only).
  bool departing = false;

  std::string Name() const;  // "rank 3 (local 1, pid 4242)"
};

// Posts one completion entry and rings the trainer's doorbell when `wake`.
// kIterationDone: `bucket` is the iteration's world size (the field they
// share, ipc/events.h); the entry carries the trainer's rank.
// A ring that stays full for `patience_ms` means the trainer stopped
// consuming: the post fails (the caller treats the trainer as failed).
absl::Status PostCompletion(Trainer& trainer, ipc::CompletionKind kind, uint32_t bucket,
                            uint64_t iteration, int32_t status, bool wake,
                            int64_t patience_ms = 1000) ABSL_LOCKS_EXCLUDED(trainer.completion_mu);

// The same with trainer.completion_mu already held by the caller (to post
// to several trainers as one step). Does not ring the doorbell.
absl::Status PostCompletionLocked(Trainer& trainer, ipc::CompletionKind kind, uint32_t bucket,
                                  uint64_t iteration, int32_t status, int64_t patience_ms = 1000,
                                  uint32_t flags = 0)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(trainer.completion_mu);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_TRAINER_H_
