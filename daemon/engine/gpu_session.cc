#include "daemon/engine/gpu_session.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// fetch(key) until `deadline`, in slices so that `cancelled` is seen
// promptly whatever the store's own wait does; CANCELLED once it is set.
absl::StatusOr<std::string> FetchCancellable(
    const std::function<absl::StatusOr<std::string>(const std::string&, absl::Time)>& fetch,
    const std::string& key, absl::Time deadline, const std::function<bool()>& cancelled,
    uint64_t generation) {
  constexpr absl::Duration kSlice = absl::Milliseconds(200);
  while (true) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(
          absl::StrCat("opening the GPU path of generation ", generation,
                       " was cancelled (the job failed) while waiting for '", key, "'"));
    }
    const absl::Time now = MonotonicNow();
    const absl::Time until = std::min(deadline, now + kSlice);
    absl::StatusOr<std::string> value = fetch(key, until);
    if (value.ok() || until >= deadline) return value;
    // Not there yet: the store's "not yet" answers; anything else is final.
    if (CodeOf(value.status()) != v1::TIMEOUT &&
        value.status().code() != absl::StatusCode::kDeadlineExceeded &&
        value.status().code() != absl::StatusCode::kNotFound) {
      return value;
    }
    const absl::Time after = MonotonicNow();
    if (after < until) absl::SleepFor(std::min(absl::Milliseconds(20), until - after));
  }
}

// How a node's trainers registered their CUDA gradients, as published.
std::string RegistrationName(bool flat) {
  return flat ? "the daemon's flat buffer (every cuda_ptr NULL)"
              : "their own allocations (every cuda_ptr set)";
}

// A node's published registration: its mode ("flat" or "user") and name.
struct Registration {
  std::string mode;
  std::string node;
};

// Published before the node's GPU count, which the caller already read; a
// node that published none (an older daemon) is not compared.
std::optional<Registration> FetchRegistration(const GpuSession::WorldInput& world, int place) {
  absl::StatusOr<std::string> value =
      world.fetch(absl::StrCat("gpu_registration/", place), MonotonicNow() + absl::Seconds(1));
  if (!value.ok()) return std::nullopt;
  const size_t bar = value->find('|');
  if (bar == std::string::npos) return std::nullopt;
  return Registration{value->substr(0, bar), value->substr(bar + 1)};
}

// Each bucket's collective spans the flat buffer's padded range in one
// mode and the tensors' bytes alone in the other: nodes registering
// differently would launch collectives of different sizes (undefined
// behaviour in NCCL). Every node compares every node's mode with the
// first member's, so all fail alike: MISMATCH naming both, before any
// communicator is created.
absl::Status CompareRegistrations(const GpuSession::WorldInput& world) {
  const std::optional<Registration> first = FetchRegistration(world, 0);
  if (!first) return absl::OkStatus();
  for (int n = 1; n < world.num_nodes; ++n) {
    const std::optional<Registration> other = FetchRegistration(world, n);
    if (!other || other->mode == first->mode) continue;
    return MakeError(
        v1::MISMATCH,
        absl::StrCat(other->node, "'s trainers registered their CUDA gradients as ",
                     RegistrationName(other->mode == "flat"), " but ", first->node, "'s as ",
                     RegistrationName(first->mode == "flat"),
                     ": every node of a job must register the same way (the collectives' sizes "
                     "follow it)"));
  }
  return absl::OkStatus();
}

// Several nodes: one NCCL rank per GPU of every node, nodes in rank order.
// Each node tells the others how many GPUs its trainers use (`local_gpus`)
// and learns theirs, which places this node's ranks in `o`; and how its
// trainers registered (`flat`), compared across nodes.
absl::Status ExchangeGpuCounts(const GpuSession::WorldInput& world, size_t local_gpus, bool flat,
                               gpu::CollectiveOptions& o) {
  if (absl::Status st = world.publish(absl::StrCat("gpu_registration/", world.node_rank),
                                      absl::StrCat(flat ? "flat" : "user", "|", world.node_name));
      !st.ok()) {
    return MakeError(
        CodeOf(st), absl::StrCat("publishing how this node's trainers registered: ", st.message()));
  }
  if (absl::Status st =
          world.publish(absl::StrCat("gpus/", world.node_rank), std::to_string(local_gpus));
      !st.ok()) {
    return MakeError(CodeOf(st), absl::StrCat("publishing this node's GPU count: ", st.message()));
  }
  const absl::Time deadline = MonotonicNow() + world.timeout;
  o.nranks = 0;
  for (int n = 0; n < world.num_nodes; ++n) {
    absl::StatusOr<std::string> count = FetchCancellable(
        world.fetch, absl::StrCat("gpus/", n), deadline, world.cancelled, world.generation);
    int gpus = 0;
    if (!count.ok() || !absl::SimpleAtoi(*count, &gpus) || gpus < 1) {
      return MakeError(count.ok() ? v1::INTERNAL : CodeOf(count.status()),
                       absl::StrCat("node ", n, "'s GPU count: ",
                                    count.ok() ? absl::StrCat("'", *count, "'")
                                               : std::string(count.status().message())));
    }
    if (n < world.node_rank) o.first_rank += gpus;
    o.nranks += gpus;
  }
  RETURN_IF_ERROR(CompareRegistrations(world));
  o.publish = world.publish;
  o.fetch = world.fetch;
  return absl::OkStatus();
}

// One node: every rank is here, so the unique id never leaves the process.
void UseInProcessExchange(gpu::CollectiveOptions& o) {
  auto store = std::make_shared<std::map<std::string, std::string>>();
  auto store_mu = std::make_shared<std::mutex>();
  o.publish = [store, store_mu](const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(*store_mu);
    if (!store->emplace(key, value).second) {
      return MakeError(v1::INTERNAL, absl::StrCat("unique id key ", key, " published twice"));
    }
    return absl::OkStatus();
  };
  o.fetch = [store, store_mu](const std::string& key, absl::Time) -> absl::StatusOr<std::string> {
    std::lock_guard<std::mutex> lock(*store_mu);
    auto it = store->find(key);
    if (it == store->end()) {
      return MakeError(v1::INTERNAL, absl::StrCat("unique id key ", key, " was never published"));
    }
    return it->second;
  };
}

}  // namespace

void ExitIfDeviceLost(const std::function<bool(const absl::Status&)>& is_context_lost,
                      const absl::Status& device_error, const std::string& where) {
  if (device_error.ok()) return;
  if (!gpu::IsDeviceLost(device_error) && !(is_context_lost && is_context_lost(device_error))) {
    return;
  }
  spdlog::critical("event=device_context_lost where={} error={} exit_code={}", LogValue(where),
                   LogValue(device_error.message()), kDeviceLostExitCode);
  spdlog::shutdown();
  std::_Exit(kDeviceLostExitCode);
}

absl::StatusOr<GpuTrainerSpec> GpuTrainerSpecFromProto(const v1::RegisterRequest& req) {
  const v1::CudaRegistration& c = req.cuda();
  auto bad = [](const std::string& m) { return MakeError(v1::INVALID_ARGUMENT, m); };
  GpuTrainerSpec s;
  s.device = c.device_id();
  if (s.device.empty()) return bad("a CUDA registration must name its GPU (device_id)");
  if (c.mode() != v1::CudaRegistration::FLAT_BUFFER &&
      c.mode() != v1::CudaRegistration::USER_POINTER) {
    return bad(absl::StrCat("unknown CUDA registration mode ", c.mode()));
  }
  s.flat = c.mode() == v1::CudaRegistration::FLAT_BUFFER;
  for (const std::string& h : c.allocation_handles()) {
    absl::StatusOr<gpu::IpcHandle> handle = gpu::IpcHandle::FromBytes(h);
    if (!handle.ok()) return bad(absl::StrCat("allocation handle: ", handle.status().message()));
    s.allocations.push_back(*handle);
  }
  if (s.flat && !s.allocations.empty()) {
    return bad("a flat-buffer registration sends no allocation handles");
  }
  if (c.event_handles_size() < 1 ||
      static_cast<size_t>(c.event_handles_size()) > kMaxReadyEventSlots) {
    return bad(absl::StrCat("a CUDA registration sends 1 to ", kMaxReadyEventSlots,
                            " readiness event handles (a pool shared by the tensors), not ",
                            c.event_handles_size()));
  }
  for (int k = 0; k < c.event_handles_size(); ++k) {
    absl::StatusOr<gpu::IpcHandle> event = gpu::IpcHandle::FromBytes(c.event_handles(k));
    if (!event.ok()) {
      return bad(absl::StrCat("readiness event handle ", k, ": ", event.status().message()));
    }
    s.events.push_back(*event);
  }
  for (int i = 0; i < req.tensors_size(); ++i) {
    const v1::TensorSpec& t = req.tensors(i);
    const v1::CudaBuffer& b = t.cuda();
    if (!b.mem_handle().empty() || !b.event_handle().empty()) {
      return bad(absl::StrCat("tensor ", i, " '", t.name(),
                              "': ", b.mem_handle().empty() ? "event_handle" : "mem_handle",
                              " is unused; send allocation and event handles in "
                              "CudaRegistration"));
    }
    if (!s.flat && b.allocation() >= s.allocations.size()) {
      return bad(absl::StrCat("tensor ", i, " '", t.name(), "': allocation ", b.allocation(),
                              " of ", s.allocations.size(), " sent"));
    }
    s.allocation.push_back(b.allocation());
    s.offset.push_back(b.offset());
  }
  return s;
}

// The current generation's communicators behind one object that outlives
// them: Reform replaces them while the scheduler and gs_broadcast keep the
// reference collectives() gave them, and a call in flight holds its
// generation's group until it returns.
class GpuSession::CurrentGroup final : public gpu::CollectiveGroup {
 public:
  absl::Status AllreduceSum(const std::vector<gpu::DeviceBuffer>& buffers, DType dtype) override {
    std::shared_ptr<gpu::CollectiveGroup> group = Get();
    if (!group) return Missing();
    return group->AllreduceSum(buffers, dtype);
  }
  absl::Status Broadcast(const std::vector<gpu::DeviceBuffer>& buffers, int root) override {
    std::shared_ptr<gpu::CollectiveGroup> group = Get();
    if (!group) return Missing();
    return group->Broadcast(buffers, root);
  }
  void Abort(const std::string& reason) override {
    if (std::shared_ptr<gpu::CollectiveGroup> group = Get()) group->Abort(reason);
  }
  void Install(std::unique_ptr<gpu::CollectiveGroup> group) {
    std::lock_guard<std::mutex> lock(mu_);
    group_ = std::move(group);
  }
  std::shared_ptr<gpu::CollectiveGroup> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(group_);
  }

 private:
  std::shared_ptr<gpu::CollectiveGroup> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return group_;
  }
  static absl::Status Missing() {
    return absl::UnavailableError(
        "no communicators: the previous generation's were destroyed and the survivors' were "
        "not created");
  }

  std::mutex mu_;
  std::shared_ptr<gpu::CollectiveGroup> group_;
};

GpuSession::GpuSession(gpu::DaemonDevice* device)
    : device_(device), collectives_(std::make_unique<CurrentGroup>()) {}

absl::StatusOr<std::unique_ptr<GpuSession>> GpuSession::Open(
    gpu::DaemonDevice* device, const Layout& layout, const ipc::ArenaLayout& flat_plan,
    const std::vector<TrainerInput>& trainers, const WorldInput& world) {
  std::unique_ptr<GpuSession> s(new GpuSession(device));
  s->is_context_lost_ = world.is_context_lost;
  s->flat_bytes_ = flat_plan.total_bytes;
  s->flat_ = trainers.empty() || trainers[0].spec->flat;
  // Built up as we go: on an error the destructor releases what was opened.
  for (const TrainerInput& in : trainers) {
    RETURN_IF_ERROR(s->OpenTrainer(in, trainers[0].name, layout, flat_plan));
  }
  RETURN_IF_ERROR(s->CreateStreams());
  RETURN_IF_ERROR(s->AllocNonFiniteMemory());
  ASSIGN_OR_RETURN(const gpu::CollectiveOptions o, s->CollectiveOptionsFor(world));
  RETURN_IF_ERROR(s->CreateCollectives(o, world.generation));
  s->first_rank_.store(o.first_rank, std::memory_order_release);
  s->nranks_.store(o.nranks, std::memory_order_release);
  s->generation_ = world.generation;
  spdlog::info(
      "event=gpu_session_open device={} mode={} trainers={} gpus={} first_rank={} "
      "nranks={} flat_bytes={} tensors={} events_opened={}",
      device->name(), s->flat_ ? "flat_buffer" : "user_pointer", s->trainers_.size(),
      s->devices_.size(), o.first_rank, o.nranks, s->flat_bytes_, layout.size(),
      s->events_opened());
  return s;
}

absl::Status GpuSession::SetupError(const absl::Status& st, const std::string& what) const {
  ExitIfDeviceLost(is_context_lost_, st, what);
  return MakeError(CodeOf(st) == v1::INVALID_ARGUMENT ? v1::INVALID_ARGUMENT : v1::INTERNAL,
                   absl::StrCat(what, ": ", st.message()));
}

absl::Status GpuSession::OpenTrainer(const TrainerInput& in, const std::string& first_name,
                                     const Layout& layout, const ipc::ArenaLayout& flat_plan) {
  const GpuTrainerSpec& spec = *in.spec;
  if (spec.flat != flat_) {
    return MakeError(v1::MISMATCH,
                     absl::StrCat(in.name, " registered ", spec.flat ? "without" : "with",
                                  " cuda_ptr, ", first_name, " ", flat_ ? "without" : "with",
                                  ": every trainer of a job uses the same mode"));
  }
  if (spec.allocation.size() != layout.size()) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(in.name, " sent ", spec.allocation.size(), " CUDA buffers for ",
                                  layout.size(), " tensors"));
  }
  if (absl::Status st = device_->CheckDevice(spec.device); !st.ok()) {
    return SetupError(st, absl::StrCat(in.name, "'s GPU ", spec.device));
  }
  // In trainers_ before anything is opened for it, so that the destructor
  // releases whatever a failing step below leaves opened.
  PerTrainer& p = trainers_.emplace_back();
  p.name = in.name;
  p.device = spec.device;
  auto known = std::find(devices_.begin(), devices_.end(), spec.device);
  p.device_index = static_cast<int>(known - devices_.begin());
  if (known == devices_.end()) devices_.push_back(spec.device);
  p.tensors.assign(layout.size(), nullptr);

  if (flat_) {
    RETURN_IF_ERROR(AllocFlatBuffer(p, layout, flat_plan));
  } else {
    RETURN_IF_ERROR(OpenAllocations(p, spec));
    RETURN_IF_ERROR(PlaceUserTensors(p, spec, layout));
  }
  RETURN_IF_ERROR(OpenEvents(p, spec));
  p.slot_of_tensor.assign(layout.size(), 0);
  return absl::OkStatus();
}

absl::Status GpuSession::AllocFlatBuffer(PerTrainer& p, const Layout& layout,
                                         const ipc::ArenaLayout& flat_plan) {
  // The daemon owns the trainer's gradients: nothing of the trainer's
  // is ever mapped here, so nothing of it must outlive us.
  absl::StatusOr<void*> base = device_->Alloc(p.device, flat_bytes_);
  if (!base.ok()) {
    return SetupError(base.status(), absl::StrCat("allocating the ", flat_bytes_,
                                                  "-byte gradient buffer of ", p.name));
  }
  p.flat_base = static_cast<uint8_t*>(*base);
  absl::StatusOr<gpu::IpcHandle> h = device_->ExportMemory(p.device, p.flat_base);
  if (!h.ok()) return SetupError(h.status(), absl::StrCat("exporting ", p.name, "'s buffer"));
  p.flat_handle = *h;
  for (size_t i = 0; i < layout.size(); ++i) {
    p.tensors[i] = p.flat_base + flat_plan.tensor_offsets[i];
  }
  return absl::OkStatus();
}

absl::Status GpuSession::OpenAllocations(PerTrainer& p, const GpuTrainerSpec& spec) {
  // Opened once per registration, on the trainer's GPU (by UUID).
  for (size_t a = 0; a < spec.allocations.size(); ++a) {
    absl::StatusOr<void*> base = device_->OpenMemory(p.device, spec.allocations[a]);
    if (!base.ok()) {
      return SetupError(base.status(), absl::StrCat("opening allocation ", a, " of ", p.name));
    }
    p.opened.push_back(*base);
  }
  return absl::OkStatus();
}

absl::Status GpuSession::PlaceUserTensors(PerTrainer& p, const GpuTrainerSpec& spec,
                                          const Layout& layout) {
  // Each tensor must lie inside its mapped allocation, aligned for its
  // dtype: a byte outside would be an illegal address in the daemon's
  // kernels — a sticky error that ends every job on the node.
  std::vector<uint64_t> sizes;
  for (size_t a = 0; a < p.opened.size(); ++a) {
    absl::StatusOr<uint64_t> size = device_->MappedSize(p.device, p.opened[a]);
    if (!size.ok()) {
      return SetupError(size.status(), absl::StrCat("the size of allocation ", a, " of ", p.name));
    }
    sizes.push_back(*size);
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    const uint64_t align = DTypeSize(layout[i].dtype);
    const uint64_t offset = spec.offset[i], bytes = layout[i].bytes();
    const uint64_t size = sizes[spec.allocation[i]];
    if (offset % align != 0) {
      return MakeError(v1::INVALID_ARGUMENT,
                       absl::StrCat(p.name, "'s tensor ", i, " '", layout[i].name, "': offset ",
                                    offset, " in allocation ", spec.allocation[i],
                                    " is not aligned to its dtype's ", align, " bytes"));
    }
    if (offset > size || bytes > size - offset) {
      return MakeError(v1::INVALID_ARGUMENT,
                       absl::StrCat(p.name, "'s tensor ", i, " '", layout[i].name, "': bytes [",
                                    offset, ", ", offset + bytes, ") lie outside allocation ",
                                    spec.allocation[i], " (", size, " bytes mapped)"));
    }
    p.tensors[i] = static_cast<uint8_t*>(p.opened[spec.allocation[i]]) + offset;
  }
  return absl::OkStatus();
}

absl::Status GpuSession::OpenEvents(PerTrainer& p, const GpuTrainerSpec& spec) {
  // The pool, not one event per tensor (GpuTrainerSpec::events).
  for (size_t k = 0; k < spec.events.size(); ++k) {
    absl::StatusOr<gpu::Event*> e = device_->OpenEvent(p.device, spec.events[k]);
    if (!e.ok()) {
      return SetupError(e.status(), absl::StrCat("opening ", p.name, "'s readiness event ", k,
                                                 " of ", spec.events.size()));
    }
    p.events.push_back(*e);
  }
  return absl::OkStatus();
}

absl::Status GpuSession::CreateStreams() {
  for (const gpu::DeviceId& d : devices_) {
    absl::StatusOr<gpu::Stream*> stream = device_->CreateStream(d);
    if (!stream.ok()) return SetupError(stream.status(), absl::StrCat("a stream on ", d));
    streams_.push_back(*stream);
    staging_.push_back(nullptr);
    kept_sums_.push_back(nullptr);
    kept_result_.push_back(nullptr);
  }
  return absl::OkStatus();
}

absl::Status GpuSession::AllocNonFiniteMemory() {
  for (size_t d = 0; d < devices_.size(); ++d) {
    // Zeroed by Alloc: no bucket's token is 0.
    absl::StatusOr<void*> flag = device_->Alloc(devices_[d], sizeof(uint32_t));
    if (!flag.ok()) {
      return SetupError(flag.status(), absl::StrCat("the non-finite flag on ", devices_[d]));
    }
    nonfinite_flags_.push_back(static_cast<uint32_t*>(*flag));
  }
  if (devices_.empty()) return absl::OkStatus();
  // 8-byte aligned pieces: flags, probe, NaN, then the search window.
  const size_t flags_bytes = (devices_.size() * sizeof(uint32_t) + 7) / 8 * 8;
  absl::StatusOr<void*> host = device_->AllocHost(devices_[0], flags_bytes + 16 + kSearchBytes);
  if (!host.ok()) return SetupError(host.status(), "host memory for the non-finite check");
  host_memory_ = *host;
  auto* base = static_cast<uint8_t*>(host_memory_);
  host_window_.flags = reinterpret_cast<uint32_t*>(base);
  host_window_.probe = base + flags_bytes;
  host_window_.nan = base + flags_bytes + 8;
  host_window_.search = base + flags_bytes + 16;
  return absl::OkStatus();
}

absl::StatusOr<gpu::CollectiveOptions> GpuSession::CollectiveOptionsFor(
    const WorldInput& world) const {
  gpu::CollectiveOptions o;
  o.nranks = static_cast<int>(devices_.size());
  o.first_rank = 0;
  o.devices = devices_;
  o.generation = world.generation;
  o.timeout = world.timeout;
  if (world.num_nodes > 1) {
    RETURN_IF_ERROR(ExchangeGpuCounts(world, devices_.size(), flat_, o));
  } else {
    UseInProcessExchange(o);
  }
  // Polled through the unique id exchange, init and warm-up: a job that
  // fails meanwhile is answered now, not after `timeout`.
  o.cancelled = world.cancelled;
  return o;
}

absl::Status GpuSession::CreateCollectives(const gpu::CollectiveOptions& o, uint64_t generation) {
  absl::StatusOr<std::unique_ptr<gpu::CollectiveGroup>> group = device_->CreateCollectives(o);
  if (!group.ok()) {
    ExitIfDeviceLost(is_context_lost_, group.status(),
                     absl::StrCat("creating the communicators of generation ", generation));
    return MakeError(
        CodeOf(group.status()) == v1::INVALID_ARGUMENT ? v1::INTERNAL : CodeOf(group.status()),
        absl::StrCat("creating the communicators of generation ", generation, " over ",
                     devices_.size(), " GPUs: ", group.status().message()));
  }
  collectives_->Install(std::move(*group));
  return absl::OkStatus();
}

gpu::CollectiveGroup& GpuSession::collectives() { return *collectives_; }

void GpuSession::AbortCollectives(const std::string& reason) { collectives_->Abort(reason); }

absl::Status GpuSession::Reform(const WorldInput& world) {
  const std::string what = absl::StrCat("re-forming the GPU communicators of generation ",
                                        generation_, " as generation ", world.generation);
  // NCCL: abort the whole old group and let its destruction finish before
  // the next is created. Its destructor is bounded (gpu/nccl_collectives.h:
  // an ncclCommAbort that overruns kAbortDeadline exits the daemon).
  if (std::shared_ptr<gpu::CollectiveGroup> old = collectives_->Take()) {
    old->Abort(absl::StrCat("generation ", generation_, " ended: a node died"));
    // A gs_broadcast still inside the old group returns promptly now.
    const absl::Time until = MonotonicNow() + world.timeout;
    while (old.use_count() > 1 && MonotonicNow() < until) absl::SleepFor(absl::Milliseconds(1));
    if (old.use_count() > 1) {
      return MakeError(v1::TIMEOUT, absl::StrCat(what,
                                                 ": a call into the old communicators did "
                                                 "not return within the timeout"));
    }
    old.reset();
  }
  generation_ = world.generation;
  absl::StatusOr<gpu::CollectiveOptions> o = CollectiveOptionsFor(world);
  if (!o.ok()) return MakeError(CodeOf(o.status()), absl::StrCat(what, ": ", o.status().message()));
  RETURN_IF_ERROR(CreateCollectives(*o, world.generation));
  first_rank_.store(o->first_rank, std::memory_order_release);
  nranks_.store(o->nranks, std::memory_order_release);
  if (aborted()) {
    // The job failed while they were created: they must not run.
    collectives_->Abort("the job failed");
    return absl::CancelledError(absl::StrCat(what, ": the job failed meanwhile"));
  }
  spdlog::warn("event=gpu_session_reformed generation={} gpus={} first_rank={} nranks={}",
               world.generation, devices_.size(), o->first_rank, o->nranks);
  return absl::OkStatus();
}

size_t GpuSession::events_opened() const {
  size_t n = 0;
  for (const PerTrainer& p : trainers_) n += p.events.size();
  return n;
}

absl::Status GpuSession::EnsureStaging(uint64_t bytes) {
  return EnsurePerDevice(staging_, &staging_bytes_, bytes, "staging");
}

absl::Status GpuSession::EnsureKeptSums(uint64_t bytes) {
  return EnsurePerDevice(kept_sums_, &kept_sums_bytes_, bytes, "kept local sums");
}

absl::Status GpuSession::EnsureKeptResult(uint64_t bytes) {
  return EnsurePerDevice(kept_result_, &kept_result_bytes_, bytes, "kept result");
}

absl::Status GpuSession::EnsureInputCopies(uint64_t bytes) {
  if (bytes <= input_copies_bytes_) return absl::OkStatus();
  input_copies_.resize(trainers_.size(), nullptr);
  FreeInputCopies();
  for (size_t t = 0; t < trainers_.size(); ++t) {
    const gpu::DeviceId& device = devices_[trainers_[t].device_index];
    absl::StatusOr<void*> p = device_->Alloc(device, bytes);
    if (!p.ok()) {
      return SetupError(p.status(), absl::StrCat("allocating ", bytes, " bytes of ",
                                                 trainers_[t].name, "'s input copy on ", device));
    }
    input_copies_[t] = static_cast<uint8_t*>(*p);
  }
  input_copies_bytes_ = bytes;
  return absl::OkStatus();
}

void GpuSession::FreeInputCopies() {
  for (size_t t = 0; t < input_copies_.size(); ++t) {
    if (input_copies_[t] == nullptr) continue;
    const gpu::DeviceId& device = devices_[trainers_[t].device_index];
    if (absl::Status st = device_->Free(device, input_copies_[t]); !st.ok()) {
      spdlog::error("event=gpu_release_failed what=free_input_copy device={} error={}",
                    LogValue(device), LogValue(st.message()));
      ExitIfDeviceLost(is_context_lost_, st, "freeing an input copy");
    }
    input_copies_[t] = nullptr;
  }
  input_copies_bytes_ = 0;
}

absl::Status GpuSession::EnsurePerDevice(std::vector<uint8_t*>& buffers, uint64_t* have,
                                         uint64_t bytes, const char* what) {
  if (bytes <= *have) return absl::OkStatus();
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (buffers[d] != nullptr) {
      device_->Free(devices_[d], buffers[d]).IgnoreError();
      buffers[d] = nullptr;
    }
  }
  *have = 0;
  for (size_t d = 0; d < devices_.size(); ++d) {
    absl::StatusOr<void*> p = device_->Alloc(devices_[d], bytes);
    if (!p.ok()) {
      return SetupError(
          p.status(), absl::StrCat("allocating ", bytes, " bytes of ", what, " on ", devices_[d]));
    }
    buffers[d] = static_cast<uint8_t*>(*p);
  }
  *have = bytes;
  return absl::OkStatus();
}

absl::Status GpuSession::EnsureBroadcastSlots(uint64_t slot_bytes) {
  if (!broadcast_slots_.empty()) return absl::OkStatus();
  std::vector<uint8_t*> slots;
  std::vector<gpu::IpcHandle> handles;
  absl::Status failed;
  for (size_t d = 0; d < devices_.size() && failed.ok(); ++d) {
    absl::StatusOr<void*> p = device_->Alloc(devices_[d], 2 * slot_bytes);
    if (!p.ok()) {
      failed = SetupError(p.status(), absl::StrCat("allocating gs_broadcast's ", 2 * slot_bytes,
                                                   " bytes of device staging on ", devices_[d]));
      break;
    }
    slots.push_back(static_cast<uint8_t*>(*p));
    absl::StatusOr<gpu::IpcHandle> h = device_->ExportMemory(devices_[d], *p);
    if (!h.ok()) {
      failed = SetupError(h.status(),
                          absl::StrCat("exporting gs_broadcast's device staging on ", devices_[d]));
      break;
    }
    handles.push_back(*h);
  }
  if (!failed.ok()) {
    // Nobody mapped them yet: the handles were never sent.
    for (size_t d = 0; d < slots.size(); ++d) device_->Free(devices_[d], slots[d]).IgnoreError();
    return failed;
  }
  broadcast_slots_ = std::move(slots);
  broadcast_handles_ = std::move(handles);
  spdlog::info("event=gpu_broadcast_staging gpus={} bytes_per_gpu={}", devices_.size(),
               2 * slot_bytes);
  return absl::OkStatus();
}

void GpuSession::Abort(const std::string& reason) {
  aborted_.store(true, std::memory_order_release);
  if (collectives_) collectives_->Abort(reason);
}

GpuSession::~GpuSession() {
  // The communicators go first: destroying them waits (bounded) for any
  // collective, so no kernel still reads the memory released below.
  collectives_.reset();
  auto report = [this](const absl::Status& st, const char* what, const std::string& whose) {
    if (!st.ok()) {
      spdlog::error("event=gpu_release_failed what={} device={} error={}", what, LogValue(whose),
                    LogValue(st.message()));
      ExitIfDeviceLost(is_context_lost_, st, absl::StrCat("teardown: ", what));
    }
  };
  for (size_t d = 0; d < devices_.size(); ++d) {
    if (staging_.size() > d && staging_[d] != nullptr) {
      report(device_->Free(devices_[d], staging_[d]), "free_staging", devices_[d]);
    }
    if (kept_sums_.size() > d && kept_sums_[d] != nullptr) {
      report(device_->Free(devices_[d], kept_sums_[d]), "free_kept_sums", devices_[d]);
    }
    if (kept_result_.size() > d && kept_result_[d] != nullptr) {
      report(device_->Free(devices_[d], kept_result_[d]), "free_kept_result", devices_[d]);
    }
    if (broadcast_slots_.size() > d) {
      report(device_->Free(devices_[d], broadcast_slots_[d]), "free_broadcast_staging",
             devices_[d]);
    }
    if (nonfinite_flags_.size() > d) {
      report(device_->Free(devices_[d], nonfinite_flags_[d]), "free_nonfinite_flag", devices_[d]);
    }
    if (streams_.size() > d) device_->DestroyStream(streams_[d]);
  }
  if (host_memory_ != nullptr) {
    report(device_->FreeHost(devices_[0], host_memory_), "free_host", devices_[0]);
  }
  FreeInputCopies();
  for (PerTrainer& p : trainers_) Release(p);
}

absl::Status GpuSession::CheckReplacement(size_t t, const GpuTrainerSpec& spec,
                                          const std::string& name, size_t tensors) const {
  if (t >= trainers_.size()) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(name, ": local rank ", t, " has no GPU place in the job"));
  }
  const PerTrainer& p = trainers_[t];
  if (spec.device != p.device) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(name, " registered CUDA tensors on GPU ", spec.device,
                                  ", but its local rank trained on GPU ", p.device,
                                  " in the running job: a restarted trainer rejoins on its "
                                  "predecessor's GPU (the job's NCCL ranks are per GPU)"));
  }
  if (spec.flat != flat_) {
    return MakeError(
        v1::INVALID_ARGUMENT,
        absl::StrCat(name, " registered ", spec.flat ? "without" : "with",
                     " cuda_ptr, but the running job's trainers registered ",
                     flat_ ? "without" : "with", ": every trainer of a job uses the same mode"));
  }
  if (spec.allocation.size() != tensors) {
    return MakeError(v1::INVALID_ARGUMENT, absl::StrCat(name, " sent ", spec.allocation.size(),
                                                        " CUDA buffers for ", tensors, " tensors"));
  }
  return absl::OkStatus();
}

absl::Status GpuSession::ReplaceTrainer(size_t t, const GpuTrainerSpec& spec,
                                        const std::string& name, const Layout& layout) {
  RETURN_IF_ERROR(CheckReplacement(t, spec, name, layout.size()));
  PerTrainer& p = trainers_[t];
  // The predecessor's handles: nothing polls or reads them any more.
  uint8_t* const flat_base = p.flat_base;
  for (gpu::Event*& e : p.events) {
    if (e != nullptr) device_->CloseEvent(e);
  }
  p.events.clear();
  // A mapping of a dead process's memory may fail to close: no fault of
  // the fresh trainer's, so it is logged (as any release) and the
  // replacement goes on, unless the device itself is lost.
  for (void* base : p.opened) {
    if (absl::Status st = device_->CloseMemory(p.device, base); !st.ok()) {
      spdlog::error("event=gpu_release_failed what=close_memory trainer={} error={}",
                    LogValue(p.name), LogValue(st.message()));
      ExitIfDeviceLost(is_context_lost_, st, "closing a dead trainer's allocation");
    }
  }
  p.opened.clear();
  p.name = name;
  if (flat_ && flat_base == nullptr) {
    return MakeError(v1::INTERNAL,
                     absl::StrCat(name, "'s local rank has no flat buffer any more (released)"));
  }
  absl::Status opened = OpenReplacement(p, spec, layout);
  if (!opened.ok()) {
    // Refused: the trainer may free its memory once told, so nothing of
    // it stays mapped here (the flat buffer is the daemon's).
    for (gpu::Event*& e : p.events) {
      if (e != nullptr) device_->CloseEvent(e);
    }
    p.events.clear();
    for (void* base : p.opened) device_->CloseMemory(p.device, base).IgnoreError();
    p.opened.clear();
    if (!flat_) std::fill(p.tensors.begin(), p.tensors.end(), nullptr);
    return opened;
  }
  spdlog::info("event=gpu_trainer_replaced trainer={} device={} mode={} events_opened={}",
               LogValue(name), LogValue(p.device), flat_ ? "flat_buffer" : "user_pointer",
               p.events.size());
  return absl::OkStatus();
}

absl::Status GpuSession::OpenReplacement(PerTrainer& p, const GpuTrainerSpec& spec,
                                         const Layout& layout) {
  if (!flat_) {
    std::fill(p.tensors.begin(), p.tensors.end(), nullptr);
    RETURN_IF_ERROR(OpenAllocations(p, spec));
    RETURN_IF_ERROR(PlaceUserTensors(p, spec, layout));
  }
  RETURN_IF_ERROR(OpenEvents(p, spec));
  p.slot_of_tensor.assign(layout.size(), 0);
  return absl::OkStatus();
}

void GpuSession::ReleaseTrainer(size_t t) {
  if (t < trainers_.size()) Release(trainers_[t]);
}

void GpuSession::Release(PerTrainer& p) {
  auto report = [this, &p](const absl::Status& st, const char* what) {
    if (!st.ok()) {
      spdlog::error("event=gpu_release_failed what={} trainer={} error={}", what, LogValue(p.name),
                    LogValue(st.message()));
      ExitIfDeviceLost(is_context_lost_, st, absl::StrCat("teardown: ", what));
    }
  };
  for (gpu::Event*& e : p.events) {
    if (e != nullptr) device_->CloseEvent(e);
    e = nullptr;
  }
  for (void* base : p.opened) report(device_->CloseMemory(p.device, base), "close_memory");
  p.opened.clear();
  // Invariant (CUDA: freeing memory another process still maps is
  // undefined behaviour): we run only once this trainer left — detached,
  // having unmapped this buffer first (Client::Close), or died, its
  // mappings gone with its process — or before any trainer got the handle
  // (Open failed). A trainer that broke that order is logged here by the
  // device that can tell (the simulation), never crashed on.
  if (p.flat_base != nullptr) report(device_->Free(p.device, p.flat_base), "free_flat_buffer");
  p.flat_base = nullptr;
  std::fill(p.tensors.begin(), p.tensors.end(), nullptr);
}

}  // namespace gradsync
