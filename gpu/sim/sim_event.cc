#include "gpu/sim/sim_event.h"

#include <unistd.h>

#include <chrono>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/monotonic.h"
#include "common/status_macros.h"
#include "gpu/sim/sim_memory.h"

namespace gradsync::gpu::sim {
namespace {

constexpr uint64_t kEventMagic = 0x315456454d495347ull;  // "GSIMEVT1"

absl::Mutex live_mu(absl::kConstInit);
std::set<SimEvent*>& Live() ABSL_EXCLUSIVE_LOCKS_REQUIRED(live_mu) {
  static auto* live = new std::set<SimEvent*>();
  return *live;
}

}  // namespace

SimEvent::SimEvent(std::shared_ptr<Mapping> mapping, bool owned)
    : mapping_(std::move(mapping)), owned_(owned) {
  absl::MutexLock lock(&live_mu);
  Live().insert(this);
}

SimEvent::~SimEvent() {
  {
    absl::MutexLock lock(&live_mu);
    Live().erase(this);
  }
  if (owned_) {
    mapping_->record()->destroyed.store(1, std::memory_order_release);
    ipc::SharedSegment::Remove(mapping_->name).IgnoreError();
  }
}

SimEvent* SimEvent::FromHandle(Event* event) {
  auto* e = reinterpret_cast<SimEvent*>(event);
  absl::MutexLock lock(&live_mu);
  return Live().count(e) != 0 ? e : nullptr;
}

absl::StatusOr<std::unique_ptr<SimEvent>> SimEvent::Create(const std::string& prefix,
                                                           int device_index, bool interprocess) {
  auto mapping = std::make_shared<Mapping>();
  mapping->name = NewSegmentName(prefix, "e");
  ASSIGN_OR_RETURN(ipc::SharedSegment seg,
                   ipc::SharedSegment::Create(mapping->name, sizeof(EventRecord)));
  mapping->segment = std::move(seg);
  // The segment is zero-filled: both counters start at 0 (done).
  EventRecord* r = mapping->record();
  r->owner_pid = getpid();
  r->device_index = device_index;
  std::atomic_thread_fence(std::memory_order_release);
  r->magic = kEventMagic;
  auto event = std::unique_ptr<SimEvent>(new SimEvent(std::move(mapping), /*owned=*/true));
  event->interprocess_ = interprocess;
  return event;
}

absl::StatusOr<std::unique_ptr<SimEvent>> SimEvent::Open(const IpcHandle& handle,
                                                         int device_index) {
  ASSIGN_OR_RETURN(std::string name, DecodeHandle(HandleKind::kEvent, handle));
  absl::StatusOr<ipc::SharedSegment> seg = ipc::SharedSegment::Open(name, 0600);
  if (!seg.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("event handle names no live event: ", seg.status().message()));
  }
  if (seg->size() < sizeof(EventRecord) ||
      static_cast<const EventRecord*>(seg->data())->magic != kEventMagic) {
    return absl::InvalidArgumentError(absl::StrCat("segment ", name, " is not a sim event"));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->segment = *std::move(seg);
  mapping->name = name;
  if (mapping->record()->device_index != device_index) {
    return absl::InvalidArgumentError(absl::StrCat("event ", name, " is on sim GPU ",
                                                   mapping->record()->device_index, ", not ",
                                                   device_index));
  }
  if (mapping->record()->owner_pid == getpid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("event handle ", name, " was exported by this process (pid ", getpid(),
                     "): CUDA refuses to open an IPC handle in the process that created it "
                     "(cudaIpcOpenEventHandle: cudaErrorInvalidContext)"));
  }
  return std::unique_ptr<SimEvent>(new SimEvent(std::move(mapping), /*owned=*/false));
}

IpcHandle SimEvent::Export() const { return EncodeHandle(HandleKind::kEvent, mapping_->name); }

void SimEvent::Record(SimStream* stream) {
  EventRecord* r = mapping_->record();
  const uint64_t generation = r->recorded.fetch_add(1, std::memory_order_acq_rel) + 1;
  stream->Enqueue([mapping = mapping_, generation] {
    // Release: whoever sees the generation also sees every earlier write.
    mapping->record()->completed.store(generation, std::memory_order_release);
  });
}

void SimEvent::WaitOn(SimStream* stream) {
  const uint64_t generation = mapping_->record()->recorded.load(std::memory_order_acquire);
  stream->Enqueue([mapping = mapping_, generation] {
    const absl::Time give_up = MonotonicNow() + kMaxStreamWait;
    while (mapping->record()->completed.load(std::memory_order_acquire) < generation &&
           MonotonicNow() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
}

absl::StatusOr<Completion> SimEvent::Query() const {
  const EventRecord* r = mapping_->record();
  if (!owned_ && r->destroyed.load(std::memory_order_acquire) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("event ", mapping_->name, " was destroyed by its owner process ", r->owner_pid,
                     " while still opened here (undefined behaviour in CUDA)"));
  }
  const uint64_t recorded = r->recorded.load(std::memory_order_acquire);
  const uint64_t completed = r->completed.load(std::memory_order_acquire);
  if (completed >= recorded) return Completion::kDone;
  if (!ProcessAlive(r->owner_pid)) {
    return absl::UnavailableError(absl::StrCat("event ", mapping_->name, ": its owner process ",
                                               r->owner_pid,
                                               " is dead; the event will never complete"));
  }
  return Completion::kPending;
}

}  // namespace gradsync::gpu::sim
