// AutotuneDriver: runs --autotune on every daemon of a job; the tuning
// itself happens on one of them, the generation's first member (node 0 of
// a one-node job, of any job on the embedded leader, and on etcd until it
// dies: then the survivors' first member). No node leads on etcd, so the
// choice of tuner follows the membership every node already agrees on.
//
// After a generation's first iterations the tuner places every candidate of
// BucketAutotuner (daemon/engine/bucket_autotuner.h) in the generation's
// ordered config log at once, back to back from the earliest iteration every
// node can still reach, so every node re-plans to each candidate at the same
// boundary (as a `config set` would); then it scores them from this node's
// iteration completions and appends the fastest, which stays. Training is
// unchanged: only bucket boundaries move, at iteration boundaries.
//
// A re-formation (elastic jobs) starts a new config log: candidates and a
// choice not yet reached are dropped on every node alike, which keep the
// caps they run. A choice that took effect stays (the tuner keeps it);
// otherwise the new generation's first member tunes afresh. The other nodes
// only say which node tunes.
//
// Threads: OnIterationDone is called on the scheduler thread (quick: it
// queues the report, or drops it where this node does not tune); a thread
// of its own places, scores and publishes (without state_mu_: the config
// log may be in etcd), so neither the scheduler nor stats wait on the
// config log. OnWorldFormed from the thread forming the world, before
// its first iteration. FillStats from any thread.
#ifndef GRADSYNC_DAEMON_AUTOTUNE_DRIVER_H_
#define GRADSYNC_DAEMON_AUTOTUNE_DRIVER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/bucket_autotuner.h"
#include "gradsync/v1/control.pb.h"

namespace gradsync {

// Who tunes a generation that just formed.
struct TuningSeat {
  uint64_t job = 0;  // the daemon's job (JobRegistry's id) the world is for
  uint64_t generation = 0;
  int tuner_node_rank = 0;       // the generation's first member
  bool here = false;             // this daemon is it
  bool resumed = false;          // survivors re-formed a running job
  uint64_t first_iteration = 0;  // the generation's first (a survivor's redone one)
};

class AutotuneDriver {
 public:
  // The earliest iteration a job-wide change can still start at on every node.
  using EarliestIteration = std::function<uint64_t()>;
  // Appends caps to generation `generation`'s config log, at `at` or later;
  // returns the iteration they apply at (an error once that generation is
  // over).
  using Publish = std::function<absl::StatusOr<uint64_t>(const CapsCandidate& caps, uint64_t at,
                                                         uint64_t generation)>;

  AutotuneDriver(EarliestIteration earliest, Publish publish);
  ~AutotuneDriver();  // Stop()

  // Ends the thread once the event in hand is handled (no callback runs
  // after it returns); later events are dropped. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(queue_mu_);

  // A world formed (a job's first, or survivors' re-formation): `seat` says
  // who tunes it. Before its first iteration completes.
  void OnWorldFormed(const TuningSeat& seat) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Job `job` completed `iteration` at `end_ns` (steady clock), reducing
  // `bytes` per trainer. Scheduler thread.
  void OnIterationDone(uint64_t job, uint64_t iteration, uint64_t bytes, int64_t end_ns)
      ABSL_LOCKS_EXCLUDED(queue_mu_);
  // Candidates, their scores and the choice (Stats fields 30-33); on a node
  // that does not tune, which node does.
  void FillStats(v1::Stats* out) const ABSL_LOCKS_EXCLUDED(state_mu_);

 private:
  struct Report {
    uint64_t job, iteration, bytes;
    int64_t end_ns;
  };
  struct SeatChange {
    TuningSeat seat;
    uint64_t sequence;  // OnWorldFormed's count: a later one supersedes it
  };
  using Event = std::variant<Report, SeatChange>;

  void Loop() ABSL_LOCKS_EXCLUDED(queue_mu_, state_mu_);
  // Returns true when this node's tuning of the seat is over (its reports
  // are then dropped on arrival).
  bool HandleSeat(const SeatChange& change) ABSL_LOCKS_EXCLUDED(state_mu_);
  bool HandleReport(const Report& r) ABSL_LOCKS_EXCLUDED(state_mu_);
  // Places every candidate of a fresh tuner for a model of `gradient_mb`
  // and installs it; false (logged, the state says so) when the generation
  // ended.
  bool PlaceCandidates(double gradient_mb, uint64_t generation) ABSL_LOCKS_EXCLUDED(state_mu_);
  void LogScoresLocked() const ABSL_SHARED_LOCKS_REQUIRED(state_mu_);
  // Every candidate scored: appends the fastest, `best`. Returns true when
  // that failed (the tuning is then abandoned).
  bool PublishChoice(const CapsCandidate& best, uint64_t generation) ABSL_LOCKS_EXCLUDED(state_mu_);
  // Stops queueing reports, unless a newer seat arrived meanwhile.
  void StopReports(uint64_t sequence) ABSL_LOCKS_EXCLUDED(queue_mu_);

  // Candidates are placed once this many iterations of the generation
  // completed: after the order rebuild (a job's iteration 1), and once the
  // job's iteration rate, which sets how far ahead a change must be placed,
  // is measured rather than guessed.
  static constexpr uint64_t kFirstPlacedAfter = 2;

  const EarliestIteration earliest_;
  const Publish publish_;

  absl::Mutex queue_mu_;
  std::vector<Event> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool stop_ ABSL_GUARDED_BY(queue_mu_) = false;
  // Reports are queued only while this node tunes and its tuning of the
  // current seat is not over, so a tuned job, or a node that does not tune,
  // costs nothing per iteration.
  bool accepting_ ABSL_GUARDED_BY(queue_mu_) = false;
  uint64_t seat_sequence_ ABSL_GUARDED_BY(queue_mu_) = 0;

  mutable absl::Mutex state_mu_;
  TuningSeat seat_ ABSL_GUARDED_BY(state_mu_);
  std::optional<BucketAutotuner> tuner_ ABSL_GUARDED_BY(state_mu_);
  std::string state_ ABSL_GUARDED_BY(state_mu_) = "waiting for a job";
  uint64_t chosen_at_ ABSL_GUARDED_BY(state_mu_) = 0;
  // The choice's iteration completed here: every node runs it.
  bool choice_in_effect_ ABSL_GUARDED_BY(state_mu_) = false;

  std::thread thread_;  // last: starts once everything above is set up
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_AUTOTUNE_DRIVER_H_
