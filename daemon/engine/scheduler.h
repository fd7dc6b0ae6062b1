// Scheduler: the daemon's hot loop for one running job.
//
// One thread drains every local trainer's readiness ring (it sleeps on the
// node-wide doorbell when there is nothing to do), validates each entry,
// counts readiness per bucket across the local trainers, and launches buckets
// strictly in plan order as soon as each is complete — while the trainers'
// backward pass is still producing the later gradients. Launching a bucket
// means reducing it (LocalReducer + Backend, or GpuReducer for CUDA
// gradients). After the last bucket it posts one "iteration done" entry to
// every trainer's completion ring — and nothing per bucket, so a model with
// more buckets than ring slots cannot fill it.
// Reductions run on this thread, so the collective order is the plan order
// by construction, identical on every node.
//
// Shared memory cut short under the daemon (ipc/truncation_guard.h): the
// loop checks every trainer's segment and the node segment on each pass,
// after each reduction and before reporting a bad entry, and fails the job
// naming the truncated segment (and its trainer) — nothing read from it
// after the cut is ever reported as a result.
//
// Who bounds a collective: the scheduler. The backend's own timeout and the
// GPU reducer's deadlines come first (their errors say more), but the loop
// cannot check a deadline while it is blocked inside a reduction, so a
// watchdog thread does: a bucket's reduction still running a short margin
// past Options::timeout_ms is aborted (Backend::Abort, or GpuReducer::Abort
// on the GPU path) and the job fails with TIMEOUT naming the bucket and the
// iteration; an elastic job aborts only the generation's collectives and
// re-forms instead where the leader names a silent node. A backend that
// ignores its own timeout therefore cannot hang the job, Stop or the Job's
// destructor; Stop aborts a reduction in flight.
//
// Threads: Start, Stop and the destructor belong to the owner (the Job);
// plan(), SetCaps() and the accessors are thread-safe. Everything else is
// the loop thread's, unlocked; the loop publishes a copy of each new plan
// under plan_mu_ and picks up new caps under caps_mu_. The watchdog shares
// only the in-flight slot (atomics) with the loop.
#ifndef GRADSYNC_DAEMON_ENGINE_SCHEDULER_H_
#define GRADSYNC_DAEMON_ENGINE_SCHEDULER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/layout.h"
#include "common/monotonic_mutex.h"
#include "daemon/backends/backend.h"
#include "daemon/engine/bucket_planner.h"
#include "daemon/engine/gpu_reducer.h"
#include "daemon/engine/kept_result.h"
#include "daemon/engine/local_reducer.h"
#include "daemon/engine/nonfinite_mode.h"
#include "daemon/engine/trainer.h"
#include "daemon/observe/scheduler_observer.h"
#include "daemon/observe/straggler_tracker.h"
#include "ipc/arena.h"
#include "ipc/doorbell.h"
#include "ipc/node_segment.h"

namespace gradsync {

class Scheduler {
 public:
  // Reports a job failure: `culprit` is the local rank at fault, -1 when no
  // local trainer is, kCollectiveFailed when the cross-node collective failed.
  using FailFn = std::function<void(const absl::Status& error, int culprit)>;
  static constexpr int kCollectiveFailed = -2;

  // Decides the ready order the plan is rebuilt from, identically on every
  // node (node 0's order, through the rendezvous); one node: `local` itself.
  // Every node calls it once, after iteration 0; `local` is empty where
  // local rank 0 observed no order (it joined at once), and an empty
  // answer means no node rebuilds.
  using OrderAgreement =
      std::function<absl::StatusOr<std::vector<uint32_t>>(const std::vector<uint32_t>& local)>;

  // An elastic job's world re-formed among the survivors of a node's death
  // (the Job owns everything; the old backend outlives the scheduler).
  struct Reformed {
    Backend* backend = nullptr;
    int world_size = 1;
    int node_index = 0;
    OrderAgreement agree_order;
    std::function<absl::Status(const PlanStamp&)> check_plan;
  };
  // Given the failed collective's error and the iteration being redone,
  // re-forms the world, or returns the job's error (no node died, fewer
  // than --min-nodes survive, the leader is gone). Runs on the loop thread.
  using ReformFn =
      std::function<absl::StatusOr<Reformed>(const absl::Status& error, uint64_t iteration)>;
  // Nodes join the running elastic job at the boundary entering
  // `iteration` (nothing in flight): forms the next generation with them,
  // handing them `plan` (the members' plan) to plan alike, or returns the
  // job's error. Runs on the loop thread.
  using GrowFn =
      std::function<absl::StatusOr<Reformed>(uint64_t iteration, const RunningPlan& plan)>;

  struct Options {
    int world_size = 1;
    int64_t timeout_ms = 300000;
    double stall_threshold_s = 60;
    size_t reduce_threads = 1;
    // One node: threads for the buckets still to reduce once every local
    // trainer has marked all its gradients (they sleep in gs_wait, so
    // their cores are free: the step's tail). 0: reduce_threads.
    size_t tail_reduce_threads = 0;
    BucketCaps caps;
    // DDP's one-time rebuild: after iteration 0, re-plan from the order in
    // which local rank 0 marked its gradients ready.
    bool rebuild_after_first_iteration = true;
    // Across nodes, gs_join needs every iteration to start with an exchange
    // of active-trainer counts (one small collective per iteration). CPU
    // jobs and elastic jobs always exchange (it also compares the nodes'
    // no_sync counts and the config versions they hold); fixed GPU jobs
    // only when asked (--uneven-inputs).
    bool uneven_inputs = false;
    // This node's rank: where it writes its no_sync count in the
    // per-iteration agreement (AgreeActiveTrainers).
    int node_rank = 0;
    // Its place among the generation's nodes (the agreement's slots); node
    // ranks 0..n-1 unless an elastic job re-formed without some.
    int node_index = 0;
    OrderAgreement agree_order;  // empty: use the local order
    // Elastic jobs: set, a failed cross-node collective re-forms the world
    // and redoes the iteration (every bucket's local sum is kept for it).
    ReformFn reform;
    // Elastic jobs: after a re-formation settled the iteration, settles a
    // gs_broadcast the death interrupted (Broadcaster::Resume) before any
    // broadcast runs on the new world. *collective_failed: re-form again.
    std::function<absl::Status(bool* collective_failed)> resume_broadcast;
    // Elastic jobs across nodes: nodes joining the running job (a "grow"
    // entry of the config log) are admitted through this.
    GrowFn grow;
    // A node that joined a running job: the job's iteration its scheduler
    // starts at and the members' plan (`plan` passed to the constructor is
    // already built from it); 0: a job that starts here.
    uint64_t start_iteration = 0;
    RunningPlan running_plan;
    // Elastic jobs across nodes: a trainer that died after marking only
    // part of an iteration takes its node out of the job through this
    // where the node keeps no copy of its trainers' inputs (its last
    // trainer; see KeepNodeWithoutTrainer) and the other nodes
    // redo the iteration without it. Empty: the job fails.
    FailFn leave_job;
    // Elastic jobs: a trainer that took back a dead trainer's local rank
    // (RequestRejoin) is in from iteration `start_iteration` on; its
    // catch-up gs_broadcast comes from `catch_up_root`. Loop thread, at the
    // boundary, just before the previous iteration's completion entries are
    // posted. Empty: none.
    std::function<void(Trainer* fresh, uint64_t start_iteration, int catch_up_root)> on_rejoined;
    // Elastic jobs: nodes or trainers join at this boundary, so every
    // trainer broadcasts its state from `catch_up_root` before iteration
    // `start_iteration`'s first mark; `old_members` by local rank: 1 where
    // the trainer was in the job before the join. Loop thread, before the
    // previous iteration's completion entries are posted. Empty: none.
    std::function<void(int catch_up_root, uint64_t start_iteration,
                       std::vector<uint8_t> old_members)>
        on_catch_up;
    // Elastic GPU jobs: an announced trainer whose GPU memory or events
    // could not be opened at the boundary stays out (its predecessor's slot
    // stays counted out); its Register gets `error`. Loop thread.
    std::function<void(Trainer* fresh, const absl::Status& error)> on_rejoin_refused;
    // Checks, before the first collective under a new plan decision, that
    // every node decided the same (MISMATCH naming both otherwise); may
    // block on the other nodes. Empty on one node.
    std::function<absl::Status(const PlanStamp&)> check_plan;
    // CUDA gradients: buckets go through this instead of the LocalReducer,
    // and `arena` is the flat-buffer plan. Owned by the job.
    GpuReducer* gpu = nullptr;
    // With gpu: true for an error that poisoned the device context.
    std::function<bool(const absl::Status&)> is_context_lost;
    // Asked before each trainer's first mark of an iteration (after the
    // iteration counts as started); false: the job failed (a gs_broadcast
    // is under way, see broadcaster.h). Empty: always allowed.
    std::function<bool(const Trainer&)> allow_marks;
    // The node segment the ready bell lives in: checked for truncation
    // like the trainers' segments. Owned by the job.
    const ipc::NodeSegment* node_segment = nullptr;
    // NaN/Inf in the gradients (CPU and GPU paths; see HandleNonFinite). The same on
    // every node of a job, like the other daemon flags.
    NonFiniteMode nonfinite = NonFiniteMode::kError;
    // Told every mark and iteration (who is the straggler); across nodes
    // its figures ride in the per-iteration agreement. Owned by the job's
    // stats; null: none.
    StragglerTracker* stragglers = nullptr;
  };

  // `trainers` are indexed by local rank and outlive the scheduler.
  Scheduler(std::vector<Trainer*> trainers, const Layout& layout, BucketPlan plan,
            const ipc::ArenaLayout& arena, Backend* backend, ipc::Doorbell* ready_bell,
            SchedulerObserver* observer, FailFn fail, Options options);
  ~Scheduler();

  void Start();
  // Stops the loop and joins it, aborting a reduction in flight first (the
  // job is over: nothing is reported for it).
  void Stop() ABSL_LOCKS_EXCLUDED(watchdog_mu_);
  // After a failure: stop posting completions; the loop idles until Stop.
  void Halt() { halted_.store(true, std::memory_order_release); }
  // Halts, then returns once no GPU reduction is in flight (it returns
  // promptly once the job's GpuSession is aborted). After it, no bucket
  // touches the trainers' memory again: a detaching trainer may free it.
  // Must not be called with the job's lock held (a reduction may fail the job).
  void WaitIdle() ABSL_LOCKS_EXCLUDED(launch_mu_);

  uint64_t iteration() const { return iteration_.load(std::memory_order_acquire); }
  // A copy of the current plan (it may be rebuilt at iteration boundaries).
  BucketPlan plan() const ABSL_LOCKS_EXCLUDED(plan_mu_);
  // Plan decisions so far: 1 for the initial plan, +1 for each iteration
  // boundary where the order was rebuilt or caps applied (even when the
  // buckets came out the same), so every node counts alike.
  uint64_t plan_version() const { return plan_version_.load(std::memory_order_acquire); }
  // Queues new caps for an iteration boundary (re-plans with the current
  // order): the one entering iteration `at_iteration`, or the next one when
  // 0. Changes apply in the order queued, each at its own boundary (a job's
  // config log gives strictly increasing iterations); every node of a job
  // gets the same ones so all re-plan together; reaching a boundary past a
  // change's first fails the job (STATE). `config_version`: the job-wide
  // version it is, for the plan check: job-wide versions must come 1, 2,
  // 3, ... with none missing (the plan decisions every node counts are a
  // function of them), else the job fails (INTERNAL) at the next boundary
  // instead of deciding a plan the other nodes do not. Thread-safe.
  // `grow`: not caps but nodes joining the running job at that boundary
  // (Options::grow; the caps stay).
  void SetCaps(const BucketCaps& caps, uint64_t at_iteration = 0, uint64_t config_version = 0,
               bool grow = false) ABSL_LOCKS_EXCLUDED(caps_mu_);
  // Elastic jobs: a re-formed generation's config log starts at version 1,
  // so the old one's queued versions go. Call once the old generation's
  // link is gone and before the new one's listener is set: the new link may
  // have read versions already, which the listener hands over at once.
  // Thread-safe.
  void RestartConfigLog() ABSL_LOCKS_EXCLUDED(caps_mu_);
  // True between an iteration's first mark and its completion.
  bool in_iteration() const { return in_iteration_.load(std::memory_order_acquire); }
  // True from the completion entry before nodes join (the trainers may
  // call gs_broadcast at once) until the grown world is installed or the
  // job failed: a broadcast must run in the grown world. True as well while
  // the survivors of a death re-form and settle a split iteration: that
  // runs collectives on the new world between iterations, which a
  // broadcast on it must not overlap.
  bool growing() const {
    return growing_.load(std::memory_order_acquire) || reforming_.load(std::memory_order_acquire);
  }
  // Uneven inputs (gs_join): trainers of the job still active in the last
  // iteration every node agreed on (the world size before any join), and
  // local trainers that joined.
  uint32_t active_trainers() const { return active_trainers_.load(std::memory_order_acquire); }
  // The world size the current iteration averages over (its divisor, what
  // iteration completions report to gs_get_job_info): the formed world
  // size, or the active trainers once a trainer died or joined dividing by
  // the active ones.
  int averaging_world_size() const { return averaging_world_size_.load(std::memory_order_acquire); }
  uint32_t joined_local_trainers() const { return joined_local_.load(std::memory_order_acquire); }
  bool all_joined() const { return all_joined_.load(std::memory_order_acquire); }
  // The agreement's fixed slots before the per-node ones (see agreement_).
  static constexpr size_t kAgreementHeader = 4;
  // Elastic jobs: the world failed outside a collective (the leader aborted
  // the generation): the loop re-forms at its next pass. Any thread.
  void RequestReform(const absl::Status& error) ABSL_LOCKS_EXCLUDED(reform_mu_);
  // Elastic jobs (CPU or GPU): local trainer `local_rank` died (its node
  // stays). It leaves the world at once if it marked nothing this
  // iteration, at the iteration's end if it marked everything (its gradient
  // is complete in its segment); one that died mid-backward: across nodes
  // with another local trainer (CPU or GPU path), every node redoes the
  // iteration without it (KeepNodeWithoutTrainer); else it takes its node
  // out (Options::leave_job). The loop decides at its next pass. Any thread.
  void RequestDeparture(int local_rank, const std::string& reason) ABSL_LOCKS_EXCLUDED(reform_mu_);
  // Elastic jobs: `fresh` (its segment created, its layout the job's)
  // takes back local rank fresh->local_rank, whose trainer died and counts
  // as joined. It is announced in the next per-iteration agreement that
  // finds that rank counted out, so every node flags that iteration's
  // completion (kCompletionTrainersJoined) and counts it from the next one
  // (docs/DESIGN.md, "Elastic jobs"). `fresh` outlives the scheduler. Any
  // thread.
  void RequestRejoin(Trainer* fresh) ABSL_LOCKS_EXCLUDED(reform_mu_);
  // The catch-up root the last agreement found: the lowest rank of the job
  // active in that iteration (-1: none known). Loop thread.
  int catch_up_root() const { return catch_up_root_; }

 private:
  void Loop();
  // Consumes every entry waiting in one trainer's ready ring; false if it
  // failed the job.
  bool ConsumeReadyRing(Trainer& t, int64_t now_ns, bool* progress);
  // Fails the job and returns true when a trainer's segment or the node
  // segment was truncated; only reads the guards' flags (cheap).
  bool FailIfTruncated();
  bool Launch(uint32_t bucket);
  // True when every local trainer still in the job marked all its tensors
  // this iteration: none computes any more, all wait for the result.
  bool LocalTrainersAllMarked() const;
  bool LaunchGpu(uint32_t bucket);
  // A GPU reduction's device error left the device unusable (sticky CUDA
  // error): the daemon exits; nothing is re-formed.
  bool DeviceLost(const absl::Status& device_error) const;
  // The in-flight slot around a bucket's reduction. Begin publishes it and
  // returns false if the scheduler is stopping (then do not reduce); End
  // clears it and returns what it held: the start, kTimedOut or kStopped.
  bool BeginReduction(uint32_t bucket, int64_t start_ns);
  int64_t EndReduction() { return inflight_since_ns_.exchange(kIdle); }
  // The job's error for a reduction the watchdog aborted; `st` is what the
  // reduction itself returned.
  absl::Status TimedOut(uint32_t bucket, const absl::Status& st) const;
  // Aborts whatever the reduction is blocked in. Any thread.
  void AbortReduction(const std::string& reason);
  // The watchdog's abort of a reduction past the timeout: AbortReduction,
  // or in an elastic job only the current generation's collectives (the
  // loop then re-forms where a node went silent). Watchdog thread.
  void AbortTimedOutReduction(const std::string& reason);
  void Watchdog() ABSL_LOCKS_EXCLUDED(watchdog_mu_);
  // A cross-node collective failed: re-form and redo the iteration where
  // the job is elastic (then true), else fail the job. False: it failed.
  bool CollectiveFailed(const absl::Status& error);
  // Re-forms the world (Options::reform) and rewinds the iteration to its
  // first bucket: launched buckets are redone from their kept sums.
  bool Recover(const absl::Status& error);
  // Right after a re-formation (scheduler_split_commit.cc): the survivors
  // compare the iterations they stopped in; where a death left some past
  // iteration I and others still in it, those past it broadcast I's kept
  // result and the others commit I with it (written back, completed with
  // I's divisor), so every survivor resumes at I+1. `collective_failed`:
  // the error came from the new generation's collectives (re-form again).
  absl::Status SettleSplitIteration(bool* collective_failed);
  // The behind node's part: I's result, received whole in kept_result_,
  // overwrites every arena (GPU path: every trainer's gradients on the
  // device) and I completes as it did on the others.
  absl::Status CommitReceivedIteration(int divisor, bool skipped);
  absl::Status WriteReceivedResult();
  // Where the reduction of a bucket also writes its average (kept_result_'s
  // sink), or nullptr: not kept here.
  KeptResultSink* KeptResultSinkFor();
  // After `bucket`'s reduction wrote its average back, also through `sink`
  // when not null: counts it kept (kept_result_). False: the job failed or
  // re-forms (the test hook, which releases `launch_lock` before it waits).
  bool KeepResult(uint32_t bucket, const KeptResultSink* sink,
                  absl::ReleasableMutexLock* launch_lock = nullptr)
      // It releases the caller's scoped lock through a pointer, which the
      // analysis cannot follow.
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_AT (scheduler_split_commit.cc):
  // true once, for the last bucket of that iteration on this node, after
  // overwriting its result in the trainers' memory; then the wait for the
  // release file and the collective's error.
  bool WithholdNow(uint32_t bucket);
  absl::Status AwaitWithheldRelease(uint32_t bucket);
  // Constructor's part: sizes kept_result_ where it is kept, reads the hook.
  void InitSplitCommit();
  // Takes over a re-formed or grown world: backend, world size, place,
  // the agreement's size; the new generation's config log starts afresh.
  void AdoptWorld(Reformed& world);
  // Sizes agreement_ for the backend's nodes, the straggler tracker's slots
  // included where the nodes exchange it, at this node's place among them.
  void SizeAgreement();
  // Whether the queued config changes reach a grow entry at the boundary
  // entering `next` (the same rule MaybeRebuild applies). Loop thread.
  bool GrowDueAt(uint64_t next) ABSL_LOCKS_EXCLUDED(caps_mu_);
  // Admits the nodes waiting to join (Options::grow) at this boundary;
  // false: the job failed.
  bool Grow() ABSL_LOCKS_EXCLUDED(caps_mu_);
  // The bucket's reduced result holds a NaN or an Inf: fails the job
  // (--nonfinite=error, false) or marks the iteration skipped (true).
  // `culprit`: a Describe* string, or empty when no local trainer holds one.
  bool HandleNonFinite(uint32_t bucket, const std::string& culprit);
  // "rank 1 (local 1, pid 7) on node 0 (host h): tensor 3 'fc.bias' element 5 = nan"
  std::string DescribeNonFinite(uint32_t bucket, const NonFiniteReport& report) const;
  std::string DescribeGpuNonFinite(const GpuNonFiniteReport& report) const;
  std::string DescribeCulprit(const Trainer* trainer, const std::string& tensor,
                              double value) const;
  // The bucket's reduction succeeded: timeline and observer.
  bool FinishLaunch(uint32_t bucket, const ReduceTimings& timings);
  void FinishIteration();
  // Posts kIterationDone to every active trainer, or kAllJoined to every
  // joined one, while holding all their completion locks; on failure sets
  // *culprit to the trainer's local rank. It locks a run-time set of
  // mutexes, which the analysis cannot follow.
  // `catch_up_root` rides on kIterationDone (CompletionEvent::catch_up_root).
  absl::Status PostToAll(ipc::CompletionKind kind, uint64_t it, int* culprit, uint32_t flags = 0,
                         int32_t catch_up_root = 0) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Installs `plan`: spans, counters, staging. At iteration boundaries only.
  void InstallPlan(BucketPlan plan) ABSL_LOCKS_EXCLUDED(plan_mu_);
  void MaybeRebuild() ABSL_LOCKS_EXCLUDED(caps_mu_);
  // The newest config version queued or applied here.
  uint64_t HeldConfigVersion() ABSL_LOCKS_EXCLUDED(caps_mu_);
  void CheckDeadlines(int64_t now_ns);
  // Every entry of an iteration carries the same no_sync count; false (the
  // job failed, MISMATCH naming both trainers) when `e` disagrees.
  bool CheckInStep(const Trainer& t, const ipc::ReadyEvent& e);
  // A trainer's gs_join entry: from now on it counts as ready with zeros
  // for every bucket (skipped by the local sum and the write-back).
  bool Join(Trainer& t, const ipc::ReadyEvent& e);
  void CountAsJoined(Trainer& t, bool divide_by_initial_world_size);
  // Elastic GPU jobs: a reduction failed blaming local trainer `t` (its
  // readiness event failed or never completed). A trainer that died shows
  // this before its Watch stream breaks, and its death, not this error,
  // decides what the job does (its node leaves: Job::RemoveTrainer). Waits
  // a bounded while for that; true once `t` is gone.
  bool TrainerDiedMeanwhile(const Trainer& t) const;
  // RequestDeparture's work on the loop thread; false: the job failed.
  bool TakeDepartures() ABSL_LOCKS_EXCLUDED(reform_mu_);
  // scheduler_trainer_loss.cc: an elastic CPU job across nodes keeps a
  // copy of each local trainer's input (several local trainers only), so
  // that one dying mid-iteration leaves its node in: the survivors' inputs
  // are put back where a launched bucket's write-back overwrote them, and
  // every node redoes the iteration over the remaining trainers. The
  // copies follow the world: taken (and allocated) while the job spans two
  // or more nodes, freed when it shrinks to this one (no other node to redo
  // with), taken again once a node joins. At construction and after every
  // world change (AdoptWorld), between reductions; `at_start` logs nothing.
  void FollowWorldWithInputCopies(bool at_start);
  // Whether this world needs the copies (an elastic job across nodes, two
  // or more trainers on this node).
  bool NeedsTrainerInputCopies() const;
  // Whether this node can form its survivors' sums after a mid-iteration
  // death (the copies exist and the reductions write them: across nodes).
  bool KeepsTrainerInputs() const;
  // The active trainers' copies, parallel to active_arenas_, where a
  // reduction writes them (two or more active: one left cannot lose one
  // and stay); nullptr otherwise.
  const std::vector<uint8_t*>* InputCopiesForReduce() const;
  // active_arenas_ (and their copies) from the trainers not joined.
  void RebuildActiveArenas();
  // `t` died after marking part of the iteration: it counts as joined, the
  // survivors' inputs of every summed bucket are restored and their kept
  // sums dropped, and the iteration is redone once its buckets ran.
  bool KeepNodeWithoutTrainer(Trainer& t, const std::string& reason);
  // The GPU path's RestoreSurvivorInputs (GpuReducer::RestoreInputs); false:
  // the job failed.
  bool RestoreSurvivorGpuInputs();
  void RestoreSurvivorInputs();
  // Elastic jobs across nodes exchange, with the last bucket of every
  // iteration, how many nodes lost a trainer mid-iteration (CPU: folded into
  // that bucket's collective where the backend can,
  // Backend::AllreduceCountsWithNext; GPU: on their own before it): a node's trainer loss makes
  // every node redo the iteration. Issue: before the last bucket's Launch; false when the job
  // failed or re-forms.
  bool CountsLostTrainers() const;
  bool IssueLostTrainerCount();
  // After the last bucket: false (rewound to redo it) when a node lost one.
  bool IterationStands();
  // Every bucket of the iteration again, the agreement first.
  void RewindIteration();
  // RequestRejoin's requests, moved to rejoins_pending_ (loop thread).
  void TakeRejoins() ABSL_LOCKS_EXCLUDED(reform_mu_);
  // For the agreement: the pending rejoins whose local rank counts as
  // joined now (rejoins_announced_); how many.
  int AnnounceRejoins();
  // This node's slot of the catch-up root: its lowest rank active in this
  // iteration, + 1 (0: none).
  double LowestActiveRankSlot() const;
  // The agreement's join slots (summed across nodes when `exchanged`):
  // trainers rejoin after this iteration, and from which rank they catch up.
  void ReadJoinSlots(const double* counts, bool exchanged);
  // At the boundary after the iteration that announced them, before its
  // completion entries: the job learns that the announced trainers are in
  // from `start_iteration` (Options::on_rejoined), so its broadcaster waits
  // for them in the catch-up gs_broadcast the members call once woken.
  void TellRejoined(uint64_t start_iteration);
  // Announces the catch-up of a join at `start_iteration` (on_catch_up).
  void TellCatchUp(uint64_t start_iteration) const;
  // GPU path, at the same boundary before TellRejoined (no reduction in
  // flight, no catch-up broadcast started, since the completion entries are
  // not posted): the announced trainers' CUDA memory and events are opened
  // in their predecessors' places (GpuReducer::ReplaceTrainer). One that
  // fails is dropped and refused (Options::on_rejoin_refused).
  void OpenRejoinedOnGpu();
  // After the completion entries: the announced trainers take their local
  // ranks' places (their marks, if any already, wait in their rings).
  void AdmitRejoins();
  // Before an iteration's first collective: the trainers of the job still
  // active in it, the same on every node (see docs/DESIGN.md). False when
  // the job failed, or when none is active: every trainer joined, the
  // joined trainers are told and the loop stops.
  bool AgreeActiveTrainers();
  // Whether AgreeActiveTrainers exchanges its counts across nodes.
  bool ExchangesCounts() const;
  // A GPU trainer that died after marking everything, whose readiness
  // events then failed: its node leaves the job (Options::leave_job).
  void LeaveForIncompleteWork(const Trainer& t, const absl::Status& error);
  // The agreement's cross-node results, once summed: nodes in step, the
  // config version every node holds.
  bool FinishAgreement();
  // After the agreement: MISMATCH naming two nodes whose trainers summed a
  // different number of iterations (no_sync) into this iteration's gradients.
  bool CheckNodesInStep();
  // What this iteration's sum is divided by (DDP's divide_by_initial_world_size):
  // the one place it is decided.
  int Divisor() const;
  uint32_t ActiveLocalTrainers() const;
  // GRADSYNC_DEBUG=detail: false (the job failed, naming the trainer and
  // tensor) when a gradient of `bucket` changed since it was marked.
  bool CheckUnwrittenSinceMark(uint32_t bucket);
  // "rank 1 (local 1, pid 7): fc2.weight, fc2.bias; rank 2 ...: 3 tensors"
  std::string DescribeMissing(int64_t only_bucket) const;

  std::vector<Trainer*> trainers_;
  const Layout& layout_;
  const ipc::ArenaLayout& arena_;
  BucketPlan plan_;  // the loop's current plan
  mutable absl::Mutex plan_mu_;
  BucketPlan published_plan_ ABSL_GUARDED_BY(plan_mu_);  // a copy of plan_, for plan()
  std::atomic<uint64_t> plan_version_{0};
  std::vector<uint32_t> order_;           // current ready order the plan follows
  std::vector<uint32_t> observed_order_;  // local rank 0's marks in iteration 0
  struct PendingCaps {
    BucketCaps caps;
    uint64_t at_iteration = 0;
    uint64_t config_version = 0;
    bool grow = false;
  };
  absl::Mutex caps_mu_;
  std::deque<PendingCaps> pending_caps_ ABSL_GUARDED_BY(caps_mu_);  // in order
  uint64_t last_queued_version_ ABSL_GUARDED_BY(caps_mu_) = 0;
  std::string caps_gap_ ABSL_GUARDED_BY(caps_mu_);  // non-empty: a version went missing
  uint64_t config_version_ = 0;                     // loop thread: the last version applied
  // Loop thread: this iteration's agreement carried every node's held
  // config version, and the lowest of them (what every node holds).
  bool config_agreed_ = false;
  uint64_t agreed_config_version_ = 0;
  std::vector<std::vector<ReduceSpan>> spans_;  // per bucket
  uint64_t staging_bytes_ = 0;                  // the largest bucket's, staged
  // Elastic jobs: every bucket's local sum this iteration, at kept_offset_[b].
  std::vector<uint8_t> kept_;
  std::vector<uint64_t> kept_offset_;
  std::vector<KeptSums> kept_sums_;  // per bucket: pointers into kept_
  // Elastic jobs across nodes: the last completed iteration's result (on
  // the GPU path its bookkeeping; the bytes are in device memory).
  KeptResult kept_result_;
  // Committing an iteration received from another survivor: its
  // completion decides no plan (the others decided theirs already).
  bool committing_split_ = false;
  // The test hook's iteration + 1 (0: off) and the file it waits for.
  uint64_t withhold_at_plus_one_ = 0;
  std::string withhold_until_file_;
  absl::Mutex reform_mu_;
  absl::Status reform_request_ ABSL_GUARDED_BY(reform_mu_);
  std::atomic<bool> reform_requested_{false};
  std::vector<std::pair<int, std::string>> departures_ ABSL_GUARDED_BY(reform_mu_);
  std::atomic<bool> departures_requested_{false};
  std::vector<Trainer*> rejoins_ ABSL_GUARDED_BY(reform_mu_);
  std::atomic<bool> rejoins_requested_{false};
  // Loop thread: rejoining trainers not yet admitted, those this
  // iteration's agreement announced, whether any node announced one, and
  // the lowest rank active in the job this iteration.
  std::vector<Trainer*> rejoins_pending_;
  std::vector<Trainer*> rejoins_announced_;
  bool trainers_rejoin_ = false;
  int catch_up_root_ = -1;
  std::vector<uint8_t*> arenas_;         // per local trainer
  std::vector<uint8_t*> active_arenas_;  // of the trainers that have not joined
  // Elastic CPU jobs across nodes, several local trainers: per local rank,
  // an arena-sized copy of its input as the sum pass read it (empty: not
  // kept), and the active trainers' bases, parallel to active_arenas_.
  std::vector<std::vector<uint8_t>> input_copies_;
  std::vector<uint8_t*> active_copies_;
  bool input_copies_on_ = false;  // either path's copies are taken now
  // A trainer died after part of this iteration was summed with it: every
  // node redoes the iteration (AgreeIterationStands).
  bool trainer_lost_mid_iteration_ = false;
  double lost_trainer_count_ = 0;  // the exchange's (IssueLostTrainerCount)
  Backend* backend_;
  ipc::Doorbell* ready_bell_;
  SchedulerObserver* observer_;
  FailFn fail_;
  Options options_;
  LocalReducer reducer_;

  // Loop state (scheduler thread only).
  std::vector<uint32_t> remaining_;  // per bucket: marks still missing
  std::vector<BucketTimeline> timelines_;
  uint32_t next_bucket_ = 0;
  uint64_t marks_ = 0;  // marks seen this iteration
  // The no_sync count of the iteration's first entry, and whose it was.
  uint32_t no_sync_iterations_ = 0;
  const Trainer* no_sync_reference_ = nullptr;
  uint64_t checksummed_marks_ = 0;  // this iteration: entries with a checksum
  // --nonfinite=skip: this iteration's result was not finite; the first
  // culprit this node saw ("" if none of its trainers holds one).
  bool skip_step_ = false;
  // An elastic re-formation happened in this iteration: its "iteration
  // done" entry says so (kCompletionMembersChanged).
  bool members_changed_ = false;
  std::string skip_culprit_;
  std::string skip_trainer_;        // skip_culprit_'s trainer part: the stats' key
  std::string host_;                // this node's host name, for culprits' names
  int64_t iteration_start_ns_ = 0;  // first mark of the iteration
  int64_t last_progress_ns_ = 0;
  bool stall_reported_ = false;
  uint64_t bytes_per_iteration_ = 0;
  // Uneven inputs: agreed (AgreeActiveTrainers) before the iteration's
  // first bucket; divide by the active count once a trainer joined asking so.
  bool active_agreed_ = false;
  // The agreement rides with the first bucket's first collective
  // (Backend::AllreduceCountsWithNext): its results are checked once that
  // bucket's reduction returns (FinishAgreement), before the bucket counts
  // as done.
  bool agreement_in_flight_ = false;
  // The agreement's counts: [active, joined asking divide_by_initial_world_size,
  // joined asking not, trainers rejoining after this iteration], then per
  // node its no_sync count + 1 (0: none of its trainers marked), then per
  // node the newest config version it holds, then per node its lowest
  // active rank + 1 (the catch-up root), then the straggler tracker's
  // slots (from straggler_slot_; none without a tracker or an exchange).
  // Sized once per world (SizeAgreement): no allocation per iteration.
  std::vector<double> agreement_;
  size_t straggler_slot_ = 0;
  int agreement_nodes_ = 1;
  int active_in_iteration_ = 0;
  bool divide_by_active_ = false;
  std::atomic<uint32_t> active_trainers_{0};
  std::atomic<int> averaging_world_size_{0};
  std::atomic<uint32_t> joined_local_{0};
  std::atomic<bool> all_joined_{false};

  std::atomic<uint64_t> iteration_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> halted_{false};
  std::atomic<bool> in_iteration_{false};
  std::atomic<bool> growing_{false};
  std::atomic<bool> reforming_{false};  // inside Recover
  std::string bad_plan_;                // non-empty: a plan that must not run (an internal bug)
  std::chrono::nanoseconds spin_;       // before sleeping on the node doorbell
  // Held by a GPU reduction (see WaitIdle); guards no field, orders
  // WaitIdle after any reduction that started before the Halt.
  absl::Mutex launch_mu_;
  std::thread thread_;

  // The in-flight slot: the loop writes the bucket and iteration, then the
  // start time (> 0) before a reduction, and swaps kIdle back after it.
  // Whoever aborts the reduction (watchdog or Stop) first swaps the start it
  // saw for kTimedOut / kStopped, so exactly one of them aborts, only the
  // reduction it judged, and the loop learns why its reduction failed.
  // Sequentially consistent, also against stop_ (see BeginReduction).
  static constexpr int64_t kIdle = 0;
  static constexpr int64_t kTimedOut = -1;
  static constexpr int64_t kStopped = -2;
  std::atomic<int64_t> inflight_since_ns_{kIdle};
  std::atomic<uint32_t> inflight_bucket_{0};
  std::atomic<uint64_t> inflight_iteration_{0};
  MonotonicMutex watchdog_mu_;
  MonotonicCondVar watchdog_cv_;
  bool watchdog_stop_ ABSL_GUARDED_BY(watchdog_mu_) = false;
  std::thread watchdog_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_SCHEDULER_H_
