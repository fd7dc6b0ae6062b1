// Job: one training job's life on this node, from the first trainer's
// Attach to the last trainer's Detach.
//
//   attaching -> (all local trainers registered, layouts agree, the world is
//   formed across nodes) -> running -> (a trainer leaves or dies, a bad
//   entry, a timeout, a peer node fails) -> failed -> (every trainer gone)
//   -> finished; the daemon then starts a fresh Job for the next trainers.
//
// Errors are sticky: once failed, every trainer's next wait returns the
// error (through its completion ring and its Watch stream), like an aborted
// NCCL communicator. The daemon itself keeps serving.
//
// Threads: every method is thread-safe (RPC threads, the scheduler thread,
// the cluster link's heartbeat thread). One mutex guards the job's state;
// it is never held while the world forms (RPCs to the leader), while a
// world is torn down, or while a hook runs.
#ifndef GRADSYNC_DAEMON_ENGINE_JOB_H_
#define GRADSYNC_DAEMON_ENGINE_JOB_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "common/monotonic_mutex.h"
#include "daemon/backends/backend.h"
#include "daemon/config.h"
#include "daemon/engine/broadcaster.h"
#include "daemon/engine/bucket_planner.h"
#include "daemon/engine/gpu_reducer.h"
#include "daemon/engine/gpu_session.h"
#include "daemon/engine/replica_checker.h"
#include "daemon/engine/scheduler.h"
#include "daemon/engine/trainer.h"
#include "daemon/observe/job_stats.h"
#include "daemon/observe/scheduler_observer.h"
#include "ipc/arena.h"
#include "ipc/node_segment.h"

namespace gradsync {

// A node's live membership in a multi-node job (ClusterLink); nothing on
// one node. Destroyed when the job ends (it then leaves the generation).
class WorldLink {
 public:
  virtual ~WorldLink() = default;
  // The local job failed: tell the other nodes (through the leader).
  virtual void ReportError(const absl::Status& error) = 0;
  // The local job ends because this daemon shuts down (`why`): where the
  // job can go on without this node (elastic), it leaves the job for good
  // so that the others re-form without it at once; otherwise as ReportError.
  virtual void ReportDeparture(const absl::Status& why) { ReportError(why); }
  // Until what ReportDeparture started (the departure, or the error report)
  // has reached the rendezvous or failed, at most `limit`. A daemon shutting
  // down closes its ports only then: the others must hear it left before a
  // probe of its port (daemon/cluster/liveness_probe.h) finds it refusing.
  virtual void AwaitDeparted(absl::Duration /*limit*/) {}
  // Where to read this node's progress for heartbeats.
  virtual void SetProgress(std::function<uint64_t()> iteration) = 0;
  // A local stall, reported to the leader's log.
  virtual void ReportStall(const std::string& description) = 0;
  // Adds what the leader knows to a collective's failure (which node
  // failed, or that the leader itself is dead). May block briefly.
  virtual absl::Status Explain(const absl::Status& error) = 0;
  // The node ranks the last Explain named dead (none: the failure was not
  // a node's death). An elastic job re-forms only without dead nodes.
  virtual std::vector<int> DeadNodes() { return {}; }
  // The generation goes on without this link, for the other members too
  // (nodes join at this boundary and every member moves to the next one):
  // dropping it then must not leave or abort the generation.
  virtual void Retire() {}
  // Called with each job-wide config version in order: its bucket caps and
  // the iteration they start at.
  virtual void SetConfigListener(std::function<void(const BucketCaps& caps, uint64_t at_iteration,
                                                    uint64_t version, bool grow)>
                                     listener) = 0;
};

// Where an elastic job's survivor re-forms: the generation a node's death
// aborted and the iteration the survivor redoes. generation 0: a fresh job.
struct ResumePoint {
  uint64_t generation = 0;
  uint64_t iteration = 0;
  // Nodes join the running generation at `iteration` (nothing to redo):
  // the members' plan, which the joiners plan with.
  bool grow = false;
  RunningPlan plan;
};

// What forming the job across nodes yields (one node: trivial).
struct JobWorld {
  int world_size = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  uint64_t generation = 0;
  // The generation's nodes, and this node's place among them (its Gloo
  // rank, its slot in the per-iteration agreement): node ranks 0..n-1
  // unless an elastic job re-formed without some.
  int num_nodes = 1;
  int node_index = 0;
  // The generation's first member's node rank (node_index 0): it publishes
  // the job's caps and runs --autotune.
  int first_member = 0;
  std::unique_ptr<Backend> backend;
  // How the nodes agree on the rebuilt plan's order (empty on one node).
  Scheduler::OrderAgreement agree_order;
  // Every node's plan decision compared (empty on one node).
  std::function<absl::Status(const PlanStamp&)> check_plan;
  // The GPU path's key/value exchange through the rendezvous store, scoped
  // to this generation (empty on one node: then nothing leaves the node).
  // fetch's deadline is a MonotonicNow() time.
  std::function<absl::Status(const std::string& name, const std::string& value)> publish;
  std::function<absl::StatusOr<std::string>(const std::string& name, absl::Time deadline)> fetch;
  // Node 0's caps, so every node plans the same buckets (0: use the config).
  BucketCaps caps{0, 0};
  // Node 0's --uneven-inputs: gs_join allowed across nodes.
  bool uneven_inputs = false;
  // This node joined an elastic job while it ran: the job's iteration it
  // starts at and the members' plan (`start_iteration` 0: it did not).
  uint64_t start_iteration = 0;
  RunningPlan running_plan;
  std::shared_ptr<WorldLink> link;
};

// Forms the world once the local layout is agreed: on one node it returns
// a LocalBackend; across nodes it joins the rendezvous, checks every node's
// layout hash and builds the backend. Called without the job's lock held.
// `on_failure` fails the job later, when another node fails.
using WorldFormer = std::function<absl::StatusOr<JobWorld>(
    const Layout& layout, uint64_t hash, std::function<void(const absl::Status&)> on_failure)>;

struct RegisterResult {
  std::string segment_name;
  std::string node_segment_name;
  uint64_t layout_hash = 0;
  uint64_t arena_bytes = 0;
  std::vector<uint64_t> tensor_offsets;  // CUDA: in the flat device buffer
  // CUDA flat-buffer mode: the daemon-owned buffer this trainer maps.
  std::string flat_buffer_handle;
  uint64_t flat_buffer_bytes = 0;
  int rank = 0;
  int world_size = 1;
  BucketPlan plan;
  // The node joined the running job (JobWorld::start_iteration): where
  // this trainer's iterations start.
  uint64_t start_iteration = 0;
  bool joined_running_job = false;
  int catch_up_root = 0;  // with joined_running_job: gs_broadcast's root
};

enum class JobState { kAttaching, kForming, kRunning, kFailed };

// What a job tells the daemon around it.
struct JobHooks {
  std::string trace_dir;               // traces written on stalls and timeouts ("" = none)
  TimelineWriter* timeline = nullptr;  // --trace-file: every job streams into it (null = off)
  // Health: false with a reason when a job fails unexpectedly, true when a
  // job is running. Called without the job's lock, one call at a time per
  // job, in the order its state changed; it must not call back into the job.
  std::function<void(bool serving, const std::string& reason)> on_health;
  // The GPU path's device (null: CUDA tensors are refused).
  GpuRuntime gpu;
  // Multi-node: tells the leader which local trainers this node still
  // waits for before it can join (null: one node). Called without the lock.
  std::function<void(const std::string& report)> report_forming;
  // Each completed iteration of job `job` (--autotune); scheduler thread.
  std::function<void(uint64_t job, uint64_t iteration, uint64_t bytes, int64_t end_ns)>
      on_iteration_done;
  // The daemon's iteration-duration histogram across jobs (null = none);
  // it outlives every job.
  LatencyStats* iteration_durations = nullptr;
  // Elastic jobs (--min-nodes < --num-nodes): forms the world again among
  // the survivors of a node's death (null: a death ends the job).
  std::function<absl::StatusOr<JobWorld>(const Layout& layout, const ResumePoint& resume,
                                         std::function<void(const absl::Status&)> on_failure)>
      reform_world;
};

class Job {
 public:
  // `node`: the node segment this job's trainers are told to open; the job
  // keeps it mapped while it lives, even once the daemon replaced it.
  Job(const DaemonConfig& config, std::shared_ptr<ipc::NodeSegment> node, uint64_t id,
      WorldFormer former, JobHooks hooks);
  ~Job();  // stops the scheduler, removes the trainers' segments

  uint64_t id() const { return id_; }

  // Errors: STATE when the local rank is taken or the job is not accepting.
  // A running elastic job across nodes takes a trainer on the local
  // rank of one that died (job_rejoin.cc): it keeps that rank and joins at
  // an iteration boundary.
  absl::StatusOr<uint64_t> Attach(int local_rank, int64_t pid) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every local trainer registered and the world is formed,
  // or the deadline (a MonotonicNow() time, common/monotonic.h) passes, or
  // the job fails (e.g. MISMATCH). `cuda` is set iff the layout's tensors
  // are CUDA tensors.
  absl::StatusOr<RegisterResult> Register(uint64_t session, Layout layout, absl::Time deadline,
                                          std::optional<GpuTrainerSpec> cuda = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The trainer is gone: graceful Detach or a broken Watch stream. While
  // the job runs, its peers get PEER_FAILED.
  void Leave(uint64_t session, bool graceful, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails the job (idempotent; the first error wins). `culprit` (a local
  // rank) gets `error` itself; the other trainers get PEER_FAILED naming it.
  void Fail(const absl::Status& error, int culprit = -1) ABSL_LOCKS_EXCLUDED(mu_);
  // The daemon shuts down, or (culprit >= 0) a trainer died where no
  // survivors' average can absorb it: fails the job as Fail does, and this
  // node leaves a multi-node job for good (WorldLink::ReportDeparture),
  // which an elastic job survives.
  void Depart(const absl::Status& error, int culprit = -1) ABSL_LOCKS_EXCLUDED(mu_);
  // After Depart: WorldLink::AwaitDeparted, without the job's lock.
  void AwaitDeparted(absl::Duration limit) ABSL_LOCKS_EXCLUDED(mu_);

  // For Watch streams: waits up to `timeout` for the job to fail or the
  // trainer to leave. Returns the job's error (OK while healthy); *gone is
  // set when the session no longer exists.
  absl::Status WaitForChange(uint64_t session, absl::Duration timeout, bool* gone)
      ABSL_LOCKS_EXCLUDED(mu_);

  bool HasSession(uint64_t session) const ABSL_LOCKS_EXCLUDED(mu_);
  // Trainer records the job itself keeps (attached or left): at most one
  // per local rank, however many trainers came and went.
  size_t TrainerRecords() const ABSL_LOCKS_EXCLUDED(mu_);
  // The trainer's Watch stream is open (its liveness is now observed).
  // STATE (FAILED_PRECONDITION) when the session already has one: a
  // session holds one stream, so one RPC thread. NOT_FOUND once it is gone.
  absl::Status MarkWatched(uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes trainers attached longer than `grace` without a Watch stream;
  // returns their sessions (the registry forgets them).
  std::vector<uint64_t> ReapUnwatched(std::chrono::milliseconds grace) ABSL_LOCKS_EXCLUDED(mu_);
  // True once every trainer that attached has left.
  bool Finished() const ABSL_LOCKS_EXCLUDED(mu_);
  JobState state() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status error() const ABSL_LOCKS_EXCLUDED(mu_);

  struct TrainerInfo {
    int rank, local_rank;
    int64_t pid;
    std::string state;
    uint64_t iterations;
  };
  std::vector<TrainerInfo> Trainers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Trainers, buckets, totals, errors, stalls (GetStats).
  void FillStats(v1::Stats* out) const ABSL_LOCKS_EXCLUDED(mu_);
  // The flight recorder as Chrome trace JSON within `max_bytes` (newest
  // events kept); STATE before the job runs.
  absl::StatusOr<JobStats::BoundedTrace> TraceJson(size_t max_bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // New caps take effect at the boundary entering `at_iteration` (0: next).
  void SetCaps(const BucketCaps& caps, uint64_t at_iteration = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // Synced iterations per second, biased high (0 before the job runs): the
  // faster of the last few completions' rate (IterationRateWindow: start-up
  // does not count) and (iterations + 1) / max(elapsed, 10 ms) since the
  // job started running, so a job-wide change lands later, not late.
  double IterationRate() const ABSL_LOCKS_EXCLUDED(mu_);
  // gs_broadcast: one step of the trainer's call (see broadcaster.h and
  // local.proto's BroadcastRequest). STATE before the job runs; once the
  // job failed, the error this trainer gets (PEER_FAILED naming a culprit).
  absl::StatusOr<Broadcaster::StepResult> Broadcast(uint64_t session, uint64_t bytes, int root_rank,
                                                    uint64_t step, bool device, int fused_slot,
                                                    absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // gs_check_replicas: this trainer's parameter fingerprint after
  // `iteration` (see replica_checker.h). STATE before the job runs; once the
  // job failed, the error this trainer gets.
  absl::Status CheckReplicas(uint64_t session, uint64_t iteration,
                             const std::vector<uint64_t>& hashes, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // True while some trainer has marked gradients of an unfinished iteration.
  bool InIteration() const ABSL_LOCKS_EXCLUDED(mu_);
  int world_size() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t generation() const ABSL_LOCKS_EXCLUDED(mu_);
  std::string backend_name() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t iteration() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A health change, queued under mu_ and delivered by DeliverHealth().
  struct HealthChange {
    bool serving;
    std::string reason;
  };

  // Register's work; the caller delivers the health changes it queued.
  absl::StatusOr<RegisterResult> RegisterAndWait(uint64_t session, Layout layout,
                                                 absl::Time deadline,
                                                 std::optional<GpuTrainerSpec> cuda)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forms the world once the last local trainer registered: checks the
  // local layouts under mu_, forms the world with mu_ released, then starts
  // the job under mu_ unless it failed meanwhile.
  void Form() ABSL_LOCKS_EXCLUDED(mu_);
  // Phase 1 of Form: the agreed layout, or nullopt when the local layouts
  // differ (the job has then failed). Moves the job to kForming.
  std::optional<Layout> BeginFormLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "K of N local trainers registered; missing local ranks ...", or "" when
  // every local trainer registered.
  std::string MissingLocalRanksLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A running elastic job across nodes (CPU or GPU gradients), which counts
  // a dead trainer out and can take one on its local rank again
  // (job_rejoin.cc).
  bool TakesRejoinsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Attach of a trainer taking back the free `local_rank` of a running job.
  absl::StatusOr<uint64_t> AttachRejoiningLocked(int local_rank, int64_t pid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its Register: the layout must be the job's; its segment is created and
  // the scheduler admits it at an iteration boundary (OnTrainerRejoined),
  // up to `deadline`.
  absl::StatusOr<RegisterResult> RegisterRejoiningLocked(Trainer& t, Layout layout,
                                                         std::optional<GpuTrainerSpec> cuda,
                                                         absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its CUDA registration must fit its local rank's GPU place (GPU jobs),
  // and CPU gradients need a CPU job.
  absl::Status CheckRejoiningDeviceLocked(const Trainer& t, const Layout& layout,
                                          const std::optional<GpuTrainerSpec>& cuda) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Scheduler thread: `fresh` could not be taken in (its GPU memory or
  // events did not open); its Register returns `error`.
  void OnTrainerRejoinRefused(Trainer* fresh, const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  // Scheduler thread: `fresh` is in the job from `start_iteration` on.
  void OnTrainerRejoined(Trainer* fresh, uint64_t start_iteration, int catch_up_root)
      ABSL_LOCKS_EXCLUDED(mu_);
  // One trainer's segment for the job's layout.
  absl::Status CreateSegmentLocked(Trainer& t, uint64_t layout_hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Trainer* FindLocked(uint64_t session) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The same, shared: for a caller that keeps it across releasing mu_.
  std::shared_ptr<Trainer> HoldLocked(uint64_t session) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Leave's work under mu_; true when this was the last trainer of a
  // started job (its world is then released, outside mu_). `local_rank`:
  // the leaving trainer's, or left as is when the session is unknown.
  bool RemoveTrainer(uint64_t session, bool graceful, const std::string& reason, int* local_rank)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Also counts off the last trainer's departure (departures_in_flight_)
  // once the GPU session is gone.
  void ReleaseWorld() ABSL_LOCKS_EXCLUDED(mu_);
  // A departing (not the last) trainer's GPU handles and events, closed
  // once no reduction runs.
  void ReleaseDeparted(int local_rank) ABSL_LOCKS_EXCLUDED(mu_);
  // The GPU path's resources for a CUDA layout, opened in Form's unlocked
  // phase (they may wait on other nodes) and handed to StartLocked.
  struct GpuStart {
    ipc::ArenaLayout flat_plan;           // where tensors lie in a flat buffer
    std::unique_ptr<GpuSession> session;  // null: a CPU layout
  };
  // `cancel`: set (by Fail) to give up promptly.
  absl::StatusOr<GpuStart> OpenGpu(std::shared_ptr<std::atomic<bool>> cancel, const Layout& layout,
                                   const JobWorld& world, const std::vector<GpuTrainerSpec>& specs,
                                   const std::vector<std::string>& names) const
      ABSL_LOCKS_EXCLUDED(mu_);
  BucketCaps InitialCaps(const JobWorld& world) const;
  absl::Status StartLocked(const Layout& layout, JobWorld world, GpuStart gpu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // StartLocked's steps, in order: each trainer's segment (and global
  // rank), returned in local-rank order; the job's stats; the options of
  // the scheduler and the broadcaster it then creates.
  absl::StatusOr<std::vector<Trainer*>> CreateSegmentsLocked(uint64_t layout_hash)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CreateStatsLocked(const Layout& layout, size_t num_buckets, size_t num_trainers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Scheduler::Options SchedulerOptionsLocked(const BucketCaps& caps, bool cuda) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Broadcaster::Options BroadcasterOptionsLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether this daemon can take a layout of this kind at all.
  absl::Status CheckDeviceKind(const Layout& layout) const;
  std::string BackendNameLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether another thread is explaining a failed collective (see
  // explaining_), which then ends the job; logs the deferral.
  bool ExplainingElsewhere() const ABSL_LOCKS_EXCLUDED(mu_);
  // `expected`: a normal end (a trainer closed): logged at info level.
  // `departing`: the daemon shuts down (Depart).
  void FailLocked(const absl::Status& error, int culprit, bool expected = false,
                  bool departing = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PeerError(const Trainer& t) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The world of formation `epoch` failed (the cluster link's heartbeat):
  // a running elastic job re-forms (the scheduler does it), anything else
  // fails. A stale epoch's report is dropped.
  void OnWorldFailure(uint64_t epoch, const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  // Scheduler::Options::reform (the scheduler thread; daemon/engine/job_reform.cc).
  absl::StatusOr<Scheduler::Reformed> Reform(const absl::Status& error, uint64_t iteration)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reform's GPU step: the survivors' NCCL communicators, created in the
  // new generation (`world`, returned on success); no lock held.
  absl::StatusOr<JobWorld> ReformGpu(GpuSession& gpu, JobWorld world) ABSL_LOCKS_EXCLUDED(mu_);
  // What the GPU session needs of `world` as generation `generation`,
  // `cancelled` polled while its communicators form; INTERNAL for a world
  // of several nodes without the rendezvous exchange.
  absl::StatusOr<GpuSession::WorldInput> GpuWorldInput(const JobWorld& world, uint64_t generation,
                                                       std::function<bool()> cancelled) const;
  // Scheduler::Options::grow (the scheduler thread; daemon/engine/job_grow.cc):
  // nodes join the running job at the boundary entering `iteration`.
  absl::StatusOr<Scheduler::Reformed> Grow(uint64_t iteration, const RunningPlan& plan)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Reform's last step: installs the survivors' world.
  // `grown`: nodes joined (Grow), not a death.
  absl::StatusOr<Scheduler::Reformed> InstallReformedLocked(JobWorld world, bool grown = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool elastic() const { return config_.min_nodes_or_num() < config_.num_nodes; }
  // An elastic job across nodes that re-forms at a node's death (CPU and
  // GPU paths alike).
  bool reforms() const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return elastic() && world_.link && hooks_.reform_world;
  }
  // A running elastic job across nodes (CPU or CUDA gradients) where
  // `dead` (already marked gone) is not the node's last trainer: the world
  // shrinks by it.
  bool ShrinksOnTrainerDeathLocked(const Trainer& dead) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A running elastic job across nodes where `dead` was the node's last
  // trainer: the node leaves the job (a departure, as on SIGTERM).
  bool NodeLeavesOnTrainerDeathLocked(const Trainer& dead) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Every trainer of this node but `dead` is gone already.
  bool LastLiveTrainerLocked(const Trainer& dead) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Runs the health hook for every queued change, in order. Called by each
  // public method that may change the job's health, after releasing mu_.
  void DeliverHealth() ABSL_LOCKS_EXCLUDED(mu_, hooks_mu_);

  const DaemonConfig config_;
  const std::shared_ptr<ipc::NodeSegment> node_;
  const uint64_t id_;
  const WorldFormer former_;
  const JobHooks hooks_;

  // Serializes DeliverHealth, so changes are delivered in queue order even
  // when two threads deliver at once. Taken before mu_, never under it.
  absl::Mutex hooks_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  // Held while a departing trainer's GPU resources, or the whole job's, are
  // released, so a Detach never returns while another thread (ReleaseWorld
  // for the last trainer) still holds what that trainer may now free.
  absl::Mutex gpu_release_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable MonotonicMutex mu_;
  JobState state_ ABSL_GUARDED_BY(mu_) = JobState::kAttaching;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int culprit_ ABSL_GUARDED_BY(mu_) = -1;
  // The job ended because a trainer closed.
  bool failure_expected_ ABSL_GUARDED_BY(mu_) = false;
  // The job ended because the daemon shuts down (Depart): a world formed
  // after that (a re-formation in flight) is left the same way.
  bool departing_ ABSL_GUARDED_BY(mu_) = false;
  // A failed collective is being explained (Fail asks the leader why).
  // Meanwhile the world link's own notice of the leader's abort, which
  // says less (PEER_FAILED, not the cause's code), must not end the job
  // first: the explanation quotes the leader's report and ends it soon.
  bool explaining_ ABSL_GUARDED_BY(mu_) = false;
  // By local rank; null if not attached. A Trainer's own fields (layout,
  // registered, rank, segment) are also guarded by mu_, except what the
  // scheduler owns once the job runs (see trainer.h). Shared so that an
  // RPC waiting with mu_ released (Register) keeps its trainer alive when
  // a new trainer takes the rank; the record is freed when that RPC ends.
  std::vector<std::shared_ptr<Trainer>> trainers_ ABSL_GUARDED_BY(mu_);
  int attached_ever_ ABSL_GUARDED_BY(mu_) = 0;
  // Releases of trainers' GPU mappings still to come: trainers marked gone
  // whose Leave has not yet closed what the daemon maps of theirs
  // (directly, or through ReleaseWorld), and a Form whose phase 2 maps
  // them outside gpu_session_. A Detach returns only once it is zero.
  int departures_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // The cancellation of the OpenGpu in progress (its wait for other nodes
  // and the communicators' creation, which run without mu_): a fresh token
  // per opening, set by the job's failure.
  std::shared_ptr<std::atomic<bool>> gpu_open_cancel_ ABSL_GUARDED_BY(mu_);
  int registered_ ABSL_GUARDED_BY(mu_) = 0;
  // layout_, world_, arena_ and stats_ are written once, when the job
  // starts; the scheduler then reads them through references without mu_.
  Layout layout_ ABSL_GUARDED_BY(mu_);
  JobWorld world_ ABSL_GUARDED_BY(mu_);
  ipc::ArenaLayout arena_ ABSL_GUARDED_BY(mu_);
  // GPU path (CUDA layouts): where tensors lie in each trainer's flat
  // buffer, the device resources, and the reducer over them. Released only
  // after the scheduler stopped (ReleaseWorld, the destructor); the
  // scheduler uses the reducer without mu_ while it runs.
  ipc::ArenaLayout flat_plan_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<GpuSession> gpu_session_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<GpuReducer> gpu_reducer_ ABSL_GUARDED_BY(mu_);
  // "gpu-cuda", "gpu-sim"; kept for stats after release.
  std::string gpu_backend_name_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<JobStats> stats_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point running_since_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Scheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  // Created with the scheduler; destroyed after it (the scheduler asks it).
  std::unique_ptr<Broadcaster> broadcaster_ ABSL_GUARDED_BY(mu_);
  // --check-replicas-every; created with the scheduler.
  std::unique_ptr<ReplicaChecker> replica_checker_ ABSL_GUARDED_BY(mu_);
  std::vector<HealthChange> health_queue_ ABSL_GUARDED_BY(mu_);
  // Elastic jobs: bumped at each re-formation (stale failure reports of
  // an old world are dropped); the old worlds' backends, kept until the
  // job ends (the scheduler and broadcaster held raw pointers to them).
  uint64_t world_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int reformations_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<Backend>> retired_backends_ ABSL_GUARDED_BY(mu_);
  // Dead trainers whose local rank a rejoining trainer took: kept until the
  // job ends (the scheduler, broadcaster and replica checker held raw
  // pointers to them).
  std::vector<std::shared_ptr<Trainer>> retired_trainers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_JOB_H_
