// GpuSession: the device resources of one running job on the GPU path —
// each trainer's gradient memory (a daemon-owned flat buffer, or the
// trainer's own allocations opened through IPC handles), its readiness
// events, the daemon's streams and staging buffers (one per GPU), and the
// NCCL communicators of this generation (one rank per GPU of the node).
// An elastic job that lost a node replaces the communicators with the
// survivors' (Reform) and keeps everything else.
//
// Lifetime (the NCCL invariants, see /work/shared/reviews/nccl-backend.md):
// everything is opened at job start, on the job's thread, and released by
// ReleaseTrainer (a trainer leaving a job others are still in) or the
// destructor, which must run only after the scheduler is idle for good or
// stopped — never while a collective may be running (freeing or closing IPC memory then
// can deadlock on the running kernel). Abort, from any thread, makes an
// in-flight collective or poll return promptly. The trainers' side of the
// order (client/cuda_tensors.h): each unmaps its flat buffer before its
// Detach, so by the time every trainer has left nobody maps what we free.
// Memory calls of concurrent jobs on one GPU are kept apart from their
// collectives by the device itself (gpu/gated_daemon_device.h).
#ifndef GRADSYNC_DAEMON_ENGINE_GPU_SESSION_H_
#define GRADSYNC_DAEMON_ENGINE_GPU_SESSION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "gpu/device.h"
#include "gradsync/v1/local.pb.h"
#include "ipc/arena.h"

namespace gradsync {

// What a trainer registered for its CUDA gradients (local.proto's
// CudaRegistration and each tensor's CudaBuffer), validated.
struct GpuTrainerSpec {
  gpu::DeviceId device;
  bool flat = true;
  std::vector<gpu::IpcHandle> allocations;  // user pointer: one per distinct base
  std::vector<uint32_t> allocation;         // per tensor: index into allocations
  std::vector<uint64_t> offset;             // per tensor: bytes into its allocation
  // The trainer's pooled readiness events (1..kMaxReadyEventSlots); each
  // readiness entry names the slot it recorded (local.proto).
  std::vector<gpu::IpcHandle> events;
};

// The most readiness events a trainer may send: a process opening tens of
// thousands of IPC events fails (PyTorch saw it above ~20k), so the daemon
// opens at most this many per trainer, whatever the layout's size.
inline constexpr size_t kMaxReadyEventSlots = 1024;

// INVALID_ARGUMENT naming the tensor when the request is inconsistent.
absl::StatusOr<GpuTrainerSpec> GpuTrainerSpecFromProto(const v1::RegisterRequest& req);

// The daemon's GPU runtime, injected from main: the device (real CUDA +
// NCCL, or the simulation in the test-only gradsyncd_sim) and test knobs.
struct GpuRuntime {
  std::shared_ptr<gpu::DaemonDevice> device;  // null: CUDA tensors are refused
  // TEST ONLY (settable only in gradsyncd_sim): reduce without polling the
  // trainers' readiness events, so the equivalence tests can prove they
  // catch a missing wait. Never set in a release gradsyncd.
  bool unsafe_skip_event_wait = false;
  // Whether a device error is a sticky CUDA error: the context is poisoned
  // and only a fresh process recovers (the daemon exits with
  // kDeviceLostExitCode after failing the job; the supervisor restarts it).
  // Errors marked gpu::IsDeviceLost count as such too, on every device.
  std::function<bool(const absl::Status&)> is_context_lost;
  // TEST ONLY (set only in gradsyncd_sim): called at points of a trainer's
  // departure ("departure": a trainer that is not the last, before it looks
  // for the session; "world_release": the last trainer's release, the
  // session taken, before it is closed), so a test can hold them open and
  // make an ordering race certain. Never set in a release gradsyncd.
  std::function<void(const std::string& point)> test_pause;
};

inline constexpr int kDeviceLostExitCode = 71;

// Exits the process with kDeviceLostExitCode, logging `where` and the
// error, when `device_error` left the device unusable for good (sticky
// CUDA error, or marked gpu::IsDeviceLost); returns otherwise. Every path
// that sees a device error calls it: opening a job (memory, events, NCCL
// init), the reductions (the scheduler) and teardown.
void ExitIfDeviceLost(const std::function<bool(const absl::Status&)>& is_context_lost,
                      const absl::Status& device_error, const std::string& where);

class GpuSession {
 public:
  struct TrainerInput {
    const GpuTrainerSpec* spec;
    std::string name;  // "rank 1 (local 1, pid 42)", for errors
  };
  // Where this node's communicators stand in the job.
  struct WorldInput {
    uint64_t generation = 0;
    absl::Duration timeout = absl::Minutes(5);
    int node_rank = 0;
    int num_nodes = 1;
    // This daemon as its errors name it ("node 1": its --node-rank, which
    // `node_rank` above, a place among the members, need not be).
    std::string node_name;
    // Several nodes: the generation-scoped exchange through the rendezvous
    // store (JobWorld's); each node's GPU count and the unique id travel
    // there. One node: unused, nothing leaves the process.
    std::function<absl::Status(const std::string& name, const std::string& value)> publish;
    std::function<absl::StatusOr<std::string>(const std::string& name, absl::Time deadline)> fetch;
    // GpuRuntime::is_context_lost (null: only gpu::IsDeviceLost counts).
    std::function<bool(const absl::Status&)> is_context_lost;
    // The job's cancellation of this opening (it failed, or its generation
    // ended): polled from Open's thread while it waits for other nodes'
    // GPU counts and through the communicators' creation (the unique id
    // exchange, NCCL init and warm-up), so Open returns CANCELLED promptly
    // instead of waiting out `timeout`. Unset: never cancelled.
    std::function<bool()> cancelled;
  };
  // `flat_plan`: where tensors lie in a flat buffer (the arena planner's
  // offsets over the tensors' real sizes).
  static absl::StatusOr<std::unique_ptr<GpuSession>> Open(gpu::DaemonDevice* device,
                                                          const Layout& layout,
                                                          const ipc::ArenaLayout& flat_plan,
                                                          const std::vector<TrainerInput>& trainers,
                                                          const WorldInput& world);
  ~GpuSession();
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;

  gpu::DaemonDevice& device() { return *device_; }
  bool flat() const { return flat_; }
  size_t num_trainers() const { return trainers_.size(); }
  const std::string& trainer_name(size_t t) const { return trainers_[t].name; }
  // Index into devices() of trainer t's GPU.
  int device_index(size_t t) const { return trainers_[t].device_index; }
  const std::vector<gpu::DeviceId>& devices() const { return devices_; }
  gpu::Stream* stream(int device_index) const { return streams_[device_index]; }

  // Trainer t's tensor i on the device (flat mode: inside its flat buffer).
  void* tensor(size_t t, uint32_t i) const { return trainers_[t].tensors[i]; }
  uint8_t* flat_base(size_t t) const { return trainers_[t].flat_base; }
  // The event to poll for trainer t's tensor i this iteration: the slot its
  // readiness entry named (NoteReady).
  gpu::Event* event(size_t t, uint32_t i) const {
    const PerTrainer& p = trainers_[t];
    return p.events[p.slot_of_tensor[i]];
  }
  // Trainer t's pooled events (what ipc::ReadyExpectation::event_slots is).
  uint32_t event_slots(size_t t) const { return static_cast<uint32_t>(trainers_[t].events.size()); }
  // Scheduler thread, as each readiness entry is consumed: tensor i's mark
  // recorded `slot` (already checked < event_slots(t)).
  void NoteReady(size_t t, uint32_t i, uint16_t slot) { trainers_[t].slot_of_tensor[i] = slot; }
  // How many interprocess events Open opened, over all trainers.
  size_t events_opened() const;
  // Flat mode: the handle trainer t maps, and the buffer's size.
  const gpu::IpcHandle& flat_handle(size_t t) const { return trainers_[t].flat_handle; }
  uint64_t flat_bytes() const { return flat_bytes_; }

  // A daemon-owned buffer of at least `bytes` on GPU `device_index`, for
  // buckets that are not one contiguous range. Grown only at plan changes,
  // from the scheduler thread between iterations (no collective running).
  absl::Status EnsureStaging(uint64_t bytes);
  uint8_t* staging(int device_index) const { return staging_[device_index]; }
  // Elastic jobs: a daemon-owned buffer of at least `bytes` on every GPU
  // where each bucket's local sum is kept until its iteration completes
  // (GpuReducer), so that an iteration a node's death interrupted is
  // redone without summing written-back averages. Grown like the staging.
  absl::Status EnsureKeptSums(uint64_t bytes);
  uint8_t* kept_sums(int device_index) const { return kept_sums_[device_index]; }
  // Elastic jobs across nodes: a daemon-owned buffer of `bytes` (the flat
  // gradient's size) on every GPU holding the last completed iteration's
  // result at the flat plan's offsets (GpuReducer::KeepResults), which a
  // survivor still in that iteration after a node's death receives
  // (scheduler_split_commit.cc). Allocated once, before the first bucket.
  absl::Status EnsureKeptResult(uint64_t bytes);
  uint8_t* kept_result(int device_index) const { return kept_result_[device_index]; }
  // Elastic jobs across nodes with several trainers on the node: a
  // daemon-owned buffer of at least `bytes` per trainer, on its GPU, where
  // the local sum copies that trainer's input of each bucket, so that after
  // a trainer's death mid-iteration the survivors' gradients, which the
  // write-back overwrote, are restored and the iteration redone (GpuReducer).
  // Grown like the staging.
  absl::Status EnsureInputCopies(uint64_t bytes);
  uint8_t* input_copy(size_t t) const { return input_copies_[t]; }
  // Frees them (the job shrank to this node); EnsureInputCopies again
  // allocates them anew. No queued work may still write them.
  void FreeInputCopies();

  // The non-finite check's memory (the GPU reducer's; docs/DESIGN.md
  // "Non-finite gradients"): a flag per GPU in device memory that SumAsync
  // sets, and host memory the device copies into without the host waiting
  // (flags read back, the result's first element, a NaN to write, and a
  // window the rare culprit search reads trainers' gradients through).
  uint32_t* nonfinite_flag(int device_index) const { return nonfinite_flags_[device_index]; }
  struct HostWindow {
    uint32_t* flags = nullptr;  // one per GPU
    uint8_t* probe = nullptr;   // 8 bytes: a result's first element
    uint8_t* nan = nullptr;     // 8 bytes: a NaN of the bucket's dtype
    uint8_t* search = nullptr;  // kSearchBytes
  };
  static constexpr size_t kSearchBytes = size_t{1} << 20;
  const HostWindow& host_window() const { return host_window_; }

  // Trainer t left while others of the job remain: its events, its mapped
  // allocations (user-pointer mode) and its flat buffer go now, not when
  // the last trainer leaves, since a trainer may free its memory or destroy
  // its events once gs_close returns. Call only after the scheduler is idle
  // for good (Scheduler::WaitIdle: halted, no reduction in flight, so
  // nothing queries those events or touches that memory again). Idempotent.
  void ReleaseTrainer(size_t t);

  // A restarted trainer takes back local rank t of an elastic job, whose
  // dead predecessor was counted out of every reduction (GpuReducer::
  // DeactivateTrainer) and whose handles were kept open. Call only from the
  // scheduler thread at an iteration boundary (no reduction in flight, the
  // catch-up broadcast not started): the predecessor's events and mapped
  // allocations are closed and the fresh trainer's opened on the same GPU;
  // a flat buffer stays (the daemon owns it; the dead process's mapping
  // went with it), so the fresh trainer maps the same handle. On an error
  // the slot holds nothing of either and must stay deactivated.
  absl::Status ReplaceTrainer(size_t t, const GpuTrainerSpec& spec, const std::string& name,
                              const Layout& layout);
  // What a restarted trainer must register to take back local rank t
  // (checked at its Register, before it waits for a boundary): the same
  // GPU and mode as its predecessor, one buffer per tensor. INVALID_ARGUMENT
  // naming `name` otherwise. Reads only what never changes after Open.
  absl::Status CheckReplacement(size_t t, const GpuTrainerSpec& spec, const std::string& name,
                                size_t tensors) const;

  // gs_broadcast of device buffers (daemon/engine/broadcaster.h): two
  // slots of `slot_bytes` on every GPU of the node, allocated at the first
  // device broadcast and exported for the trainers on that GPU to map;
  // freed with the session (the trainers unmap them before they detach).
  // Called between iterations by the broadcast's last arrival.
  absl::Status EnsureBroadcastSlots(uint64_t slot_bytes);
  uint8_t* broadcast_slots(int device_index) const { return broadcast_slots_[device_index]; }
  const gpu::IpcHandle& broadcast_handle(int device_index) const {
    return broadcast_handles_[device_index];
  }
  // A device error of a broadcast piece: one that left the device
  // unusable ends the process here, as on every other path.
  void ExitIfLost(const absl::Status& device_error, const std::string& where) const {
    ExitIfDeviceLost(is_context_lost_, device_error, where);
  }
  // The job's NCCL ranks (one per GPU of every node) and devices()[d]'s.
  int nccl_ranks() const { return nranks_.load(std::memory_order_acquire); }
  int nccl_rank(int device_index) const {
    return first_rank_.load(std::memory_order_acquire) + device_index;
  }

  // The current generation's communicators. The reference stays valid
  // across Reform: a call made through it runs on the generation current
  // when it started (which lives until the call returns).
  gpu::CollectiveGroup& collectives();
  // Any thread: an in-flight collective fails promptly; polls stop. For
  // good: the job failed.
  void Abort(const std::string& reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  // Any thread: only the current generation's communicators fail (a node
  // died: an elastic job re-forms and goes on with new ones).
  void AbortCollectives(const std::string& reason);
  // Elastic jobs, on the scheduler thread with no reduction in flight: the
  // survivors of a node's death formed generation `world.generation`.
  // Aborts this generation's communicators, waits (bounded by
  // world.timeout) until no call uses them and destroys them, then creates
  // the survivors' (a fresh unique id under the new generation's keys).
  // CANCELLED once Abort was called meanwhile (the job failed).
  absl::Status Reform(const WorldInput& world);

 private:
  class CurrentGroup;
  struct PerTrainer {
    std::string name;
    gpu::DeviceId device;
    int device_index = 0;
    uint8_t* flat_base = nullptr;  // flat mode: daemon-owned
    gpu::IpcHandle flat_handle;
    std::vector<void*> opened;             // user pointer: mapped allocation bases
    std::vector<void*> tensors;            // per tensor
    std::vector<gpu::Event*> events;       // the pool, per slot
    std::vector<uint16_t> slot_of_tensor;  // per tensor: its last mark's slot
  };
  explicit GpuSession(gpu::DaemonDevice* device);
  // Open's steps, in the order it takes them; each returns the first error.
  absl::Status OpenTrainer(const TrainerInput& in, const std::string& first_name,
                           const Layout& layout, const ipc::ArenaLayout& flat_plan);
  absl::Status AllocFlatBuffer(PerTrainer& p, const Layout& layout,
                               const ipc::ArenaLayout& flat_plan);
  absl::Status OpenAllocations(PerTrainer& p, const GpuTrainerSpec& spec);
  absl::Status PlaceUserTensors(PerTrainer& p, const GpuTrainerSpec& spec, const Layout& layout);
  absl::Status OpenEvents(PerTrainer& p, const GpuTrainerSpec& spec);
  // ReplaceTrainer's opening of the fresh trainer's memory and events.
  absl::Status OpenReplacement(PerTrainer& p, const GpuTrainerSpec& spec, const Layout& layout);
  absl::Status CreateStreams();
  absl::Status AllocNonFiniteMemory();
  absl::StatusOr<gpu::CollectiveOptions> CollectiveOptionsFor(const WorldInput& world) const;
  absl::Status CreateCollectives(const gpu::CollectiveOptions& o, uint64_t generation);
  // (Re)allocates `buffers` (one per device) to `bytes` unless `*have` is
  // enough already; `what` names them in errors.
  absl::Status EnsurePerDevice(std::vector<uint8_t*>& buffers, uint64_t* have, uint64_t bytes,
                               const char* what);
  // A device error while setting up, naming what was being done; one that
  // left the device unusable ends the process here (nothing later works).
  absl::Status SetupError(const absl::Status& st, const std::string& what) const;
  void Release(PerTrainer& p);

  gpu::DaemonDevice* device_;
  std::function<bool(const absl::Status&)> is_context_lost_;
  bool flat_ = true;
  uint64_t flat_bytes_ = 0;
  std::vector<PerTrainer> trainers_;
  std::vector<gpu::DeviceId> devices_;  // distinct GPUs, by first local rank
  std::vector<gpu::Stream*> streams_;   // per device
  std::vector<uint8_t*> staging_;       // per device
  uint64_t staging_bytes_ = 0;
  std::vector<uint8_t*> kept_sums_;  // per device, elastic jobs only
  uint64_t kept_sums_bytes_ = 0;
  std::vector<uint8_t*> kept_result_;  // per device, elastic jobs across nodes only
  uint64_t kept_result_bytes_ = 0;
  std::vector<uint8_t*> input_copies_;  // per trainer, on its GPU (EnsureInputCopies)
  uint64_t input_copies_bytes_ = 0;
  std::vector<uint8_t*> broadcast_slots_;  // per device, once a device broadcast ran
  std::vector<gpu::IpcHandle> broadcast_handles_;
  // Written by Open and Reform; read by gs_broadcast's RPC threads too.
  std::atomic<int> first_rank_{0};
  std::atomic<int> nranks_{1};
  uint64_t generation_ = 0;
  std::vector<uint32_t*> nonfinite_flags_;  // per device
  void* host_memory_ = nullptr;             // host_window_'s, from AllocHost on devices_[0]
  HostWindow host_window_;
  std::unique_ptr<CurrentGroup> collectives_;
  std::atomic<bool> aborted_{false};
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_GPU_SESSION_H_
