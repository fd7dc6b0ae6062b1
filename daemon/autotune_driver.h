// AutotuneDriver: runs --autotune for each job on the daemon that decides
// job-wide caps (the leader; the only daemon of a one-node job).
//
// After a job's first iterations it places every candidate of
// BucketAutotuner (daemon/engine/bucket_autotuner.h) in the job's ordered
// config log at once, back to back from the earliest iteration every node
// can still reach, so every node re-plans to each candidate at the same
// boundary (as a `config set` would); then it scores them from this node's
// iteration completions and appends the fastest, which stays. Training is
// unchanged: only bucket boundaries move, at iteration boundaries.
//
// Threads: OnIterationDone is called on the scheduler thread (quick: it
// queues the report); a thread of its own places, scores and publishes, so
// the scheduler never waits on the config log. FillStats from any thread.
#ifndef GRADSYNC_DAEMON_AUTOTUNE_DRIVER_H_
#define GRADSYNC_DAEMON_AUTOTUNE_DRIVER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/bucket_autotuner.h"
#include "gradsync/v1/control.pb.h"

namespace gradsync {

class AutotuneDriver {
 public:
  // The earliest iteration a job-wide change can still start at on every node.
  using EarliestIteration = std::function<uint64_t()>;
  // Appends caps to the running job's config log, at `at` or later; returns
  // the iteration they apply at (an error once the job is gone).
  using Publish = std::function<absl::StatusOr<uint64_t>(const CapsCandidate& caps, uint64_t at)>;

  AutotuneDriver(EarliestIteration earliest, Publish publish);
  ~AutotuneDriver();  // joins the thread

  // Job `job` completed `iteration` at `end_ns` (steady clock), reducing
  // `bytes` per trainer. Scheduler thread.
  void OnIterationDone(uint64_t job, uint64_t iteration, uint64_t bytes, int64_t end_ns)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Candidates, their scores and the choice (Stats fields 30-33).
  void FillStats(v1::Stats* out) const ABSL_LOCKS_EXCLUDED(state_mu_);

 private:
  struct Report {
    uint64_t job, iteration, bytes;
    int64_t end_ns;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(queue_mu_, state_mu_);
  void Handle(const Report& r) ABSL_LOCKS_EXCLUDED(state_mu_);
  // Places every candidate of a fresh tuner; false (logged) when the job ended.
  bool PlaceCandidates(BucketAutotuner& tuner);

  // Candidates are placed once this iteration completed: after the order
  // rebuild (iteration 1), and once the job's iteration rate, which sets how
  // far ahead a change must be placed, is measured rather than guessed.
  static constexpr uint64_t kFirstPlacedAfter = 2;

  const EarliestIteration earliest_;
  const Publish publish_;

  absl::Mutex queue_mu_;
  std::vector<Report> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;
  // The job whose tuning is over (or abandoned): its reports are dropped
  // without queueing, so a tuned job costs nothing per iteration.
  uint64_t finished_job_ ABSL_GUARDED_BY(queue_mu_) = 0;

  mutable absl::Mutex state_mu_;
  uint64_t job_ ABSL_GUARDED_BY(state_mu_) = 0;
  std::optional<BucketAutotuner> tuner_ ABSL_GUARDED_BY(state_mu_);
  std::string state_ ABSL_GUARDED_BY(state_mu_) = "waiting for a job";
  uint64_t chosen_at_ ABSL_GUARDED_BY(state_mu_) = 0;

  std::thread thread_;  // last: starts once everything above is set up
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_AUTOTUNE_DRIVER_H_
