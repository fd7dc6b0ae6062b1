// A simulated interprocess event: a shared record of two counters that the
// owner's stream completes in order and anyone who opened it reads.
//
//   recorded   bumped by RecordEvent on the host (owner only)
//   completed  set to that generation by the stream, after all earlier work
//
// The event is done when completed >= recorded (never recorded = done, as
// in CUDA). Atomics only: no mutex lives in shared memory, so a crashed
// owner cannot leave a lock held; a pending event whose owner is dead is an
// error, never pending forever.
//
// An importer's Query after the owner destroyed the event is an error
// (FAILED_PRECONDITION naming the owner), never an answer: CUDA calls any
// operation on an imported event after the exporter's cudaEventDestroy
// undefined behaviour (cudaIpcOpenEventHandle).
//
// Where the simulation is kinder than CUDA: a real IPC event whose exporter
// died (or destroyed it) is undefined to query (cudaErrorNotReady for
// ever is one possible answer; unverified on a GPU). There a dead trainer
// is caught by the daemon's process watch aborting the session (GpuReducer
// sees aborted()), or by the deadline as TIMEOUT, not by this UNAVAILABLE;
// tests of a killed trainer must not depend on it.
//
// Threads: Record from the owner's calling thread; Query from any thread.
#ifndef GRADSYNC_GPU_SIM_SIM_EVENT_H_
#define GRADSYNC_GPU_SIM_SIM_EVENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/device.h"
#include "gpu/sim/sim_stream.h"
#include "ipc/shared_segment.h"

namespace gradsync::gpu::sim {

struct EventRecord {
  uint64_t magic;
  int32_t owner_pid;
  int32_t device_index;
  std::atomic<uint64_t> recorded;
  std::atomic<uint64_t> completed;
  std::atomic<uint32_t> destroyed;  // set by the owner's DestroyEvent
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters must be lock-free");

class SimEvent {
 public:
  // A new event owned by this process, on sim GPU `device_index`;
  // `interprocess`: created with cudaEventInterprocess (only those export).
  static absl::StatusOr<std::unique_ptr<SimEvent>> Create(const std::string& prefix,
                                                          int device_index, bool interprocess);
  // Opens an exported event, checking it lives on `device_index`.
  static absl::StatusOr<std::unique_ptr<SimEvent>> Open(const IpcHandle& handle, int device_index);
  ~SimEvent();  // the owner unlinks the name; mappings stay valid meanwhile

  Event* handle() { return reinterpret_cast<Event*>(this); }
  // Null unless `event` is a live SimEvent.
  static SimEvent* FromHandle(Event* event);

  IpcHandle Export() const;
  bool owned() const { return owned_; }
  bool interprocess() const { return interprocess_; }
  int device_index() const { return mapping_->record()->device_index; }
  const std::string& name() const { return mapping_->name; }

  // Owner only: the event completes once everything queued on `stream`
  // before it has run.
  void Record(SimStream* stream);
  // Owner only: `stream`'s later work runs once the recording made before
  // this call has completed (cuStreamWaitEvent). The stream's worker waits
  // (bounded by kMaxStreamWait, then goes on: a simulated stream must not
  // hang its process's teardown).
  void WaitOn(SimStream* stream);
  static constexpr absl::Duration kMaxStreamWait = absl::Seconds(60);
  // kDone / kPending; UNAVAILABLE if pending and its owner process is dead;
  // FAILED_PRECONDITION (importers) once the owner destroyed it.
  absl::StatusOr<Completion> Query() const;

 private:
  struct Mapping {
    ipc::SharedSegment segment;
    std::string name;
    EventRecord* record() const { return static_cast<EventRecord*>(segment.data()); }
  };

  SimEvent(std::shared_ptr<Mapping> mapping, bool owned);

  // Shared with completion operations still queued on a stream.
  std::shared_ptr<Mapping> mapping_;
  bool owned_;
  bool interprocess_ = false;
};

}  // namespace gradsync::gpu::sim

#endif  // GRADSYNC_GPU_SIM_SIM_EVENT_H_
