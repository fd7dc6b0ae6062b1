// The entries that cross the rings, and their validation.
//
// ReadyEvent (trainer -> daemon): "gradient `tensor` is final for iteration
// `iteration`" (or unused: it contributes zeros). CompletionEvent (daemon ->
// trainer): "bucket `bucket` of `iteration` is reduced" with a status, and a
// final kIterationDone entry once every bucket is. Both carry a per-ring
// sequence number: gaps or repeats reveal corruption. The daemon posts
// kIterationDone (or kError) only; kBucketDone is reserved and never posted.
#ifndef GRADSYNC_IPC_EVENTS_H_
#define GRADSYNC_IPC_EVENTS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace gradsync::ipc {

// kJoin (gs_join): the trainer has no more data; from this iteration on it
// contributes zeros and marks nothing. Its `tensor` field carries
// kJoinDivideByInitialWorldSize or 0 instead of a tensor index.
enum class ReadyKind : uint32_t { kReady = 1, kUnused = 2, kJoin = 3 };
inline constexpr uint32_t kJoinDivideByInitialWorldSize = 1;

struct ReadyEvent {
  uint32_t tensor;  // registration index
  uint16_t kind;    // ReadyKind
  // CUDA tensors: which of the trainer's pooled interprocess events
  // (CudaRegistration.event_handles) was recorded for this mark; 0 for CPU
  // tensors. The reuse rule is in local.proto (CudaRegistration).
  uint16_t event_slot;
  uint64_t iteration;  // the trainer's synced-iteration counter, from 0
  uint64_t sequence;   // 0, 1, 2, ... per ring
  // Iterations the trainer accumulated under gs_set_sync(0) (no_sync) before
  // this synced one: every entry of an iteration, from every trainer, must
  // carry the same count, or the average would mix different sums.
  uint32_t no_sync_iterations;
  // GRADSYNC_DEBUG=detail: MarkChecksum of the gradient at mark time (CPU
  // tensors); 0: not computed.
  uint32_t checksum;
};
static_assert(sizeof(ReadyEvent) == 32);

// kAllJoined: posted to the trainers that joined once every trainer of the
// job has (gs_join returns then); joined trainers get no kIterationDone.
enum class CompletionKind : uint32_t {
  kBucketDone = 1,
  kIterationDone = 2,
  kError = 3,
  kAllJoined = 4
};

// kIterationDone also carries what the trainer sees of the job after its
// gs_wait (gs_get_job_info): `iteration` is the job-wide index of the
// iteration just completed (every trainer of every node posts the same),
// `world_size` what its sum was divided by, `rank` the trainer's global rank
// in it. They ride on the entry the trainer waits for anyway: no extra call.
struct CompletionEvent {
  uint16_t kind;   // CompletionKind
  uint16_t flags;  // kIterationDone: kCompletionSkipStep or 0
  union {
    uint32_t bucket;      // bucket id (kBucketDone)
    uint32_t world_size;  // kIterationDone: the iteration's divisor
  };
  uint64_t iteration;
  uint64_t sequence;  // 0, 1, 2, ... per ring
  union {
    int32_t status;  // gs_status / gradsync.v1.Code; non-zero with kError
    // kIterationDone with kCompletionNodesJoined or kCompletionTrainersJoined:
    // the rank every trainer broadcasts the job's state from (the lowest
    // rank alive and a member before the joiners came).
    int32_t catch_up_root;
  };
  int32_t rank;  // kIterationDone: this trainer's global rank; else 0
};
// kIterationDone's flags: the iteration's reduced gradients are not finite
// and the job runs --nonfinite=skip: every trainer of the job gets the same
// flag for the same iteration and must not apply the gradients.
inline constexpr uint16_t kCompletionSkipStep = 1;
// kIterationDone's flags: an elastic job's members changed during the
// iteration (the survivors of a node's death re-formed): its divisor is the
// new world's. Trainers count these (gs_job_info.membership_changes).
inline constexpr uint16_t kCompletionMembersChanged = 2;
// kIterationDone's flags: nodes join the running elastic job right after
// this iteration (with kCompletionMembersChanged; its divisor is still the
// old world's): every trainer hands its state to the joiners' trainers
// (gs_broadcast) before the next iteration (gs_job_info.nodes_joined).
inline constexpr uint16_t kCompletionNodesJoined = 4;
// kIterationDone's flags: trainers join the running elastic job right after
// this iteration (a trainer restarted on a node that stayed takes back its
// dead predecessor's local rank and rank; the divisor is still the old
// one): every trainer hands its state to them as for kCompletionNodesJoined
// (gs_job_info.trainers_joined).
inline constexpr uint16_t kCompletionTrainersJoined = 8;
static_assert(sizeof(CompletionEvent) == 32);

// What the consumer of a readiness ring expects next.
struct ReadyExpectation {
  uint32_t num_tensors;
  uint64_t iteration;        // the iteration being collected
  uint64_t sequence;         // the next sequence number
  uint32_t event_slots = 0;  // the trainer's pooled CUDA events; 0: CPU (slot must be 0)
};

// Checks one entry read from a trainer's readiness ring. A failure names
// the field and both values; the caller fails that trainer only.
absl::Status ValidateReadyEvent(const ReadyEvent& e, const ReadyExpectation& expect);

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_EVENTS_H_
