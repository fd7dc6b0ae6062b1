// ReplicaChecker: gradsyncd --check-replicas-every N for one running job on
// this node (gs_check_replicas).
//
// After every N-th synchronized iteration each trainer hashes its
// parameters (one 64-bit hash per registered tensor) and sends them; once
// every local trainer still in the job (not joined) has, the last arrival
// compares them tensor by tensor in registration order against the lowest
// rank's: on one node at once, across nodes with every other node through
// the backend (replica_exchange.h), while the others wait. A difference
// fails the job, on every node, with MISMATCH naming the first differing
// tensor and the trainers and nodes on each side, before any waiting
// trainer returns: replicas that drifted apart (a nondeterministic kernel,
// a skipped step, corrupted memory) are named instead of trained on. A
// trainer that never sends within the timeout fails the job with TIMEOUT
// naming it; trainers that send for different iterations fail it with
// MISMATCH naming both (nodes: naming the nodes).
//
// Across nodes a job with --uneven-inputs is refused (a node whose
// trainers all joined would never compare): Check returns
// INVALID_ARGUMENT to the caller alone.
//
// Threads: Check from RPC threads (one per trainer at a time), Abort from
// whoever fails the job. `fail` is never called with the lock held.
#ifndef GRADSYNC_DAEMON_ENGINE_REPLICA_CHECKER_H_
#define GRADSYNC_DAEMON_ENGINE_REPLICA_CHECKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "common/monotonic_mutex.h"
#include "daemon/backends/backend.h"
#include "daemon/engine/replica_exchange.h"
#include "daemon/engine/scheduler.h"
#include "daemon/engine/trainer.h"

namespace gradsync {

class ReplicaChecker {
 public:
  struct Options {
    int64_t every = 0;  // --check-replicas-every; 0: off (every Check is refused)
    int node_rank = 0;
    int world_size = 1;
    bool uneven_inputs = false;  // the job's (node 0's) --uneven-inputs
  };
  using FailFn = Scheduler::FailFn;

  // `trainers` by local rank, `layout` and `backend` outlive this object.
  ReplicaChecker(std::vector<Trainer*> trainers, const Layout& layout, Backend* backend,
                 FailFn fail, Options options);

  // An elastic job re-formed: later comparisons run on `backend` (it
  // outlives this object), where this node is member `node_index`. Called
  // between iterations' collectives; a comparison running on the old
  // world failed with it.
  void SetWorld(Backend* backend, int node_index) ABSL_LOCKS_EXCLUDED(mu_);
  // An elastic job took `fresh` on the local rank of a trainer that died
  // (it outlives this object). Between iterations.
  void ReplaceTrainer(Trainer* fresh) ABSL_LOCKS_EXCLUDED(mu_);
  // The job's scheduler (it outlives this object): set once, before any
  // Check. A check due where nodes join runs in the grown world.
  void set_scheduler(const Scheduler* scheduler) { scheduler_ = scheduler; }

  // One trainer's fingerprint after synchronized iteration `iteration`;
  // blocks until every local trainer still in the job sent its and they
  // were compared, or the job fails, or `deadline` (a MonotonicNow() time)
  // passes. A misuse by the caller alone (off, not due, wrong count) is
  // refused without failing the job.
  absl::Status Check(const Trainer& caller, uint64_t iteration, const std::vector<uint64_t>& hashes,
                     absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_)
      // It releases mu_ around the comparison across nodes, which the
      // analysis cannot follow.
      ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // The job failed: every waiting and later Check returns `error`.
  void Abort(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A misuse by the caller alone, or OK.
  absl::Status Refusal(const Trainer& caller, uint64_t iteration, size_t hashes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fingerprints of the round being collected, by rank.
  std::vector<ReplicaFingerprint> RoundLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last arrival: compares the round (across nodes with the lock
  // released) and, when equal, ends it. *culprit: for the job's failure.
  absl::Status CompareRound(int* culprit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // The last arrival, while nodes join at this iteration boundary: waits
  // (others' arrivals wait without a deadline meanwhile) until the grown
  // world is installed, so that every member, and the joiners' trainers,
  // compare on it; TIMEOUT if it is not by `deadline`.
  absl::Status AwaitGrownWorldLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Any other arrival: waits for round `round` to end.
  absl::Status WaitLocked(const Trainer& caller, uint64_t round, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AcrossNodes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return backend_ != nullptr && backend_->num_nodes() > 1;
  }
  // Fails the job (lock released) and returns `error`.
  absl::Status FailJob(const absl::Status& error, int culprit = -1) ABSL_LOCKS_EXCLUDED(mu_);

  // By local rank; an element changes (ReplaceTrainer) and is read under mu_.
  std::vector<Trainer*> trainers_;
  const Layout& layout_;

  const FailFn fail_;
  const Options options_;
  const Scheduler* scheduler_ = nullptr;

  MonotonicMutex mu_;
  MonotonicCondVar cv_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  Backend* backend_ ABSL_GUARDED_BY(mu_);
  int node_index_ ABSL_GUARDED_BY(mu_);
  // The round being collected: its iteration (valid once count_ > 0), who
  // sent what.
  uint64_t iteration_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<uint64_t>> hashes_ ABSL_GUARDED_BY(mu_);  // per local rank
  std::vector<uint8_t> arrived_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_done_ ABSL_GUARDED_BY(mu_) = 0;
  // The last arrival compares across nodes (the others wait, without a
  // deadline of their own: the collectives have theirs).
  bool comparing_ ABSL_GUARDED_BY(mu_) = false;
  // The last round's outcome: set before its waiters wake, so none returns
  // OK for a round that failed before the job's Abort reaches them.
  absl::Status last_result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_REPLICA_CHECKER_H_
