// StragglerTracker: which trainer of a job is late, and by how much.
//
// An allreduce makes every rank's step as slow as the slowest, so the slow
// rank cannot be told from the ones waiting for it by step times. The
// daemon can: it timestamps every readiness mark (the scheduler's monotonic
// clock) before any collective. Per iteration, a trainer's lateness is how
// long after the job's first trainer marked its last gradient this trainer
// marked its own last one.
//
// Clocks: a node never reads another node's clock. Each node measures its
// trainers' "slack": from a trainer's last mark to the moment the
// iteration's last collective completed on that node (its own monotonic
// clock). That completion happens at nearly the same true time on every
// node (the last bucket cannot complete anywhere before every node sent
// it), so slacks of different nodes compare: lateness = the job's largest
// slack - the trainer's slack. The error is how far apart the nodes see that
// completion (one network hop, plus any difference in the last bucket's
// write-back), documented in docs/DESIGN.md. Each node's largest and
// smallest slack of iteration k ride in the nodes' per-iteration agreement
// of iteration k+1 (WriteAgreement / ReadAgreement): no extra collective.
// Without that agreement (one node, or GPU jobs across nodes without
// --uneven-inputs) lateness is measured against the node's own first
// trainer ("node clock" scope).
//
// Per bucket the same, with that bucket's reduction in place of the last
// one: a trainer's bucket slack runs from its last mark of the bucket to
// the bucket's reduction returning on its node, and each node's largest
// bucket slack of the first kExchangedBuckets buckets rides in the
// agreement too (later buckets: against the node's own first trainer).
// The bucket a trainer was latest for, most often in the window, is its
// "usual bucket".
//
// Threads: Begin, OnMark, OnIterationDone, WriteAgreement and ReadAgreement
// are the scheduler thread's (no allocation in steady state); SetOptions
// comes before the scheduler starts; Fill is for any thread.
#ifndef GRADSYNC_DAEMON_OBSERVE_STRAGGLER_TRACKER_H_
#define GRADSYNC_DAEMON_OBSERVE_STRAGGLER_TRACKER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/observe/latency_stats.h"
#include "daemon/observe/scheduler_observer.h"
#include "gradsync/v1/control.pb.h"

namespace gradsync {

struct StragglerOptions {
  uint32_t window = 100;    // iterations the figures cover
  double share = 0.5;       // a straggler is last in more than this share of them
  double late_ms = 10;      // and late by more than this (median)
  double log_every_s = 60;  // the log line repeats at most this often per trainer
};

class StragglerTracker {
 public:
  struct TrainerId {
    int local_rank = 0;
    int rank = 0;
    int64_t pid = 0;
  };
  // The agreement's slots: one head (how many nodes sent figures), then
  // per node its largest and smallest slack. The head keeps the scheduler's
  // agreement a different length from gs_broadcast's on 2 nodes (see
  // broadcaster.cc), which a node mid-iteration relies on.
  static constexpr size_t kHeadSlots = 1;
  static constexpr size_t kSlotsPerNode = 2;
  // Then per node its largest slack for each of the plan's first buckets.
  static constexpr size_t kExchangedBuckets = 16;
  // Fewer iterations than this name nobody.
  static constexpr uint32_t kMinVerdictIterations = 10;

  StragglerTracker(std::string job_id, int node_rank, int num_nodes);

  void SetOptions(const StragglerOptions& options) ABSL_LOCKS_EXCLUDED(mu_);
  // Told, with the log line, when a trainer is named (the flight
  // recorder's trace marker). Set before the scheduler starts.
  using NamedListener = std::function<void(uint64_t iteration, int rank)>;
  void set_named_listener(NamedListener listener) { named_listener_ = std::move(listener); }

  // The scheduler's trainers (indexed by local rank), and whether the nodes
  // exchange an agreement every iteration (ReadAgreement will be called).
  void Begin(const std::vector<TrainerId>& trainers, bool exchanged) ABSL_LOCKS_EXCLUDED(mu_);
  // The agreement's nodes are the generation's members: this node's place
  // among them and how many (a re-formation or a grow changes both), and
  // whether they exchange an agreement now. The windows go on.
  void SetWorld(int node_index, int num_nodes, bool exchanged) ABSL_LOCKS_EXCLUDED(mu_);
  // A mark of `local_rank`'s for a tensor of `bucket`, seen at `ns`.
  void OnMark(int local_rank, uint32_t bucket, int64_t ns);
  // Iteration `iteration` is done: `buckets` indexed by bucket id, each
  // with the moment its reduction returned (done_ns), the last one's
  // collective completing last. Trainers that marked nothing (joined) are
  // left out.
  void OnIterationDone(uint64_t iteration, const std::vector<BucketTimeline>& buckets)
      ABSL_LOCKS_EXCLUDED(mu_);

  size_t agreement_slots() const {
    return kHeadSlots + (kSlotsPerNode + kExchangedBuckets) * static_cast<size_t>(slot_nodes_);
  }
  // Writes this node's slots of the last iteration not yet agreed on
  // (zeros when there is none) into `slots` (agreement_slots() of them).
  void WriteAgreement(double* slots) const;
  // The summed slots (as WriteAgreement's): finishes that iteration's figures.
  void ReadAgreement(const double* agreement) ABSL_LOCKS_EXCLUDED(mu_);

  // This node's trainers, and the settings the verdicts used.
  void Fill(google::protobuf::RepeatedPtrField<v1::TrainerLateness>* out,
            v1::StragglerSettings* settings) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Window {
    std::vector<int64_t> late_us;  // ring of window slots
    std::vector<uint8_t> last;
    std::vector<int32_t> bucket;
    uint64_t count = 0;  // iterations recorded
    std::unique_ptr<LatencyStats> histogram;
    bool logged = false;  // named in the log at least once
    int64_t logged_ns = 0;
  };
  struct Verdict {
    uint32_t n = 0;
    double mean_us = 0, p50_us = 0, p99_us = 0, share_last = 0;
    int32_t usual_bucket = -1;
    bool straggler = false;
  };
  // Records the pending iteration given the job's largest slack, whether
  // this node holds the job's last trainer and the job's largest slack per
  // exchanged bucket (-1: none; null: this node's figures only).
  void Finish(int64_t job_max_slack_us, bool node_has_last, const int64_t* job_bucket_max_us)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bucket trainer `t` of the pending iteration was latest for, -1: none.
  int32_t LatestBucket(size_t t, const int64_t* job_bucket_max_us) const;
  Verdict Judge(const Window& w, std::vector<int64_t>* scratch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LogDue(const Window& w) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeLog(size_t t, const Verdict& v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string job_id_;
  const int node_rank_;  // names this node in rows and logs
  // Scheduler thread only: the agreement's nodes (SetWorld), this node's
  // slots at slot_index_ of slot_nodes_.
  int slot_index_, slot_nodes_;
  std::string host_;
  NamedListener named_listener_;

  // Scheduler thread only.
  bool exchanged_ = false;
  size_t buckets_ = 0;
  std::vector<int64_t> last_mark_ns_;    // per trainer, this iteration (0: none)
  std::vector<int64_t> bucket_mark_ns_;  // [bucket * trainers + trainer]
  // The iteration done, waiting for the agreement: per trainer its slack
  // in µs (-1: marked nothing) and the bucket it was latest for.
  bool pending_ = false;
  uint64_t pending_iteration_ = 0;
  std::vector<int64_t> pending_slack_us_;
  size_t pending_buckets_ = 0;
  std::vector<int64_t> pending_bucket_slack_us_;  // [bucket * trainers + trainer], -1: none
  std::vector<int64_t> node_bucket_max_us_;       // per bucket, -1: none
  std::vector<int64_t> job_bucket_max_us_;        // kExchangedBuckets, ReadAgreement's
  int pending_last_ = -1;  // the local trainer strictly last, -1: a tie or none
  int64_t pending_max_us_ = 0, pending_min_us_ = 0;
  std::vector<int64_t> scratch_;  // Judge's, sized at Begin

  mutable absl::Mutex mu_;
  StragglerOptions options_ ABSL_GUARDED_BY(mu_);
  std::vector<TrainerId> trainers_ ABSL_GUARDED_BY(mu_);
  std::vector<Window> windows_ ABSL_GUARDED_BY(mu_);
  bool scope_job_ ABSL_GUARDED_BY(mu_) = false;  // exchanged_, for readers
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_STRAGGLER_TRACKER_H_
