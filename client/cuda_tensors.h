// CudaTensors: a trainer's CUDA gradients as the client library sees them —
// where each one lives on the device, and its readiness event.
//
// Two modes, chosen per registration:
//   flat buffer   (every cuda_ptr NULL) the daemon allocates the trainer's
//                 gradient buffer on its GPU; we map it and hand out device
//                 pointers into it (gs_grad_buffer). Nothing of ours is ever
//                 mapped by the daemon, so nothing of ours must outlive it.
//   user pointer  (every cuda_ptr set) the tensors stay where the trainer
//                 allocated them; each distinct allocation base is exported
//                 once. The trainer keeps them allocated until gs_close.
//
// Readiness: a pool of at most kReadyEventPool interprocess events (a
// process that opens tens of thousands of IPC events fails, and the daemon
// opens every trainer's). A mark records the next slot, round-robin, on the
// chosen stream (never a host synchronize) before the ring entry naming the
// slot is posted; the daemon polls that slot before touching the tensor.
// A slot already recorded in this synced iteration is re-recorded only in
// a way that completes after its previous recording: on the same stream,
// or after making the new stream wait for it (StreamWaitEvent). The next
// synced iteration starts after gs_wait returned, when the daemon has seen
// every recording complete, so every slot is free again (local.proto,
// CudaRegistration.event_handles, states the invariant).
//
// Teardown order (CUDA calls both of these undefined behaviour: freeing
// memory another process still maps, and using an imported event after its
// exporter destroyed it):
//   1. ReleaseMemory: our stream drained (its kernels may still write
//      gradients into the flat buffer), then the flat buffer unmapped;
//   2. the caller's Detach: the daemon may free the buffer from then on;
//   3. the destructor: the events go, once the daemon no longer polls them
//      (Detach returned, or the daemon is gone). Once Prepare's request was
//      sent, the daemon may hold the events: a failed Register keeps this
//      object until gs_close for the same reason.
#ifndef GRADSYNC_CLIENT_CUDA_TENSORS_H_
#define GRADSYNC_CLIENT_CUDA_TENSORS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "gpu/device.h"
#include "gradsync/v1/local.pb.h"

namespace gradsync {

struct TensorSpec;

// Readiness events per trainer: enough that a bucket's marks rarely share
// one (sharing only delays the daemon's view of the earlier mark to the
// later one's completion), few enough that 8 trainers stay far below the
// per-process limit on opened IPC events.
inline constexpr size_t kReadyEventPool = 256;

class CudaTensors {
 public:
  // Checks the specs (all on one CUDA ordinal, cuda_ptr all set or all
  // NULL), identifies the GPU, exports the allocations (user pointer) and
  // creates the events; fills req->cuda and each tensor's cuda field.
  // Errors are INVALID_ARGUMENT naming the tensor.
  static absl::StatusOr<std::unique_ptr<CudaTensors>> Prepare(
      std::shared_ptr<gpu::TrainerDevice> device, const std::vector<TensorSpec>& specs,
      void* native_stream, v1::RegisterRequest* req);
  ~CudaTensors();  // destroys the events (and unmaps, if ReleaseMemory did not)
  CudaTensors(const CudaTensors&) = delete;
  CudaTensors& operator=(const CudaTensors&) = delete;

  // With the daemon's answer: maps the flat buffer (flat mode) and checks
  // that every tensor lies inside it.
  absl::Status Attach(const v1::RegisterResponse& resp, const Layout& layout);

  void* ptr(size_t index) const { return ptrs_[index]; }
  bool flat() const { return flat_; }
  const gpu::DeviceId& device_id() const { return device_id_; }

  // Records a readiness event for tensor `index` of synced iteration
  // `iteration` on the current stream; returns the slot recorded, for the
  // ring entry.
  absl::StatusOr<uint16_t> Record(size_t index, uint64_t iteration);
  size_t event_slots() const { return events_.size(); }
  // Zeroes tensor `index` on the current stream (asynchronously).
  absl::Status Zero(size_t index, uint64_t bytes);
  // The stream later records and zeroes go to (null: legacy default).
  void SetStream(void* native);
  gpu::Stream* stream() const { return stream_; }
  gpu::TrainerDevice& device() const { return *device_; }

  // gs_broadcast of a device buffer: the daemon's two staging slots on our
  // GPU (`handle`, from the broadcast's first step), mapped at the first
  // device broadcast and kept until ReleaseMemory unmaps them.
  absl::StatusOr<uint8_t*> BroadcastSlots(const std::string& handle);

  // Before Detach: waits (polling, up to `timeout`) for the current stream,
  // then unmaps the flat buffer and the broadcast slots. If the stream does not drain, the mapping
  // stays (unmapping under a running kernel would fault it) and the error
  // says so. Idempotent.
  absl::Status ReleaseMemory(absl::Duration timeout);

 private:
  CudaTensors() = default;

  std::shared_ptr<gpu::TrainerDevice> device_;
  gpu::DeviceId device_id_;
  bool flat_ = false;
  gpu::Stream* stream_ = nullptr;
  std::vector<void*> ptrs_;  // per tensor, valid after Attach
  // The pool; per slot, where its latest recording went (a recording of an
  // earlier iteration is known complete: it constrains nothing).
  std::vector<gpu::Event*> events_;
  struct SlotUse {
    bool recorded = false;
    uint64_t iteration = 0;
    gpu::Stream* stream = nullptr;
  };
  std::vector<SlotUse> slot_use_;
  size_t next_slot_ = 0;
  void* flat_base_ = nullptr;       // mapped daemon buffer (flat mode)
  void* broadcast_base_ = nullptr;  // mapped broadcast staging, and its handle
  std::string broadcast_handle_;
  std::vector<std::string> names_;
};

}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_CUDA_TENSORS_H_
