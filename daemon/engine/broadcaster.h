// Broadcaster: gs_broadcast for one running job on this node.
//
// Every trainer of the job ends with the root rank's bytes. Locally the
// bytes go through one staging segment per job (two slots of kPieceBytes,
// created at the first broadcast): the root trainer writes a piece into a
// slot, every other local trainer copies it out, so one copy leaves the
// root and each reader makes one. Across nodes each piece crosses once per
// node with the backend's broadcast (Gloo's), from the root's node into
// the same slot; in a job with CUDA gradients too (host buffers: those
// gradients go through the device's collectives, the Gloo worker is idle
// between iterations). Any size, 0 bytes to GiBs, in pieces: the segment stays
// small. The protocol (steps, slots) is written down in local.proto
// (BroadcastRequest).
//
// Device buffers (a job with CUDA gradients; BroadcastRequest.device): the
// same steps, with the slots in device memory, two per GPU of the node
// (GpuSession::EnsureBroadcastSlots), mapped by the trainers on that GPU:
// the root copies a piece in on its stream and synchronizes it before its
// call, the others copy it out after theirs (device to device, no host
// copy). Each piece crosses GPUs and nodes with one ncclBroadcast over the
// job's communicators, from the root's GPU's NCCL rank (one GPU on one
// node: nothing to move). Across nodes the agreement carries that rank
// and whether the buffer is device memory.
//
// A broadcast runs between iterations: the scheduler is idle then, so its
// collectives and the broadcast's never overlap. A trainer mid-iteration
// (it marked a gradient the iteration has not completed) while another
// waits in gs_broadcast fails the job with STATE naming both, whichever
// came first (the scheduler asks AllowMarks before a trainer's first mark
// of an iteration; Step checks the scheduler). Trainers that disagree on
// the size or the root fail it with MISMATCH naming them (nodes: with
// each node's values); a trainer that never calls fails it with TIMEOUT
// naming it; a trainer that dies fails the job as always (PEER_FAILED
// naming it), and Abort wakes every waiting call. In an elastic CPU job a
// dead trainer is counted out instead, and a call does not wait for it; a
// root whose trainer died is refused (INVALID_ARGUMENT naming it).
//
// Elastic jobs: after a re-formation the job hands over the new
// generation's backend and this node's place among its members
// (SetWorld); each call runs on the world it was collected in. Trainers
// keep the ranks they registered with, so a root is any rank of the first
// world; one on a node that is no longer a member fails the agreement
// ("is on no node of the job").
//
// The catch-up broadcast a join announces (ExpectCatchUp) whose root's
// node dies runs again from the lowest live old member; every local call
// from the dead root is answered "restart from" it (broadcaster_catch_up.cc).
//
// A node's death during a broadcast (broadcaster_resume.cc): a call whose
// collective failed asks the job to re-form (set_on_world_failure) and
// waits; the scheduler's re-formation then calls Resume, which compares
// where every survivor stopped (one small exchange) and either completes
// the failed step from the survivors that got past it (one step apart at
// most) or lets the call run again on the new world.
//
// Threads: Step from RPC threads (one per trainer at a time), AllowMarks
// from the scheduler thread, Abort from whoever fails the job. `fail` is
// never called with the lock held (it takes the job's lock, which calls
// Abort).
#ifndef GRADSYNC_DAEMON_ENGINE_BROADCASTER_H_
#define GRADSYNC_DAEMON_ENGINE_BROADCASTER_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/monotonic_mutex.h"
#include "daemon/backends/backend.h"
#include "daemon/engine/gpu_session.h"
#include "daemon/engine/scheduler.h"
#include "daemon/engine/trainer.h"
#include "ipc/shared_segment.h"

namespace gradsync {

class Broadcaster {
 public:
  // Each slot of the staging segment (the segment holds two).
  static constexpr uint64_t kPieceBytes = 4ull << 20;

  struct Options {
    int node_rank = 0;
    int num_nodes = 1;    // the first world's nodes
    int node_index = 0;   // this node's place among them (its Gloo rank)
    int rank_offset = 0;  // global rank of local rank 0
    int world_size = 1;   // ranks are 0..world_size-1 (the first world's)
    int64_t timeout_ms = 300000;
    std::string shm_prefix = "gradsync";
    mode_t shm_mode = 0600;
    gid_t shm_group = static_cast<gid_t>(-1);
  };
  using FailFn = Scheduler::FailFn;

  // `trainers` by local rank; they and `backend` outlive this object.
  Broadcaster(std::vector<Trainer*> trainers, Backend* backend, FailFn fail, Options options);
  // The job's scheduler (it outlives this object too): set once, before
  // the scheduler starts and before any Step.
  void set_scheduler(const Scheduler* scheduler) { scheduler_ = scheduler; }
  // The job's device resources when its gradients are CUDA tensors (null:
  // host buffers only). Set once, before any Step; it outlives this object.
  void set_gpu(GpuSession* gpu) { gpu_ = gpu; }
  // Elastic jobs across nodes: a collective of a call failing (a death)
  // calls this with the failed world's epoch and the error instead of
  // failing the job, and the call waits for Resume. Set once, before any Step.
  using WorldFailedFn = std::function<void(uint64_t epoch, const absl::Status& error)>;
  void set_on_world_failure(WorldFailedFn fn) { on_world_failure_ = std::move(fn); }
  ~Broadcaster();  // removes the staging segment's name

  struct StepResult {
    std::string segment_name;  // step 0
    uint64_t segment_bytes = 0;
    uint64_t piece_bytes = kPieceBytes;
    std::string device_handle;  // step 0 of a device broadcast: the caller's GPU's slots
    bool fused = false;         // step 0 also moved the buffer (fused_slot): it is done
    // The catch-up root's node died: the caller calls this broadcast again
    // from this rank (-1: none; BroadcastResponse.restart_from_root).
    int restart_from_root = -1;
  };
  // One trainer's call (BroadcastRequest); blocks until every local trainer
  // made it, or the job fails, or (before every trainer arrived) the
  // deadline, a MonotonicNow() time, passes. An error that concerns the
  // job fails it first. `fused_slot` (step 0 of a host broadcast of one
  // piece; -1: none): the slot the caller's root filled with the whole
  // buffer, so that step 0 may move it too (local.proto, BroadcastRequest).
  absl::StatusOr<StepResult> Step(const Trainer& caller, uint64_t bytes, int root_rank,
                                  uint64_t step, bool device, int fused_slot, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_)
      // It releases mu_ around the call it runs, which the analysis cannot follow.
      ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // The job failed: every waiting and later Step returns `error`.
  void Abort(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  // An elastic job re-formed: later calls run on `backend` (it outlives
  // this object), among `num_nodes` nodes where this one is `node_index`
  // (its Gloo rank). Called between iterations' collectives, never while
  // a call runs on the old world (that call failed with it).
  // `epoch` names the world for set_on_world_failure; `grown`: nodes joined
  // (no broadcast runs then), so every member counts broadcasts afresh,
  // as the joiners do.
  void SetWorld(Backend* backend, int num_nodes, int node_index, uint64_t epoch = 0,
                bool grown = false) ABSL_LOCKS_EXCLUDED(mu_);
  // Scheduler thread, right after a re-formation installed the survivors'
  // world and before any broadcast runs on it: settles a broadcast a death
  // interrupted, on every survivor alike (docs/DESIGN.md, "Elastic jobs").
  // *collective_failed: another death, re-form again.
  absl::Status Resume(bool* collective_failed)
      ABSL_LOCKS_EXCLUDED(mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // An elastic job took `fresh` on the local rank of a trainer that died
  // (it outlives this object). Between iterations.
  void ReplaceTrainer(Trainer* fresh) ABSL_LOCKS_EXCLUDED(mu_);

  // A join announced the catch-up broadcast (docs/DESIGN.md, "Elastic
  // jobs"): before iteration `iteration`'s first mark every trainer calls
  // gs_broadcast from `root`. `old_members` by local rank: 1 where the
  // trainer was a member before the join (holds a replica of the state).
  // Called before the trainers can learn of the join.
  void ExpectCatchUp(int root, uint64_t iteration, std::vector<uint8_t> old_members)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Before the job's device resources go (the GpuSession a device piece
  // runs on): no later Step runs anything, and this returns once the call
  // being run, if any, has returned (the job failed, so its collective
  // was aborted and returns promptly), or after `timeout` (logged).
  void StopAndWait(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Scheduler thread, before trainer `t`'s first mark of an iteration (after
  // the scheduler counts the iteration as started): false when a broadcast
  // is under way (the job has then failed, naming both).
  bool AllowMarks(const Trainer& t) ABSL_LOCKS_EXCLUDED(mu_);

  // Pieces of a broadcast of `bytes` (steps 1..Pieces).
  static uint64_t Pieces(uint64_t bytes) { return (bytes + kPieceBytes - 1) / kPieceBytes; }

 private:
  // The generation a call runs in: its backend and this node's place.
  struct World {
    Backend* backend = nullptr;
    int num_nodes = 1;
    int node_index = 0;
    uint64_t epoch = 0;
  };
  // The call every local trainer makes next.
  struct Call {
    uint64_t bytes = 0;
    int root_rank = 0;
    uint64_t step = 0;
    bool device = false;  // device buffers (BroadcastRequest.device)
    // The slot every arrival so far filled for a fused step 0; -1: not fused
    // (an arrival sent none, or another slot).
    int fused_slot = -1;
    int first = -1;                // local rank that arrived first
    std::vector<uint8_t> arrived;  // per local rank
    int count = 0;
    World world;  // set by the last arrival
  };
  // The last arrival's work, with the lock released: the cross-node part
  // of `call`. *collective: the error is a collective's failure (the job
  // then asks the leader which node caused it), not a verdict.
  absl::Status Run(const Call& call, bool* collective) ABSL_LOCKS_EXCLUDED(mu_);
  // Step 0's agreement across nodes; *fused: every node fuses too.
  absl::Status Agree(const Call& call, bool* fused, bool* collective);
  // Whether step 0 of `call` may move the buffer too (this node's view).
  bool CanFuse(const Call& call) const;
  // Piece `piece` of a host broadcast, through `slot`, across nodes.
  absl::Status RunHostPiece(const Call& call, uint64_t piece, uint8_t* slot, bool* collective);
  // A device broadcast's piece `piece` across the node's GPUs and nodes.
  absl::Status RunDevicePiece(const Call& call, uint64_t piece, bool* collective);
  // INVALID_ARGUMENT: no member holds `root_rank`.
  static absl::Status RootOnNoNode(int root_rank);
  // The NCCL rank of the root's GPU when this node holds the root, else -1.
  int LocalRootNcclRank(int root_rank) const;
  // Why `caller`'s call cannot go on (OK: it can), under mu_.
  absl::Status Refusal(const Trainer& caller, uint64_t bytes, int root_rank, uint64_t step,
                       bool device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureSegment();
  uint8_t* Slot(uint64_t piece) const;
  // The bookkeeping of a step of `call` that completed on this node.
  void StepDone(const Call& call, bool fused) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A call whose collective failed in an elastic job: asks for the
  // re-formation and waits for Resume's verdict, running the call again on
  // the new world when told to. OK: the call completed.
  absl::Status AwaitResume(Call call, absl::Status failed, bool* collective)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Resume's parts (broadcaster_resume.cc).
  struct Position;
  Position Where() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resume's verdict from the survivors' summed slots `v` (lock held; it
  // is released around the catch-up's collective).
  absl::Status SettleInterrupted(const std::vector<double>& v, const World& world,
                                 bool* collective_failed) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::Status CatchUp(const Call& call, uint64_t step, int root_place, int root_nccl_rank,
                       bool fused, bool* collective);
  // The catch-up broadcast (broadcaster_catch_up.cc). Whether the announced
  // catch-up window is open: its iteration, no local trainer marked in it.
  bool InCatchUp() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The rank a call from `root_rank` restarts from (-1: it goes on): its
  // root was a catch-up root whose node died.
  int RestartRoot(int root_rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every node alike, once the root of the broadcast numbered `serial`
  // is on no node: the new catch-up root agreed in one small allreduce
  // (-1: some node does not take it for the catch-up, so it fails as any
  // broadcast). INVALID_ARGUMENT: no old member is left alive. The lock is
  // released around the collective.
  absl::StatusOr<int> NextCatchUpRoot(const World& world, int dead_root, bool* collective)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Abandons the broadcast numbered `serial` from `dead_root`: every local
  // call from it is answered "restart from `root`".
  void ReplaceCatchUpRoot(uint64_t serial, int dead_root, int root)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The agreement found `call`'s root on no node: the catch-up root's
  // replacement (reroot_to_), or INVALID_ARGUMENT naming the root. Lock
  // not held.
  absl::Status RerootOrRefuse(const Call& call, bool* collective) ABSL_LOCKS_EXCLUDED(mu_);
  // Resume found the root of the interrupted broadcast `serial` on no
  // node: re-runs the catch-up from a new root (OK), or returns `gone`.
  // `completed`: a node completed it already.
  absl::Status RerootInterrupted(uint64_t serial, int dead_root, bool completed, const World& world,
                                 const absl::Status& gone, bool* collective_failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // After a step of `call` ran: its bookkeeping, or the root's replacement
  // that its agreement found (reroot_to_).
  void Settle(const Call& call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A step's answer to a call from `root_rank` (segment, fused, restart).
  StepResult Answer(const Trainer& caller, int root_rank, uint64_t step, bool device) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The test hook that holds a piece on this node (see broadcaster.cc);
  // kHeldAgreement: step 0's agreement.
  static constexpr uint64_t kHeldAgreement = ~0ull - 1;
  void MaybeHoldPiece(uint64_t piece);
  // Fails the job (lock released) and returns `error`.
  absl::Status FailJob(const absl::Status& error, int culprit = -1) ABSL_LOCKS_EXCLUDED(mu_);
  std::string Names(const std::vector<uint8_t>& which) const;
  int LocalTrainers() const;
  // Those not gone: an elastic job counts a dead trainer out (its local
  // rank waits for a rejoining trainer), so a call does not wait for it.
  int LiveLocalTrainers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // By local rank; an element changes (ReplaceTrainer) and is read under mu_.
  std::vector<Trainer*> trainers_;
  const Scheduler* scheduler_ = nullptr;
  GpuSession* gpu_ = nullptr;
  const FailFn fail_;
  const Options options_;

  MonotonicMutex mu_;
  MonotonicCondVar cv_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  World world_ ABSL_GUARDED_BY(mu_);
  Call call_ ABSL_GUARDED_BY(mu_);
  uint64_t calls_started_ ABSL_GUARDED_BY(mu_) = 0;  // number of the call being collected
  uint64_t calls_done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_result_ ABSL_GUARDED_BY(mu_);  // the last completed call's
  bool running_ ABSL_GUARDED_BY(mu_) = false;      // the last arrival runs the call
  // From a broadcast's first arrival at step 0 until its last step is done.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  // Per local rank: 1 + the iteration of its latest first mark (0: none).
  std::vector<uint64_t> marked_in_ ABSL_GUARDED_BY(mu_);
  // Written by the thread running step 0 (running_), read after it.
  ipc::SharedSegment segment_;
  int root_node_ = 0;
  int root_nccl_rank_ = 0;  // device broadcasts
  bool fused_ = false;      // the last step 0 moved the buffer too
  WorldFailedFn on_world_failure_;

  // Where this node is, for Resume: broadcasts whose step 0 completed since
  // the world started or grew, and the steps of the current one completed
  // (0: none, or between broadcasts).
  uint64_t began_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_done_ ABSL_GUARDED_BY(mu_) = 0;
  Call done_call_ ABSL_GUARDED_BY(mu_);  // the last step that completed
  bool done_fused_ ABSL_GUARDED_BY(mu_) = false;
  // A call whose collective failed waits for Resume's verdict.
  enum class Verdict { kNone, kCompleted, kRunAgain };
  bool awaiting_ ABSL_GUARDED_BY(mu_) = false;
  Call failed_call_ ABSL_GUARDED_BY(mu_);
  Verdict verdict_ ABSL_GUARDED_BY(mu_) = Verdict::kNone;
  // The catch-up window a join announced.
  struct CatchUpWindow {
    bool armed = false;
    uint64_t iteration = 0;            // the join iteration
    int root = -1;                     // the announced root, or its replacement
    std::vector<int> dead_roots;       // catch-up roots whose node died
    std::vector<uint8_t> old_members;  // by local rank
  };
  CatchUpWindow catch_up_ ABSL_GUARDED_BY(mu_);
  // Written by the thread running step 0 when its agreement replaced the
  // catch-up root (-1: none), read after it.
  int reroot_to_ = -1;
  // Test hook: 1 + the piece held on this node (0: none), and the file
  // whose creation releases it.
  uint64_t hold_piece_plus_one_ = 0;
  std::string hold_until_file_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_BROADCASTER_H_
