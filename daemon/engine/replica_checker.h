// ReplicaChecker: gradsyncd --check-replicas-every N for one running job on
// this node (gs_check_replicas).
//
// After every N-th synchronized iteration each trainer hashes its
// parameters (one 64-bit hash per registered tensor) and sends them; once
// every local trainer still in the job (not joined) has, the last arrival
// compares them tensor by tensor in registration order against the lowest
// local rank's. A difference fails the job with MISMATCH naming the first
// differing tensor and the trainers (and node) on each side: replicas that
// drifted apart (a nondeterministic kernel, a skipped step, corrupted
// memory) are named instead of trained on. A trainer that never sends
// within the timeout fails the job with TIMEOUT naming it; trainers that
// send for different iterations fail it with MISMATCH naming both.
//
// One node only: the daemon refuses the flag on a multi-node job at start
// (daemon/config.cc); comparing across nodes is not implemented yet.
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
#include "daemon/engine/scheduler.h"
#include "daemon/engine/trainer.h"

namespace gradsync {

class ReplicaChecker {
 public:
  struct Options {
    int64_t every = 0;  // --check-replicas-every; 0: off (every Check is refused)
    int node_rank = 0;
  };
  using FailFn = Scheduler::FailFn;

  // `trainers` by local rank and `layout` outlive this object.
  ReplicaChecker(std::vector<Trainer*> trainers, const Layout& layout, FailFn fail,
                 Options options);

  // One trainer's fingerprint after synchronized iteration `iteration`;
  // blocks until every local trainer still in the job sent its and they
  // were compared, or the job fails, or `deadline` (a MonotonicNow() time)
  // passes. A misuse by the caller alone (off, not due, wrong count) is
  // refused without failing the job.
  absl::Status Check(const Trainer& caller, uint64_t iteration, const std::vector<uint64_t>& hashes,
                     absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // The job failed: every waiting and later Check returns `error`.
  void Abort(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The comparison, once everyone arrived: OK or the job's MISMATCH.
  absl::Status CompareLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Where(const Trainer& t) const;  // "rank 1 (local 1, pid 7) on node 0"
  // Fails the job (lock released) and returns `error`.
  absl::Status FailJob(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);

  const std::vector<Trainer*> trainers_;
  const Layout& layout_;
  const FailFn fail_;
  const Options options_;

  MonotonicMutex mu_;
  MonotonicCondVar cv_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  // The round being collected: its iteration (valid once count_ > 0), who
  // sent what.
  uint64_t iteration_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<uint64_t>> hashes_ ABSL_GUARDED_BY(mu_);  // per local rank
  std::vector<uint8_t> arrived_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_done_ ABSL_GUARDED_BY(mu_) = 0;
  // The last round's outcome: set before its waiters wake, so none returns
  // OK for a round that failed before the job's Abort reaches them.
  absl::Status last_result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_REPLICA_CHECKER_H_
