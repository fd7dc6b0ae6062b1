#include "gpu/sim/sim_device.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/monotonic.h"
#include "common/status_macros.h"
#include "gpu/sim/sim_collectives.h"
#include "gpu/sim/sim_current_device.h"
#include "gpu/sim/sim_event.h"
#include "gpu/sim/sim_kernels.h"
#include "gpu/sim/sim_memory.h"
#include "gpu/sim/sim_stream.h"
#include "ipc/shared_segment.h"

namespace gradsync::gpu {
namespace sim {

// What both simulated devices share: the node's GPUs as this process sees
// them, the streams and events it owns, and the default streams.
class Node {
 public:
  explicit Node(SimOptions options) : options_(std::move(options)) {}

  ~Node() {
    // Streams first: they run what is queued, which may complete events.
    absl::MutexLock lock(&mu_);
    streams_.clear();
    defaults_.clear();
    events_.clear();
    // What was allocated through this device and never freed goes with it
    // (a process's memory goes with its CUDA context).
    for (void* base : allocations_) Registry::Get().Free(base).IgnoreError();
  }

  absl::StatusOr<void*> Allocate(int device_index, size_t bytes) {
    ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                     Registry::Get().Allocate(options_.prefix, device_index, bytes));
    absl::MutexLock lock(&mu_);
    allocations_.insert(region->base);
    return static_cast<void*>(region->base);
  }

  absl::Status Free(void* base) {
    RETURN_IF_ERROR(Registry::Get().Free(base));
    absl::MutexLock lock(&mu_);
    allocations_.erase(base);
    return absl::OkStatus();
  }

  const SimOptions& options() const { return options_; }

  // The GPU index of a visible device id, or INVALID_ARGUMENT naming it.
  absl::StatusOr<int> IndexOf(const DeviceId& device) const {
    constexpr absl::string_view kPrefix = "SIM-GPU-";
    int index = -1;
    if (absl::string_view(device).substr(0, kPrefix.size()) == kPrefix &&
        absl::SimpleAtoi(absl::string_view(device).substr(kPrefix.size()), &index)) {
      for (int v : Visible()) {
        if (v == index && SimDeviceId(index) == device) return index;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("no visible simulated GPU has id '", device, "' (visible: ",
                     absl::StrJoin(Visible(), ", ",
                                   [](std::string* out, int i) { out->append(SimDeviceId(i)); }),
                     ")"));
  }

  // The GPU index of this thread's current device: the one it chose, else
  // ordinal 0, as CUDA answers for a thread that never called cudaSetDevice.
  int CurrentIndex() const {
    const int chosen = ChosenDevice();
    return chosen >= 0 ? chosen : Visible().front();
  }

  std::vector<int> Visible() const {
    if (!options_.visible.empty()) return options_.visible;
    std::vector<int> all;
    for (int i = 0; i < options_.num_gpus; ++i) all.push_back(i);
    return all;
  }

  SimStream* NewStream(int device_index) {
    auto stream =
        std::make_unique<SimStream>(device_index, options_.min_op_delay, options_.max_op_delay);
    SimStream* raw = stream.get();
    absl::MutexLock lock(&mu_);
    streams_[raw] = std::move(stream);
    return raw;
  }

  void DeleteStream(Stream* handle) {
    std::unique_ptr<SimStream> doomed;  // destroyed (drained) outside the lock
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(SimStream::FromHandle(handle));
    if (it == streams_.end()) return;
    doomed = std::move(it->second);
    streams_.erase(it);
  }

  // `handle` resolved; null means the legacy default stream of GPU
  // `default_device` (INVALID_ARGUMENT when `allow_default` is false).
  absl::StatusOr<SimStream*> Resolve(Stream* handle, int default_device, bool allow_default) {
    if (handle == nullptr) {
      if (!allow_default) {
        return absl::InvalidArgumentError(
            "null stream: the daemon works on its own streams (CreateStream)");
      }
      absl::MutexLock lock(&mu_);
      auto& slot = defaults_[default_device];
      if (slot == nullptr) {
        slot = std::make_unique<SimStream>(default_device, options_.min_op_delay,
                                           options_.max_op_delay);
      }
      return slot.get();
    }
    SimStream* s = SimStream::FromHandle(handle);
    if (s == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream ", sim::PointerString(handle), " is not a live simulated stream"));
    }
    return s;
  }

  // Waits for `handle`, or for every default stream when it is null.
  absl::Status Synchronize(Stream* handle, absl::Duration timeout) {
    std::vector<SimStream*> targets;
    if (handle != nullptr) {
      SimStream* s = SimStream::FromHandle(handle);
      if (s == nullptr) return absl::InvalidArgumentError("not a live simulated stream");
      targets.push_back(s);
    } else {
      absl::MutexLock lock(&mu_);
      for (auto& [index, s] : defaults_) targets.push_back(s.get());
    }
    const absl::Time deadline = MonotonicNow() + timeout;
    for (SimStream* s : targets) {
      if (!s->WaitIdle(deadline - MonotonicNow())) {
        return absl::DeadlineExceededError(
            absl::StrCat("stream on ", SimDeviceId(s->device_index()), " still busy after ",
                         absl::FormatDuration(timeout)));
      }
    }
    return absl::OkStatus();
  }

  // The region holding [ptr, ptr + bytes), which must be on `device_index`
  // (-1: any).
  absl::StatusOr<std::shared_ptr<Region>> Range(const void* ptr, size_t bytes, int device_index,
                                                const char* what) {
    absl::StatusOr<std::shared_ptr<Region>> region = Registry::Get().Find(ptr, bytes);
    if (!region.ok())
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", region.status().message()));
    if (device_index >= 0 && (*region)->device_index != device_index) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", sim::PointerString(ptr), " is on ", SimDeviceId((*region)->device_index),
          ", the stream on ", SimDeviceId(device_index)));
    }
    return region;
  }

  Event* AdoptEvent(std::unique_ptr<SimEvent> event) {
    Event* handle = event->handle();
    absl::MutexLock lock(&mu_);
    events_[event.get()] = std::move(event);
    return handle;
  }

  // The event, if this node holds it (created or opened here).
  SimEvent* FindEvent(Event* handle) {
    SimEvent* e = SimEvent::FromHandle(handle);
    absl::MutexLock lock(&mu_);
    return e != nullptr && events_.count(e) != 0 ? e : nullptr;
  }

  // Collectives in flight per GPU, and the check CUDA + NCCL would need:
  // memory management on a GPU while a collective runs there may
  // synchronize the device and deadlock on the NCCL kernel (device_gate.h).
  // The simulation cannot deadlock, so it refuses the call instead.
  void CollectiveStarted(const std::vector<int>& devices) {
    absl::MutexLock lock(&mu_);
    for (int d : devices) ++in_flight_[d];
  }
  void CollectiveEnded(const std::vector<int>& devices) {
    absl::MutexLock lock(&mu_);
    for (int d : devices) --in_flight_[d];
  }
  absl::Status CheckNoCollective(int device_index, absl::string_view what) {
    absl::MutexLock lock(&mu_);
    auto it = in_flight_.find(device_index);
    if (it == in_flight_.end() || it->second == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        what, " on ", SimDeviceId(device_index), " while ", it->second,
        " collective(s) run there: CUDA may synchronize the device and deadlock on the NCCL "
        "kernel"));
  }

  void DeleteEvent(Event* handle) {
    std::unique_ptr<SimEvent> doomed;
    absl::MutexLock lock(&mu_);
    auto it = events_.find(SimEvent::FromHandle(handle));
    if (it == events_.end()) return;
    doomed = std::move(it->second);
    events_.erase(it);
  }

 private:
  const SimOptions options_;
  absl::Mutex mu_;
  std::map<SimStream*, std::unique_ptr<SimStream>> streams_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::unique_ptr<SimStream>> defaults_ ABSL_GUARDED_BY(mu_);
  std::map<SimEvent*, std::unique_ptr<SimEvent>> events_ ABSL_GUARDED_BY(mu_);
  std::set<void*> allocations_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> in_flight_ ABSL_GUARDED_BY(mu_);
};

// Counts the group's collectives as in flight on its GPUs (Node above).
class CountedCollectives final : public CollectiveGroup {
 public:
  CountedCollectives(std::unique_ptr<CollectiveGroup> group, Node* node, std::vector<int> devices)
      : group_(std::move(group)), node_(node), devices_(std::move(devices)) {}
  absl::Status AllreduceSum(const std::vector<DeviceBuffer>& buffers, DType dtype) override {
    node_->CollectiveStarted(devices_);
    absl::Status st = group_->AllreduceSum(buffers, dtype);
    node_->CollectiveEnded(devices_);
    return st;
  }
  absl::Status Broadcast(const std::vector<DeviceBuffer>& buffers, int root) override {
    node_->CollectiveStarted(devices_);
    absl::Status st = group_->Broadcast(buffers, root);
    node_->CollectiveEnded(devices_);
    return st;
  }
  void Abort(const std::string& reason) override { group_->Abort(reason); }

 private:
  const std::unique_ptr<CollectiveGroup> group_;
  Node* const node_;
  const std::vector<int> devices_;
};

namespace {

absl::Status CheckOptions(const SimOptions& o) {
  if (o.num_gpus < 1 || o.num_gpus > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("a simulated node has 1..64 GPUs, not ", o.num_gpus));
  }
  for (int v : o.visible) {
    if (v < 0 || v >= o.num_gpus) {
      return absl::InvalidArgumentError(
          absl::StrCat("visible GPU ", v, " is not one of the ", o.num_gpus, " simulated GPUs"));
    }
  }
  if (o.min_op_delay < absl::ZeroDuration() || o.max_op_delay < o.min_op_delay) {
    return absl::InvalidArgumentError("simulated stream delays: need 0 <= min <= max");
  }
  if (o.prefix.empty() || o.prefix.find_first_of("./") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("bad segment prefix '", o.prefix, "'"));
  }
  return absl::OkStatus();
}

absl::Status EnvInt(const char* name, int64_t* value) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') return absl::OkStatus();
  if (!absl::SimpleAtoi(raw, value) || *value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "='", raw, "' is not a non-negative integer"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace sim

using sim::Node;
using sim::Region;
using sim::Registry;
using sim::SimEvent;
using sim::SimStream;

DeviceId SimDeviceId(int index) { return absl::StrCat("SIM-GPU-", index); }

std::string SimHost(const SimOptions& options) {
  if (!options.host.empty()) return options.host;
  if (const char* id = std::getenv("NCCL_HOSTID"); id != nullptr && *id != '\0') return id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

absl::StatusOr<SimOptions> SimOptions::FromEnv() {
  SimOptions o;
  int64_t gpus = o.num_gpus;
  int64_t min_us = 0;
  int64_t max_us = absl::ToInt64Microseconds(o.max_op_delay);
  RETURN_IF_ERROR(sim::EnvInt("GRADSYNC_SIM_GPUS", &gpus));
  RETURN_IF_ERROR(sim::EnvInt("GRADSYNC_SIM_MIN_DELAY_US", &min_us));
  RETURN_IF_ERROR(sim::EnvInt("GRADSYNC_SIM_MAX_DELAY_US", &max_us));
  o.num_gpus = static_cast<int>(std::min<int64_t>(gpus, 1 << 20));
  o.min_op_delay = absl::Microseconds(min_us);
  o.max_op_delay = absl::Microseconds(std::max(min_us, max_us));
  if (const char* raw = std::getenv("GRADSYNC_SIM_LOSE_DEVICE_AT"); raw != nullptr) {
    o.lose_device_at = raw;
  }
  if (const char* raw = std::getenv("GRADSYNC_SIM_STALL_AT"); raw != nullptr) o.stall_at = raw;
  if (const char* raw = std::getenv("GRADSYNC_SIM_PREFIX"); raw != nullptr && *raw) o.prefix = raw;
  if (const char* raw = std::getenv("GRADSYNC_SIM_VISIBLE_DEVICES"); raw != nullptr && *raw) {
    for (absl::string_view part : absl::StrSplit(raw, ',')) {
      int v = 0;
      if (!absl::SimpleAtoi(part, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("GRADSYNC_SIM_VISIBLE_DEVICES='", raw, "': not a list of GPU indices"));
      }
      o.visible.push_back(v);
    }
  }
  if (auto st = sim::CheckOptions(o); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("GRADSYNC_SIM_*: ", st.message()));
  }
  return o;
}

absl::Status SimPauseStream(Stream* stream) {
  SimStream* s = SimStream::FromHandle(stream);
  if (s == nullptr) return absl::InvalidArgumentError("not a live simulated stream");
  s->Pause();
  return absl::OkStatus();
}

absl::Status SimResumeStream(Stream* stream) {
  SimStream* s = SimStream::FromHandle(stream);
  if (s == nullptr) return absl::InvalidArgumentError("not a live simulated stream");
  s->Resume();
  return absl::OkStatus();
}

std::vector<std::string> RemoveStaleSimSegments(const std::string& prefix) {
  return ipc::RemoveStaleSegments(prefix);
}

// ---------------------------------------------------------------- trainer

absl::StatusOr<std::unique_ptr<SimTrainerDevice>> SimTrainerDevice::Create(
    const SimOptions& options) {
  RETURN_IF_ERROR(sim::CheckOptions(options));
  return std::unique_ptr<SimTrainerDevice>(new SimTrainerDevice(std::make_unique<Node>(options)));
}

absl::StatusOr<std::unique_ptr<SimTrainerDevice>> SimTrainerDevice::CreateFromEnv() {
  ASSIGN_OR_RETURN(SimOptions options, SimOptions::FromEnv());
  return Create(options);
}

SimTrainerDevice::SimTrainerDevice(std::unique_ptr<Node> node) : node_(std::move(node)) {}
SimTrainerDevice::~SimTrainerDevice() = default;

absl::StatusOr<Allocation> SimTrainerDevice::FindAllocation(const void* ptr) {
  absl::StatusOr<std::shared_ptr<Region>> region = Registry::Get().Find(ptr, 1);
  if (!region.ok() || !(*region)->owned) {
    return absl::InvalidArgumentError(absl::StrCat(
        sim::PointerString(ptr), " is not simulated device memory allocated by this process"));
  }
  Allocation a;
  a.base = (*region)->base;
  a.size = (*region)->size;
  a.device = SimDeviceId((*region)->device_index);
  return a;
}

absl::StatusOr<DeviceId> SimTrainerDevice::IdOfOrdinal(int ordinal) {
  const std::vector<int> visible = node_->Visible();
  if (ordinal < 0 || ordinal >= static_cast<int>(visible.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("no simulated GPU with ordinal ", ordinal, " (", visible.size(), " visible)"));
  }
  return SimDeviceId(visible[ordinal]);
}

absl::StatusOr<void*> SimTrainerDevice::OpenMemory(const DeviceId& device,
                                                   const IpcHandle& handle) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  ASSIGN_OR_RETURN(std::shared_ptr<Region> region, Registry::Get().Open(handle, index));
  return static_cast<void*>(region->base);
}

absl::Status SimTrainerDevice::CloseMemory(void* base) { return Registry::Get().Close(base); }

absl::StatusOr<IpcHandle> SimTrainerDevice::ExportMemory(void* base) {
  ASSIGN_OR_RETURN(std::shared_ptr<Region> region, Registry::Get().FindOwnedBase(base));
  return sim::EncodeHandle(sim::HandleKind::kMemory, region->name);
}

absl::StatusOr<Event*> SimTrainerDevice::CreateEvent(const DeviceId& device) {
  return NewEvent(device, /*interprocess=*/true);
}

absl::StatusOr<Event*> SimTrainerDevice::CreateLocalEvent(const DeviceId& device) {
  return NewEvent(device, /*interprocess=*/false);
}

absl::StatusOr<Event*> SimTrainerDevice::NewEvent(const DeviceId& device, bool interprocess) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  ASSIGN_OR_RETURN(std::unique_ptr<SimEvent> event,
                   SimEvent::Create(node_->options().prefix, index, interprocess));
  return node_->AdoptEvent(std::move(event));
}

absl::StatusOr<IpcHandle> SimTrainerDevice::ExportEvent(Event* event) {
  SimEvent* e = node_->FindEvent(event);
  if (e == nullptr || !e->owned()) {
    return absl::InvalidArgumentError("ExportEvent: not an event created by this device");
  }
  if (!e->interprocess()) {
    return absl::InvalidArgumentError(
        "ExportEvent: the event was not created with cudaEventInterprocess | "
        "cudaEventDisableTiming, so CUDA cannot export it (cudaIpcGetEventHandle: "
        "cudaErrorInvalidResourceHandle)");
  }
  return e->Export();
}

void SimTrainerDevice::DestroyEvent(Event* event) { node_->DeleteEvent(event); }

absl::Status SimTrainerDevice::RecordEvent(Event* event, Stream* stream) {
  SimEvent* e = node_->FindEvent(event);
  if (e == nullptr || !e->owned()) {
    return absl::InvalidArgumentError("RecordEvent: not an event created by this device");
  }
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, e->device_index(), true));
  if (s->device_index() != e->device_index()) {
    // What the real trainer device returns (cuEventRecord refuses an event
    // and a stream of different devices).
    return absl::InvalidArgumentError(absl::StrCat(
        "cuEventRecord: event on ", SimDeviceId(e->device_index()), ", stream on ",
        SimDeviceId(s->device_index()), ": CUDA_ERROR_INVALID_HANDLE (invalid resource handle)"));
  }
  e->Record(s);
  return absl::OkStatus();
}

absl::Status SimTrainerDevice::StreamWaitEvent(Stream* stream, Event* event) {
  SimEvent* e = node_->FindEvent(event);
  if (e == nullptr || !e->owned()) {
    return absl::InvalidArgumentError("StreamWaitEvent: not an event created by this device");
  }
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, e->device_index(), true));
  e->WaitOn(s);
  return absl::OkStatus();
}

absl::Status SimTrainerDevice::MemsetAsync(void* ptr, size_t bytes, Stream* stream) {
  ASSIGN_OR_RETURN(std::shared_ptr<Region> region, node_->Range(ptr, bytes, -1, "MemsetAsync"));
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, region->device_index, true));
  ASSIGN_OR_RETURN(region, node_->Range(ptr, bytes, s->device_index(), "MemsetAsync"));
  s->Enqueue([hold = region, ptr, bytes] { std::memset(ptr, 0, bytes); });
  return absl::OkStatus();
}

absl::StatusOr<DeviceId> SimTrainerDevice::DeviceOfPointer(const void* ptr) {
  // Owned or mapped here: what CUDA's pointer attributes would call device memory.
  absl::StatusOr<std::shared_ptr<Region>> region = Registry::Get().Find(ptr, 1);
  if (!region.ok()) {
    return absl::NotFoundError(
        absl::StrCat(sim::PointerString(ptr), " is not simulated device memory"));
  }
  return SimDeviceId((*region)->device_index);
}

absl::Status SimTrainerDevice::CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) {
  if (bytes == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::shared_ptr<Region> to, node_->Range(dst, bytes, -1, "CopyAsync dst"));
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, to->device_index, true));
  ASSIGN_OR_RETURN(to, node_->Range(dst, bytes, s->device_index(), "CopyAsync dst"));
  ASSIGN_OR_RETURN(std::shared_ptr<Region> from,
                   node_->Range(src, bytes, s->device_index(), "CopyAsync src"));
  s->Enqueue([to, from, dst, src, bytes] { std::memmove(dst, src, bytes); });
  return absl::OkStatus();
}

Stream* SimTrainerDevice::WrapStream(void* native) { return static_cast<Stream*>(native); }

absl::Status SimTrainerDevice::SynchronizeStream(const DeviceId& device, Stream* stream,
                                                 absl::Duration timeout) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  // Null: this GPU's default stream (created on first use, like CUDA's).
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, index, true));
  return node_->Synchronize(s->handle(), timeout);
}

absl::StatusOr<void*> SimTrainerDevice::Alloc(const DeviceId& device, size_t bytes) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  return node_->Allocate(index, bytes);
}

absl::Status SimTrainerDevice::Free(void* base) { return node_->Free(base); }

absl::StatusOr<Stream*> SimTrainerDevice::CreateStream(const DeviceId& device) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  return node_->NewStream(index)->handle();
}

void SimTrainerDevice::DestroyStream(Stream* stream) { node_->DeleteStream(stream); }

absl::Status SimTrainerDevice::WriteAsync(void* dst, const void* src, size_t bytes,
                                          Stream* stream) {
  // A kernel: null is the current device's default stream, and a stream of
  // another device is refused.
  const int current = node_->CurrentIndex();
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, current, true));
  RETURN_IF_ERROR(sim::CheckLaunchDevice("WriteAsync", s->device_index(), current));
  ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                   node_->Range(dst, bytes, s->device_index(), "WriteAsync"));
  auto data = std::make_shared<std::string>(static_cast<const char*>(src), bytes);
  s->Enqueue([hold = region, dst, data] { std::memcpy(dst, data->data(), data->size()); });
  return absl::OkStatus();
}

absl::Status SimTrainerDevice::SetDevice(const DeviceId& device) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::ChooseDevice(index);
  return absl::OkStatus();
}

DeviceId SimTrainerDevice::CurrentDevice() const { return SimDeviceId(node_->CurrentIndex()); }

absl::Status SimTrainerDevice::Synchronize(Stream* stream, absl::Duration timeout) {
  return node_->Synchronize(stream, timeout);
}

// ----------------------------------------------------------------- daemon

absl::StatusOr<std::unique_ptr<SimDaemonDevice>> SimDaemonDevice::Create(
    const SimOptions& options) {
  RETURN_IF_ERROR(sim::CheckOptions(options));
  return std::unique_ptr<SimDaemonDevice>(new SimDaemonDevice(std::make_unique<Node>(options)));
}

absl::StatusOr<std::unique_ptr<SimDaemonDevice>> SimDaemonDevice::CreateFromEnv() {
  ASSIGN_OR_RETURN(SimOptions options, SimOptions::FromEnv());
  return Create(options);
}

SimDaemonDevice::SimDaemonDevice(std::unique_ptr<Node> node) : node_(std::move(node)) {}
SimDaemonDevice::~SimDaemonDevice() = default;

absl::Status SimDaemonDevice::Lost(const char* op) {
  const std::string& at = node_->options().lose_device_at;
  if (!lost_.load() && (at.empty() || at != op)) return absl::OkStatus();
  lost_.store(true);
  return MarkDeviceLost(absl::InternalError(absl::StrCat(
      "simulated sticky error (lost at ", at, "; now ", op, "): the device is unusable")));
}

absl::Status SimDaemonDevice::CheckDevice(const DeviceId& device) {
  return node_->IndexOf(device).status();
}

absl::StatusOr<void*> SimDaemonDevice::Alloc(const DeviceId& device, size_t bytes) {
  RETURN_IF_ERROR(Lost("alloc"));
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::DeviceSwitch use(index);  // as the real daemon device selects the GPU
  RETURN_IF_ERROR(node_->CheckNoCollective(index, "cudaMalloc"));
  return node_->Allocate(index, bytes);
}

absl::Status SimDaemonDevice::Free(const DeviceId& device, void* ptr) {
  RETURN_IF_ERROR(Lost("free"));
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::DeviceSwitch use(index);  // as the real daemon device selects the GPU
  ASSIGN_OR_RETURN(std::shared_ptr<Region> region, Registry::Get().FindOwnedBase(ptr));
  if (region->device_index != index) {
    return absl::InvalidArgumentError(absl::StrCat("Free: ", sim::PointerString(ptr), " is on ",
                                                   SimDeviceId(region->device_index), ", not ",
                                                   device));
  }
  RETURN_IF_ERROR(node_->CheckNoCollective(index, "cudaFree"));
  return node_->Free(ptr);
}

absl::StatusOr<IpcHandle> SimDaemonDevice::ExportMemory(const DeviceId& device, void* base) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::DeviceSwitch use(index);  // as the real daemon device selects the GPU
  ASSIGN_OR_RETURN(std::shared_ptr<Region> region, Registry::Get().FindOwnedBase(base));
  if (region->device_index != index) {
    return absl::InvalidArgumentError(absl::StrCat("ExportMemory: ", sim::PointerString(base),
                                                   " is on ", SimDeviceId(region->device_index),
                                                   ", not ", device));
  }
  return sim::EncodeHandle(sim::HandleKind::kMemory, region->name);
}

absl::StatusOr<void*> SimDaemonDevice::OpenMemory(const DeviceId& device, const IpcHandle& handle) {
  RETURN_IF_ERROR(Lost("open_memory"));
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::DeviceSwitch use(index);  // as the real daemon device selects the GPU
  RETURN_IF_ERROR(node_->CheckNoCollective(index, "cudaIpcOpenMemHandle"));
  ASSIGN_OR_RETURN(std::shared_ptr<Region> region, Registry::Get().Open(handle, index));
  return static_cast<void*>(region->base);
}

absl::Status SimDaemonDevice::CloseMemory(const DeviceId& device, void* base) {
  RETURN_IF_ERROR(Lost("close_memory"));
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::DeviceSwitch use(index);  // as the real daemon device selects the GPU
  absl::StatusOr<std::shared_ptr<Region>> region = Registry::Get().Find(base, 1);
  if (region.ok() && (*region)->device_index != index) {
    return absl::InvalidArgumentError(absl::StrCat("CloseMemory: ", sim::PointerString(base),
                                                   " is on ", SimDeviceId((*region)->device_index),
                                                   ", not ", device));
  }
  RETURN_IF_ERROR(node_->CheckNoCollective(index, "cudaIpcCloseMemHandle"));
  return Registry::Get().Close(base);
}

absl::StatusOr<uint64_t> SimDaemonDevice::MappedSize(const DeviceId& device, void* base) {
  RETURN_IF_ERROR(node_->IndexOf(device).status());
  absl::StatusOr<std::shared_ptr<Region>> region = Registry::Get().Find(base, 1);
  if (!region.ok() || (*region)->base != base) {
    return absl::InvalidArgumentError(
        absl::StrCat("MappedSize: ", sim::PointerString(base), " is not a mapped allocation base"));
  }
  return static_cast<uint64_t>((*region)->size);
}

absl::StatusOr<Event*> SimDaemonDevice::OpenEvent(const DeviceId& device, const IpcHandle& handle) {
  RETURN_IF_ERROR(Lost("open_event"));
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::DeviceSwitch use(index);  // as the real daemon device selects the GPU
  ASSIGN_OR_RETURN(std::unique_ptr<SimEvent> event, SimEvent::Open(handle, index));
  return node_->AdoptEvent(std::move(event));
}

absl::StatusOr<Completion> SimDaemonDevice::QueryEvent(Event* event) {
  SimEvent* e = node_->FindEvent(event);
  if (e == nullptr) return absl::InvalidArgumentError("QueryEvent: not an event opened here");
  sim::DeviceSwitch use(e->device_index());
  return e->Query();
}

void SimDaemonDevice::CloseEvent(Event* event) { node_->DeleteEvent(event); }

absl::StatusOr<Stream*> SimDaemonDevice::CreateStream(const DeviceId& device) {
  ASSIGN_OR_RETURN(int index, node_->IndexOf(device));
  sim::DeviceSwitch use(index);  // as the real daemon device selects the GPU
  return node_->NewStream(index)->handle();
}

void SimDaemonDevice::DestroyStream(Stream* stream) { node_->DeleteStream(stream); }

absl::StatusOr<Completion> SimDaemonDevice::QueryStream(Stream* stream) {
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, 0, false));
  sim::DeviceSwitch use(s->device_index());
  return s->Idle() ? Completion::kDone : Completion::kPending;
}

absl::Status SimDaemonDevice::CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) {
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, 0, false));
  sim::DeviceSwitch use(s->device_index());
  const int device = s->device_index();
  ASSIGN_OR_RETURN(std::shared_ptr<Region> to, node_->Range(dst, bytes, device, "CopyAsync dst"));
  ASSIGN_OR_RETURN(std::shared_ptr<Region> from, node_->Range(src, bytes, device, "CopyAsync src"));
  s->Enqueue([to, from, dst, src, bytes] { std::memmove(dst, src, bytes); });
  return absl::OkStatus();
}

absl::Status SimDaemonDevice::ZeroAsync(void* dst, size_t bytes, Stream* stream) {
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, 0, false));
  sim::DeviceSwitch use(s->device_index());
  ASSIGN_OR_RETURN(std::shared_ptr<Region> to,
                   node_->Range(dst, bytes, s->device_index(), "ZeroAsync dst"));
  s->Enqueue([to, dst, bytes] { std::memset(dst, 0, bytes); });
  return absl::OkStatus();
}

absl::Status SimDaemonDevice::SumAsync(void* dst, const std::vector<const void*>& srcs,
                                       size_t count, DType dtype, double scale,
                                       const NonFiniteCheck& check, Stream* stream) {
  if (!IsValidDType(static_cast<int32_t>(dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("SumAsync: bad dtype ", static_cast<int32_t>(dtype)));
  }
  if (srcs.empty()) return absl::InvalidArgumentError("SumAsync: no sources");
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, 0, false));
  const int device = s->device_index();
  // The real daemon device selects the stream's GPU before its launch.
  sim::DeviceSwitch use(device);
  RETURN_IF_ERROR(sim::CheckLaunchDevice("SumAsync", device, node_->CurrentIndex()));
  const size_t bytes = count * DTypeSize(dtype);
  if (bytes == 0) return absl::OkStatus();
  std::vector<std::shared_ptr<Region>> hold;
  ASSIGN_OR_RETURN(std::shared_ptr<Region> to, node_->Range(dst, bytes, device, "SumAsync dst"));
  hold.push_back(to);
  for (size_t k = 0; k < srcs.size(); ++k) {
    ASSIGN_OR_RETURN(
        std::shared_ptr<Region> from,
        node_->Range(srcs[k], bytes, device, absl::StrCat("SumAsync src ", k).c_str()));
    hold.push_back(from);
  }
  if (check.flag != nullptr) {
    ASSIGN_OR_RETURN(std::shared_ptr<Region> flag,
                     node_->Range(check.flag, sizeof(uint32_t), device, "SumAsync flag"));
    hold.push_back(flag);
  }
  s->Enqueue([hold = std::move(hold), dst, srcs, count, dtype, scale, check] {
    sim::SumKernel(dst, srcs, count, dtype, scale, check.flag, check.token);
  });
  return absl::OkStatus();
}

absl::StatusOr<void*> SimDaemonDevice::AllocHost(const DeviceId& device, size_t bytes) {
  RETURN_IF_ERROR(Lost("alloc_host"));
  RETURN_IF_ERROR(node_->IndexOf(device).status());
  if (bytes == 0) return absl::InvalidArgumentError("AllocHost of 0 bytes");
  auto block = std::make_shared<std::vector<uint8_t>>(bytes);
  absl::MutexLock lock(&host_mu_);
  host_[block->data()] = block;
  return static_cast<void*>(block->data());
}

absl::Status SimDaemonDevice::FreeHost(const DeviceId& device, void* ptr) {
  RETURN_IF_ERROR(node_->IndexOf(device).status());
  absl::MutexLock lock(&host_mu_);
  if (host_.erase(static_cast<const uint8_t*>(ptr)) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FreeHost: ", sim::PointerString(ptr), " is not host memory of this device"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<std::vector<uint8_t>>> SimDaemonDevice::HostBlock(const void* host,
                                                                                 size_t bytes,
                                                                                 const char* what) {
  const auto* p = static_cast<const uint8_t*>(host);
  absl::MutexLock lock(&host_mu_);
  auto it = host_.upper_bound(p);
  if (it != host_.begin()) {
    --it;
    const std::vector<uint8_t>& block = *it->second;
    if (p >= block.data() && bytes <= block.size() &&
        static_cast<size_t>(p - block.data()) <= block.size() - bytes) {
      return it->second;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", sim::PointerString(host), " + ", bytes,
                                                 " is not host memory from AllocHost"));
}

absl::Status SimDaemonDevice::CopyToHostAsync(void* host, const void* src, size_t bytes,
                                              Stream* stream) {
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, 0, false));
  sim::DeviceSwitch use(s->device_index());
  ASSIGN_OR_RETURN(std::shared_ptr<std::vector<uint8_t>> to,
                   HostBlock(host, bytes, "CopyToHostAsync dst"));
  ASSIGN_OR_RETURN(std::shared_ptr<Region> from,
                   node_->Range(src, bytes, s->device_index(), "CopyToHostAsync src"));
  s->Enqueue([to, from, host, src, bytes] { std::memcpy(host, src, bytes); });
  return absl::OkStatus();
}

absl::Status SimDaemonDevice::CopyFromHostAsync(void* dst, const void* host, size_t bytes,
                                                Stream* stream) {
  ASSIGN_OR_RETURN(SimStream * s, node_->Resolve(stream, 0, false));
  sim::DeviceSwitch use(s->device_index());
  ASSIGN_OR_RETURN(std::shared_ptr<std::vector<uint8_t>> from,
                   HostBlock(host, bytes, "CopyFromHostAsync src"));
  ASSIGN_OR_RETURN(std::shared_ptr<Region> to,
                   node_->Range(dst, bytes, s->device_index(), "CopyFromHostAsync dst"));
  s->Enqueue([to, from, dst, host, bytes] { std::memcpy(dst, host, bytes); });
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CollectiveGroup>> SimDaemonDevice::CreateCollectives(
    const CollectiveOptions& options) {
  RETURN_IF_ERROR(Lost("create_collectives"));
  if (node_->options().stall_at == "create_collectives") {
    std::fprintf(stderr, "event=sim_stall point=create_collectives generation=%llu\n",
                 static_cast<unsigned long long>(options.generation));
    std::fflush(stderr);
    const absl::Time deadline = MonotonicNow() + options.timeout;
    while (true) {
      if (options.cancelled && options.cancelled()) {
        return absl::CancelledError("communicator init cancelled (simulated peer never joined)");
      }
      if (MonotonicNow() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("communicator init: a simulated peer never joined within ",
                         absl::FormatDuration(options.timeout)));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  std::vector<int> indices;
  for (const DeviceId& d : options.devices) {
    ASSIGN_OR_RETURN(int index, node_->IndexOf(d));
    indices.push_back(index);
  }
  // The simulated creation is all memory work (its waits for other ranks
  // are short in tests): gated as a whole, but after the stall above.
  if (options.enter_memory_work) {
    RETURN_IF_ERROR(options.enter_memory_work("creating communicators"));
  }
  absl::Status check;
  for (int index : indices) {
    check = node_->CheckNoCollective(index, "creating communicators");
    if (!check.ok()) break;
  }
  absl::StatusOr<std::unique_ptr<CollectiveGroup>> group =
      check.ok() ? sim::CreateSimCollectives(options, indices, node_->options().prefix,
                                             SimHost(node_->options()),
                                             node_->options().stall_at == "collective")
                 : absl::StatusOr<std::unique_ptr<CollectiveGroup>>(check);
  if (options.exit_memory_work) options.exit_memory_work();
  if (!group.ok()) return group.status();
  return std::unique_ptr<CollectiveGroup>(
      new sim::CountedCollectives(*std::move(group), node_.get(), indices));
}

absl::Status SimDaemonDevice::Synchronize(Stream* stream, absl::Duration timeout) {
  if (stream == nullptr) return absl::InvalidArgumentError("Synchronize: null stream");
  return node_->Synchronize(stream, timeout);
}

}  // namespace gradsync::gpu
