// gradsync::Client — the C++ client of gradsyncd (the C ABI in gradsync.h
// wraps it). One Client per trainer process.
//
// Control calls (connect, register, close) are gRPC over the daemon's unix
// socket; the per-iteration calls (MarkReady, MarkUnused, Wait) only touch
// shared memory: a readiness-ring entry plus a futex doorbell, and a
// completion ring to wait on. Errors are absl::Status values carrying the
// gradsync code (common/status_code.h); a job failure is sticky.
//
// Threads: a Client is used by one thread at a time (the trainer's). Its
// own thread reads the Watch stream and shares with it only what
// watch_mu_ guards, plus the atomics `closing_` and `completion_bell_`.
#ifndef GRADSYNC_CLIENT_CLIENT_H_
#define GRADSYNC_CLIENT_CLIENT_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/monotonic_mutex.h"
#include "gpu/device.h"
#include "gradsync/v1/local.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "ipc/node_segment.h"
#include "ipc/shared_segment.h"
#include "ipc/trainer_segment.h"

namespace gradsync {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;
  int device = -1;  // -1: CPU; >= 0: CUDA ordinal
  // CUDA only: the tensor's memory (user-pointer mode), or null for every
  // tensor (the daemon owns a flat gradient buffer; see cuda_tensors.h).
  void* cuda_ptr = nullptr;
};

class CudaTensors;

// What a trainer sees of its job after each synchronized iteration
// (gs_get_job_info). Before the first one: iteration 0, the job's world
// size and the trainer's rank from registration.
struct JobInfo {
  uint64_t iteration = 0;  // synchronized iterations completed job-wide
  int world_size = 0;      // what the last iteration's sum was divided by
  int rank = -1;           // this trainer's global rank in it
  // gradsyncd --check-replicas-every: this trainer should send its
  // parameter fingerprint (CheckReplicas) after its optimizer step.
  bool check_replicas_due = false;
  // How many times an elastic job's members changed (the survivors of a
  // node's death re-formed) in the iterations this trainer completed.
  uint64_t membership_changes = 0;
  // How many times nodes joined the running elastic job right after an
  // iteration this trainer completed: it then hands its state to theirs.
  uint64_t nodes_joined = 0;
  // This trainer's node joined the job while it ran (or it took back a
  // dead trainer's local rank on a node that stayed): `iteration` started
  // at the job's, and it fetches the job's state before its first one.
  bool joined_running_job = false;
  // How many times trainers restarted on nodes that stayed joined the
  // running elastic job right after an iteration this trainer completed:
  // it then hands its state to them, as for nodes_joined.
  uint64_t trainers_joined = 0;
  // Where the state comes from (gs_broadcast's root) after the last
  // nodes_joined or trainers_joined change, or for a joiner: the lowest
  // rank alive and a member before the joiners came.
  int catch_up_root = 0;
};

struct ConnectOptions {
  std::string socket_path;  // empty: $GRADSYNC_SOCKET, else ClientDefaultSocketPath()
  int local_rank = -1;      // -1: $LOCAL_RANK, else 0
  int64_t timeout_ms = 30000;
  // The device CUDA tensors go through; null: NewDefaultTrainerDevice() at
  // the first CUDA registration. Tests pass the simulation here (the C ABI
  // has no way to).
  std::shared_ptr<gpu::TrainerDevice> device;
};

class Client {
 public:
  // Refuses (UNAVAILABLE) a daemon run by a user this process does not
  // trust: see daemon_connection.h.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends the layout; returns once every local trainer registered the same
  // one (MISMATCH names the first difference) and the world is formed.
  absl::Status Register(const std::vector<TensorSpec>& specs);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  size_t num_tensors() const { return layout_.size(); }
  // Tensor i's gradient buffer: in shared memory (CPU), or a device pointer
  // (CUDA: into the daemon's flat buffer, or the caller's own cuda_ptr);
  // nullptr for a bad i.
  void* GradBuffer(size_t index) const;
  // CUDA tensors: the stream readiness events are recorded on (and unused
  // gradients zeroed on); null: the legacy default stream.
  absl::Status SetCudaStream(void* stream);

  absl::Status MarkReady(size_t index);
  // Zeroes the buffer: the tensor contributes zeros this iteration.
  absl::Status MarkUnused(size_t index);
  // timeout_ms < 0: the daemon's timeout (plus a little grace).
  absl::Status Wait(int64_t timeout_ms);
  // The last iteration Wait completed is not to be applied: its gradients
  // hold a NaN or Inf and the daemon runs --nonfinite=skip (every trainer
  // of the job is told alike).
  bool step_skipped() const { return step_skipped_; }
  absl::Status SetSync(bool enabled);
  // Uneven inputs (DDP's Join): this trainer is out of data. From its next
  // iteration on the job counts it as contributing zeros; blocks until every
  // trainer of the job has joined (OK) or the job fails. Between iterations
  // only; afterwards every per-iteration call is INVALID_ARGUMENT. The
  // divisor of later iterations: the initial world size, or (false) the
  // trainers still active; every trainer must pass the same.
  absl::Status Join(bool divide_by_initial_world_size);
  // Makes `bytes` bytes at `buffer` equal, on every trainer of the job, to
  // the trainer of global rank `root_rank`'s. Host memory, or (a job with
  // CUDA gradients) device memory on this trainer's GPU, told apart by the
  // pointer; every trainer passes the same kind. Between
  // iterations only (STATE otherwise), every trainer with the same bytes
  // and root (else the job fails, MISMATCH naming them). timeout_ms <= 0:
  // the daemon's timeout, for the other trainers to arrive. Defined in
  // client_broadcast.cc.
  absl::Status Broadcast(void* buffer, size_t bytes, int root_rank, int64_t timeout_ms);
  // Detaches (idempotent). Buffers become invalid.
  absl::Status Close();

  uint64_t iteration() const { return iteration_; }
  // After Register; refreshed by every Wait that returns OK.
  JobInfo job_info() const {
    return {iteration_,          job_world_size_,     job_rank_,
            CheckReplicasDue(),  membership_changes_, nodes_joined_,
            joined_running_job_, trainers_joined_,    catch_up_root_};
  }
  // gradsyncd --check-replicas-every: this trainer's parameter fingerprint
  // (one hash per registered tensor, in registration order) after the
  // iteration whose job_info() says a check is due; returns once every
  // local trainer's were compared. MISMATCH (the job failed) names the
  // first differing tensor and the trainers on each side. Defined in
  // client_check_replicas.cc.
  absl::Status CheckReplicas(const std::vector<uint64_t>& hashes);

 private:
  Client() = default;
  // Validation shared by MarkReady and MarkUnused (before any side effect).
  absl::Status CheckMarkable(size_t index) const;
  // Records the mark and, in a synced iteration, posts it (validated first).
  absl::Status Post(size_t index, ipc::ReadyKind kind);
  absl::Status CheckUsable() const;
  absl::Status CheckNotJoined(const char* call) const;
  absl::Status PushReady(const ipc::ReadyEvent& e);
  // Waits for the next completion: kIterationDone, or kAllJoined once
  // `joined`. budget < 0: no deadline.
  absl::Status AwaitCompletion(int64_t budget, bool joined);
  absl::Status Failed(absl::Status error);  // records a sticky failure
  // From the Watch stream, if any.
  absl::Status ConnectionError() const ABSL_LOCKS_EXCLUDED(watch_mu_);
  std::string UnmarkedTensors() const;
  void WatchLoop() ABSL_LOCKS_EXCLUDED(watch_mu_);
  // gs_broadcast's parts (client_broadcast.cc).
  struct BroadcastCall {
    uint64_t bytes = 0;
    int root_rank = 0;
    int64_t wait_ms = 0;
    bool device = false;  // the buffer is device memory on this trainer's GPU
    int fused_slot = -1;  // the host slot step 0 may move the buffer through (FusedSlot)
  };
  absl::StatusOr<bool> BroadcastOnDevice(const void* buffer, size_t bytes) const;
  // One run of the broadcast from call.root_rank; *restart_from: the rank
  // to run it again from (the catch-up root's node died), else -1.
  absl::Status BroadcastFrom(BroadcastCall call, uint8_t* data, int* restart_from);
  // The host slot a broadcast of one piece may fill before its step 0, so
  // that the broadcast is one call (local.proto, BroadcastRequest), or -1.
  int FusedSlot(const BroadcastCall& call) const;
  absl::Status FinishFused(const BroadcastCall& call, const v1::BroadcastResponse& begin,
                           uint8_t* data, bool root);
  absl::Status BroadcastStep(const BroadcastCall& call, uint64_t k, v1::BroadcastResponse* resp);
  absl::StatusOr<uint8_t*> MapHostSlots(const v1::BroadcastResponse& begin);
  absl::StatusOr<uint8_t*> MapDeviceSlots(const v1::BroadcastResponse& begin);
  absl::Status CopyPiece(const BroadcastCall& call, uint8_t* to, const uint8_t* from, uint64_t len);

  std::string socket_path_;
  // Who the daemon is (SO_PEERCRED at connect): every segment must be its.
  uid_t daemon_uid_ = 0;
  std::string daemon_peer_;  // "uid N (name) pid P", for messages
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Local::Stub> stub_;
  uint64_t session_ = 0;
  int local_rank_ = 0;
  int64_t daemon_pid_ = 0;
  int64_t daemon_timeout_ms_ = 300000;
  std::chrono::nanoseconds spin_{0};  // gs_wait's spin before sleeping

  bool registered_ = false;
  Layout layout_;
  std::vector<uint8_t*> buffers_;
  std::shared_ptr<gpu::TrainerDevice> device_;  // from ConnectOptions, or the default
  void* cuda_stream_ = nullptr;
  std::unique_ptr<CudaTensors> cuda_;  // set iff the layout is CUDA
  ipc::NodeSegment node_;
  ipc::TrainerSegment segment_;
  int rank_ = -1;
  int world_size_ = 0;
  // From the last kIterationDone entry (registration's values before one).
  int job_world_size_ = 0;
  int job_rank_ = -1;
  // From registration: gradsyncd's --check-replicas-every (0: off), and the
  // last iteration this trainer checked after.
  int64_t check_replicas_every_ = 0;
  uint64_t checked_iteration_ = 0;
  bool CheckReplicasDue() const {
    return check_replicas_every_ > 0 && iteration_ > 0 &&
           iteration_ % static_cast<uint64_t>(check_replicas_every_) == 0 &&
           checked_iteration_ != iteration_;
  }

  bool sync_ = true;
  bool joined_ = false;  // gs_join was called
  // Iterations accumulated under no_sync since the last synced one: posted
  // with every mark so the daemon can refuse trainers out of step.
  uint32_t no_sync_iterations_ = 0;
  // GRADSYNC_DEBUG=detail, read once at connect: checksum CPU gradients at
  // mark time so the daemon can name one written after its mark.
  bool checksum_marks_ = false;
  uint64_t iteration_ = 0;           // synced iterations completed
  bool step_skipped_ = false;        // see step_skipped()
  uint64_t membership_changes_ = 0;  // see JobInfo
  uint64_t nodes_joined_ = 0;        // see JobInfo
  bool joined_running_job_ = false;  // see JobInfo
  uint64_t trainers_joined_ = 0;     // see JobInfo
  int catch_up_root_ = 0;            // see JobInfo
  uint64_t ready_sequence_ = 0;
  uint64_t completion_sequence_ = 0;
  std::vector<uint8_t> marked_;  // this iteration
  // Per tensor: gradient added since the last synced iteration completed
  // (marked ready, possibly in no_sync iterations).
  std::vector<uint8_t> accumulated_;
  size_t marked_count_ = 0;
  absl::Status failure_;  // sticky

  // gs_broadcast's staging segment (the daemon's, one per job), mapped at
  // the first broadcast.
  ipc::SharedSegment broadcast_segment_;
  uint64_t broadcast_piece_bytes_ = 0;
  // The host slot no trainer can still be reading: the one the last host
  // broadcast did not end in (-1 before the first that moved a byte).
  int broadcast_free_slot_ = -1;

  // The Watch stream (a thread): daemon-pushed errors and daemon death.
  std::unique_ptr<grpc::ClientContext> watch_ctx_;
  std::thread watch_thread_;
  mutable MonotonicMutex watch_mu_;
  absl::Status watch_error_ ABSL_GUARDED_BY(watch_mu_);
  bool watch_established_ ABSL_GUARDED_BY(watch_mu_) = false;  // the first event arrived
  bool watch_ended_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::atomic<bool> closing_{false};
  std::atomic<ipc::Doorbell*> completion_bell_{nullptr};  // set once registered
  bool closed_ = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_CLIENT_H_
