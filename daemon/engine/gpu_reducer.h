// GpuReducer: reduces one bucket of CUDA gradients — the GPU path's
// counterpart of LocalReducer, called by the scheduler at the same point.
//
// Per bucket, on the scheduler thread:
//   1. poll every local trainer's readiness event of every tensor of the
//      bucket (DaemonDevice::QueryEvent) until complete, within the
//      deadline. Never make a stream wait on a trainer's event: a wait
//      whose completion is not already known can hang the daemon's stream
//      behind a dead trainer.
//   2. per GPU: dst = (1/world_size) * sum of the trainers on that GPU
//      (SumAsync, fp32 accumulation: pre-scaling, so the collective is a
//      plain sum), into the first trainer's buffer when the bucket is one
//      contiguous range of it, else into the GPU's staging buffer;
//   3. wait for the streams (QueryStream polling), then one group
//      AllreduceSum over the node's GPUs;
//   4. CopyAsync the result to every other trainer's memory on each GPU
//      (and out of staging), and wait for the streams again.
// The non-finite check (Reduce given a report) rides on the same waits:
// the sums set each GPU's flag, copied to the host behind them (2.), and the
// result's first element is copied back behind the write-back (4.). On a hit
// (rare) the reducer searches the trainers' gradients for the culprit and
// writes a NaN into the collective's input, so that every node's result
// says so (docs/DESIGN.md "Non-finite gradients").
// Only then does the scheduler count the bucket done: a trainer's gs_wait
// returns after the results are in its memory.
//
// Elastic jobs (keep_sums): the write-back overwrites the trainers'
// gradients with the average, so an iteration a node's death interrupted
// cannot be summed from them again. Each bucket is then summed into the
// staging buffer (never in place into a trainer's memory) and copied, behind
// the sum, into the GPU's kept-sums buffer, where it stays until the
// iteration completes (DropKeptSums). A bucket reduced again in the same
// iteration (the survivors' redo, after SetWorldSize) starts from its kept
// sum, rescaled from the old world size's pre-scaling to the new one's.
// Across nodes the reducer also keeps the last completed iteration's
// result (KeepResults): each bucket's result is copied, behind its
// write-back on the same stream, into the GPU's kept result, which a
// survivor that completed an iteration a node's death split broadcasts to
// the others (scheduler_split_commit.cc).
// With several trainers on the node (KeepInputs), the local sum also
// copies each trainer's input of the bucket into that trainer's input copy
// (device to device, ahead of the sum on the same stream): a trainer that
// dies mid-iteration leaves the node in, and RestoreInputs writes the
// survivors' inputs of the buckets summed so far back over the averages the
// write-back left there, so that the iteration is redone without it.
// A trainer that died is left out of every later reduction
// (DeactivateTrainer); its node stays in the job. A restarted trainer takes
// its slot back at an iteration boundary (ReplaceTrainer).
#ifndef GRADSYNC_DAEMON_ENGINE_GPU_REDUCER_H_
#define GRADSYNC_DAEMON_ENGINE_GPU_REDUCER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "daemon/engine/bucket_planner.h"
#include "daemon/engine/gpu_session.h"
#include "daemon/engine/local_reducer.h"

namespace gradsync {

// What the non-finite check found in one bucket (LocalReducer's
// NonFiniteReport, in the GPU path's terms).
struct GpuNonFiniteReport {
  // The collective's result holds a NaN or an Inf: identical on every node.
  bool result_non_finite = false;
  // A local trainer's gradient holds one: the first such element (lowest
  // offset in the bucket's order), lowest trainer first. False with
  // result_non_finite: another node's, or a local sum overflowed.
  bool local = false;
  size_t trainer = 0;  // index into the session
  uint32_t tensor = 0;
  uint64_t element = 0;
  double value = 0;
};

class GpuReducer {
 public:
  // Who a failed Reduce blames: a trainer (index into the session, which
  // is in local-rank order), nobody, or the collective.
  static constexpr int kNoCulprit = -1;
  static constexpr int kCollective = -2;

  GpuReducer(GpuSession* session, const Layout& layout, int world_size, bool skip_event_wait,
             bool keep_sums = false);

  // At plan installs (between iterations, no collective running): the
  // staging the plan's non-contiguous buckets need.
  absl::Status Prepare(const BucketPlan& plan,
                       const std::vector<std::vector<ReduceSpan>>& flat_spans);

  // `flat_spans`: the bucket's ranges in a flat buffer (flat mode). Errors
  // name the trainer and tensor; *culprit says whom to blame. `deadline`
  // is a MonotonicNow() time (common/monotonic.h).
  // `nonfinite` non-null: check for NaN/Inf (--nonfinite=error|skip); where
  // a result is not finite the trainers' memory is left unspecified.
  // `kept_result` non-null (after KeepResults): the result is also kept
  // in device memory; `written` is set before the first byte lands there.
  absl::Status Reduce(const PlannedBucket& bucket, const std::vector<ReduceSpan>& flat_spans,
                      absl::Time deadline, ReduceTimings* timings, int* culprit,
                      GpuNonFiniteReport* nonfinite, KeptResultSink* kept_result = nullptr);

  // Elastic jobs across nodes, before the first bucket: the GPU session's
  // kept result, `flat_bytes` per GPU, where Reduce copies each bucket's
  // result (device to device, on the stream that writes it back, so no
  // host wait of its own) at the flat plan's offsets: `tensor_offsets`
  // (user-pointer mode; flat mode uses the buffer's own). The layout does
  // not depend on the plan, and every node's is the same.
  absl::Status KeepResults(std::vector<uint64_t> tensor_offsets, uint64_t flat_bytes);
  // The split-iteration commit (scheduler_split_commit.cc), between
  // reductions. Every GPU's kept result receives NCCL rank `root`'s
  // (ncclBroadcast over this generation's communicators, in place).
  absl::Status BroadcastKeptResult(int root);
  // Queues the kept result's copy over `bucket` in every active trainer's
  // gradients (the write-back's write: flat buffer or own allocations).
  absl::Status WriteKeptResult(const PlannedBucket& bucket,
                               const std::vector<ReduceSpan>& flat_spans);
  // Queues all-ones bytes (a NaN in every dtype) over `bucket` in every
  // active trainer's gradients: the test hook's stand-in for a final chunk
  // that never arrived.
  absl::Status OverwriteWithOnes(const PlannedBucket& bucket,
                                 const std::vector<ReduceSpan>& flat_spans);
  // The NCCL rank of this node's first GPU in the current generation.
  int first_nccl_rank() const { return session_->nccl_rank(0); }
  // Waits until the writes queued above are done on every GPU.
  absl::Status WaitWrites(absl::Time deadline) {
    return WaitStreams(deadline, "writing gradients");
  }

  void Abort(const std::string& reason) { session_->Abort(reason); }
  // Elastic jobs: only this generation's collective fails (the session
  // lives on for the survivors' re-formation).
  void AbortCollectives(const std::string& reason) { session_->AbortCollectives(reason); }
  // Elastic jobs, between reductions: the survivors' world size, for the
  // pre-scaling of every reduction from now on (the redo included).
  void SetWorldSize(int world_size) { world_size_ = world_size; }
  // Elastic jobs, between reductions: trainer t (a session index) died
  // and is counted out of every reduction from now on (its events are not
  // polled, its memory neither summed nor written back). A GPU left without
  // an active trainer adds zeros to the collective.
  void DeactivateTrainer(size_t t);
  // Elastic jobs, on the scheduler thread at an iteration boundary (no
  // reduction in flight): a restarted trainer takes back deactivated slot t
  // (GpuSession::ReplaceTrainer) and is summed and written back from the
  // next reduction on. On an error the slot stays deactivated.
  absl::Status ReplaceTrainer(size_t t, const GpuTrainerSpec& spec, const std::string& name);
  // Elastic jobs across nodes with at least two trainers on the node:
  // keep every trainer's input of each bucket while two or more are active
  // (before the first plan install Prepare allocates the copies; after it,
  // this call). Between reductions, when the world changes: `keep` false
  // stops the copies and frees them once the streams ran what the last
  // reduction queued (until `deadline`); an error leaves them stopped.
  absl::Status SetKeepInputs(bool keep, absl::Time deadline);
  // Whether a mid-iteration death can be redone here now: inputs are kept
  // and another trainer than the dying one (still active) is.
  bool KeepsInputs() const { return keep_inputs_ && ActiveTrainers() >= 2; }
  // Elastic jobs, between reductions, after the dead trainer was
  // deactivated: writes every active trainer's kept input of each bucket
  // summed this iteration back over its gradients (the flat buffer or its
  // own allocations: whatever the write-back wrote) and drops those
  // buckets' kept sums, so that the redo sums them again without the dead
  // trainer. Returns how many buckets it restored.
  absl::StatusOr<size_t> RestoreInputs(const BucketPlan& plan,
                                       const std::vector<std::vector<ReduceSpan>>& flat_spans,
                                       absl::Time deadline);
  // The iteration completed: no bucket is redone from its kept sum any more.
  void DropKeptSums() { std::fill(kept_world_.begin(), kept_world_.end(), 0); }
  // Buckets a redo would take from their kept sums now.
  size_t kept_buckets() const {
    return static_cast<size_t>(
        std::count_if(kept_world_.begin(), kept_world_.end(), [](int w) { return w > 0; }));
  }
  // The scheduler's side of the readiness entries (GpuSession::NoteReady):
  // trainer t's pool size, and the slot its mark of tensor i recorded.
  uint32_t event_slots(size_t t) const { return session_->event_slots(t); }
  void NoteReady(size_t t, uint32_t i, uint16_t slot) { session_->NoteReady(t, i, slot); }
  // Called at most once per Reduce when its events stay pending for
  // `threshold_s`: the scheduler's loop cannot report that stall itself
  // while it polls here. (bucket, waited seconds, what is pending.)
  using StallReporter = std::function<void(uint32_t, double, const std::string&)>;
  void SetStallReporter(double threshold_s, StallReporter reporter) {
    stall_threshold_s_ = threshold_s;
    stall_ = std::move(reporter);
  }
  // The device's own error behind the last failed Reduce (OK if it was not
  // a device call), payloads intact: is it a sticky CUDA error?
  const absl::Status& last_device_error() const { return device_error_; }

 private:
  // A piece of the bucket: `bytes` at pointer(trainer) in every trainer.
  struct Piece {
    uint64_t flat_offset = 0;  // flat mode
    uint32_t tensor = 0;       // user-pointer mode
    uint64_t bytes = 0;
    uint64_t staging_offset = 0;
  };
  void Pieces(const PlannedBucket& bucket, const std::vector<ReduceSpan>& flat_spans,
              std::vector<Piece>* out) const;
  void* At(size_t trainer, const Piece& p) const;
  absl::Status WaitEvents(const PlannedBucket& bucket, absl::Time deadline, int* culprit);
  absl::Status WaitStreams(absl::Time deadline, const char* what);
  // Queues every GPU's local sum (and, with `token`, its flag's copy back):
  // from the trainers' memory (kept: copied into the kept sums behind it),
  // or from the bucket's kept sum when it was summed before.
  absl::Status LaunchSums(const PlannedBucket& bucket, bool in_place, uint32_t token);
  size_t ActiveTrainers() const {
    return static_cast<size_t>(std::count(active_.begin(), active_.end(), true));
  }
  // Queues the copies of every active trainer's input of the bucket on GPU
  // d into its input copy.
  absl::Status CopyInputs(const PlannedBucket& bucket, size_t d);
  // Queues the copies of every active trainer's kept input of `bucket`
  // back over its gradients.
  absl::Status RestoreBucket(const PlannedBucket& bucket,
                             const std::vector<ReduceSpan>& flat_spans);
  // One GPU's sum from the trainers on it into `dst`.
  absl::Status SumTrainers(const PlannedBucket& bucket, size_t d, uint8_t* dst, bool in_place,
                           const gpu::NonFiniteCheck& check);
  // After the sums are done: a flag that holds `token` is a hit; then the
  // culprit search and the NaN written into that GPU's collective input.
  absl::Status CheckSums(const PlannedBucket& bucket, uint32_t token, absl::Time deadline,
                         GpuNonFiniteReport* report);
  absl::Status FindCulprit(const PlannedBucket& bucket, const std::vector<bool>& hit,
                           absl::Time deadline, GpuNonFiniteReport* report);
  // The tensor and element at byte `at` of piece p.
  void Locate(const PlannedBucket& bucket, const Piece& p, uint64_t at,
              GpuNonFiniteReport* report) const;
  absl::Status WriteBack(const PlannedBucket& bucket, bool in_place);
  // Queues the copy of the bucket's result into every GPU's kept result.
  absl::Status KeepResult(const PlannedBucket& bucket, bool in_place, KeptResultSink* sink);
  // Queues `write` of every piece of `bucket` into every active trainer's
  // gradients (dst, the piece, the GPU's index); errors say `what`.
  absl::Status WriteTrainers(const PlannedBucket& bucket, const std::vector<ReduceSpan>& flat_spans,
                             const char* what,
                             const std::function<absl::Status(void*, const Piece&, int)>& write);
  // Where piece p lies in the kept result (the flat plan's offset).
  uint64_t KeptOffset(const Piece& p) const {
    return session_->flat() ? p.flat_offset : kept_tensor_offsets_[p.tensor];
  }

  GpuSession* session_;
  const Layout& layout_;
  int world_size_;
  const bool skip_event_wait_;
  const bool keep_sums_;
  bool keep_inputs_ = false;
  uint64_t kept_bytes_ = 0;  // the kept sums' (and each input copy's) size
  // keep_sums: per bucket id, its offset in each GPU's kept sums, and the
  // world size its kept sum was pre-scaled by (0: not summed this iteration).
  std::vector<uint64_t> kept_offset_;
  std::vector<int> kept_world_;
  // KeepResults: each tensor's flat plan offset (user-pointer mode).
  std::vector<uint64_t> kept_tensor_offsets_;
  uint64_t kept_result_bytes_ = 0;                       // 0: no result kept
  std::vector<bool> active_;                             // per trainer
  std::vector<std::vector<size_t>> trainers_on_device_;  // the active ones, per device index
  // Scratch, reused per call (no allocation in steady state).
  std::vector<Piece> pieces_;
  std::vector<const void*> srcs_;
  std::vector<gpu::DeviceBuffer> buffers_;
  std::vector<std::pair<size_t, uint32_t>> pending_;
  absl::Status device_error_;
  uint32_t last_token_ = 0;  // the non-finite check's, one per checked bucket
  double stall_threshold_s_ = 0;
  StallReporter stall_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_GPU_REDUCER_H_
