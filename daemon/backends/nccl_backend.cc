#include "daemon/backends/nccl_backend.h"

#include <algorithm>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/status_code.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

// ncclGetLastError has the detail (which peer, which syscall) that the
// result code lacks; its comm argument is unused by NCCL, so null is fine.
absl::Status NcclError(ncclResult_t result, absl::string_view what, v1::Code code) {
  return MakeError(code, absl::StrCat(what, ": ", ncclGetErrorString(result), " (",
                                      ncclGetLastError(nullptr), ")"));
}

// Non-blocking communicators may answer ncclInProgress to any call.
bool Accepted(ncclResult_t result) { return result == ncclSuccess || result == ncclInProgress; }

// Saves and restores the calling thread's current device, so the backend
// does not change the daemon's device selection behind its back.
class DeviceGuard {
 public:
  DeviceGuard() {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
  }
  ~DeviceGuard() {
    if (saved_ >= 0) cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = -1;
};

// Polling pause: yields first (a small allreduce finishes in microseconds),
// then sleeps up to 1 ms so a long wait does not burn a core.
class Backoff {
 public:
  void Pause() {
    if (++rounds_ <= 64) {
      std::this_thread::yield();
      return;
    }
    absl::SleepFor(absl::Microseconds(std::min<int64_t>(1000, 10LL << std::min(rounds_ - 64, 7))));
  }

 private:
  int rounds_ = 0;
};

}  // namespace

bool ToNcclDataType(DType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DType::kFloat32:
      *out = ncclFloat32;
      return true;
    case DType::kFloat64:
      *out = ncclFloat64;
      return true;
    case DType::kFloat16:
      *out = ncclFloat16;
      return true;
    case DType::kBFloat16:
      *out = ncclBfloat16;
      return true;
  }
  return false;
}

// The state shared by the backends of one local group. Member handles
// (comm, stream, event) are set up before any backend exists; afterwards the
// comms are only touched under mu, because Abort may free them at any time.
class NcclGroupState {
 public:
  struct Member {
    int rank = 0;
    int device = 0;
    ncclComm_t comm = nullptr;  // null once aborted or destroyed
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;
  };

  NcclGroupState(int nranks, uint64_t generation, absl::Duration timeout)
      : nranks_(nranks), generation_(generation), timeout_(timeout) {}
  ~NcclGroupState();

  int nranks() const { return nranks_; }
  uint64_t generation() const { return generation_; }
  absl::Duration timeout() const { return timeout_; }
  std::vector<Member>& members() { return members_; }
  // "rank=R device=D, ..." for messages.
  std::string Describe() const;

  absl::Status CreateStreams();
  absl::Status InitComms(const ncclUniqueId& id);
  absl::Status Allreduce(const std::vector<NcclDeviceBuffer>& buffers,
                         const std::vector<int>& slots, ncclDataType_t type, DType dtype);
  void Abort(const std::string& reason);

 private:
  // Records the first failure and aborts every communicator.
  absl::Status FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbortCommsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finalizes (grouped, polled) and destroys the comms; aborts on failure.
  void TeardownCommsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int nranks_;
  const uint64_t generation_;
  const absl::Duration timeout_;
  std::vector<Member> members_;

  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;  // by Abort(); comms are gone
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // sticky first failure
};

std::string NcclGroupState::Describe() const {
  return absl::StrCat(
      absl::StrJoin(members_, ", ",
                    [](std::string* out, const Member& m) {
                      absl::StrAppend(out, "rank=", m.rank, " device=", m.device);
                    }),
      " of nranks=", nranks_, " generation=", generation_);
}

absl::Status NcclGroupState::CreateStreams() {
  DeviceGuard guard;
  for (Member& m : members_) {
    const std::string where = absl::StrCat("nccl backend rank=", m.rank, " device=", m.device);
    if (cudaError_t err = cudaSetDevice(m.device); err != cudaSuccess) {
      return CudaError(err, absl::StrCat(where, ": cudaSetDevice"));
    }
    // Non-blocking: the daemon's copies on the legacy default stream must
    // not serialize with the collective.
    if (cudaError_t err = cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking);
        err != cudaSuccess) {
      m.stream = nullptr;
      return CudaError(err, absl::StrCat(where, ": cudaStreamCreateWithFlags"));
    }
    if (cudaError_t err = cudaEventCreateWithFlags(&m.event, cudaEventDisableTiming);
        err != cudaSuccess) {
      m.event = nullptr;
      return CudaError(err, absl::StrCat(where, ": cudaEventCreateWithFlags"));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclGroupState::InitComms(const ncclUniqueId& id) {
  DeviceGuard guard;
  absl::MutexLock lock(&mu_);
  const std::string where = absl::StrCat("nccl init of ", Describe());
  absl::Status status;
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    return NcclError(r, absl::StrCat(where, ": ncclGroupStart"), v1::INTERNAL);
  }
  for (Member& m : members_) {
    if (cudaError_t err = cudaSetDevice(m.device); err != cudaSuccess) {
      status = CudaError(err, absl::StrCat(where, ": cudaSetDevice(", m.device, ")"));
      break;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so a dead peer cannot hang init: we poll instead
    ncclResult_t r = ncclCommInitRankConfig(&m.comm, nranks_, id, m.rank, &config);
    if (!Accepted(r)) {
      status = NcclError(r, absl::StrCat(where, ": ncclCommInitRankConfig(rank=", m.rank, ")"),
                         v1::UNAVAILABLE);
      break;
    }
  }
  // The group must be closed even when a call inside it failed.
  if (ncclResult_t r = ncclGroupEnd(); !Accepted(r) && status.ok()) {
    status = NcclError(r, absl::StrCat(where, ": ncclGroupEnd"), v1::UNAVAILABLE);
  }
  for (const Member& m : members_) {
    if (status.ok() && m.comm == nullptr) {
      status = absl::InternalError(absl::StrCat(where, ": no communicator for rank=", m.rank));
    }
  }

  // Init completes in NCCL's background threads; a peer that never arrives
  // leaves it ncclInProgress, hence the deadline.
  const absl::Time deadline = absl::Now() + timeout_;
  Backoff backoff;
  while (status.ok()) {
    bool pending = false;
    for (const Member& m : members_) {
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(m.comm, &async);
      if (r != ncclSuccess) {
        status = NcclError(r, absl::StrCat(where, ": ncclCommGetAsyncError(rank=", m.rank, ")"),
                           v1::INTERNAL);
        break;
      }
      if (async == ncclInProgress) {
        pending = true;
      } else if (async != ncclSuccess) {
        status = NcclError(async, absl::StrCat(where, ": rank=", m.rank), v1::UNAVAILABLE);
        break;
      }
    }
    if (!status.ok() || !pending) break;
    if (absl::Now() >= deadline) {
      status = MakeError(v1::TIMEOUT, absl::StrCat(where, ": not complete after ",
                                                   absl::FormatDuration(timeout_),
                                                   " (a peer rank did not join?)"));
      break;
    }
    // Let an Abort (e.g. the generation ended) interrupt a long init.
    mu_.Unlock();
    backoff.Pause();
    mu_.Lock();
    if (aborted_) {
      status = MakeError(v1::PEER_FAILED, absl::StrCat(where, ": aborted: ", abort_reason_));
    }
  }
  if (!status.ok()) return FailLocked(status);
  return absl::OkStatus();
}

absl::Status NcclGroupState::Allreduce(const std::vector<NcclDeviceBuffer>& buffers,
                                       const std::vector<int>& slots, ncclDataType_t type,
                                       DType dtype) {
  const size_t count = buffers.front().count;
  const std::string what =
      absl::StrCat("nccl allreduce(avg) of ", count, " ", DTypeName(dtype), " (",
                   count * DTypeSize(dtype), " bytes) on ", Describe());
  DeviceGuard guard;
  absl::MutexLock lock(&mu_);
  if (aborted_) return MakeError(v1::PEER_FAILED, absl::StrCat(what, ": aborted: ", abort_reason_));
  if (!failure_.ok()) {
    return MakeError(CodeOf(failure_),
                     absl::StrCat(what, ": backend failed earlier: ", failure_.message()));
  }

  // One group for all local ranks: NCCL needs every local rank's launch
  // before any of them can progress.
  absl::Status status;
  if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
    return FailLocked(NcclError(r, absl::StrCat(what, ": ncclGroupStart"), v1::INTERNAL));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Member& m = members_[slots[i]];
    if (cudaError_t err = cudaSetDevice(m.device); err != cudaSuccess) {
      status = CudaError(err, absl::StrCat(what, ": cudaSetDevice(", m.device, ")"));
      break;
    }
    void* data = buffers[i].data;
    ncclResult_t r = ncclAllReduce(data, data, count, type, ncclAvg, m.comm, m.stream);
    if (!Accepted(r)) {
      status = NcclError(r, absl::StrCat(what, ": ncclAllReduce(rank=", m.rank, ")"),
                         v1::UNAVAILABLE);
      break;
    }
  }
  if (ncclResult_t r = ncclGroupEnd(); !Accepted(r) && status.ok()) {
    status = NcclError(r, absl::StrCat(what, ": ncclGroupEnd"), v1::UNAVAILABLE);
  }
  if (!status.ok()) return FailLocked(status);

  // Two stages per rank: the non-blocking launch completes (async error
  // leaves ncclInProgress; only then may the stream be used), then the
  // kernel completes (the event recorded after it). The async error is
  // checked on every round: a remote failure shows up there, while the
  // kernel would just spin.
  std::vector<char> recorded(buffers.size(), 0);
  const absl::Time deadline = absl::Now() + timeout_;
  Backoff backoff;
  while (true) {
    bool pending = false;
    for (size_t i = 0; i < buffers.size(); ++i) {
      const Member& m = members_[slots[i]];
      const std::string who = absl::StrCat(what, ": rank=", m.rank, " device=", m.device);
      ncclResult_t async = ncclSuccess;
      if (ncclResult_t r = ncclCommGetAsyncError(m.comm, &async); r != ncclSuccess) {
        return FailLocked(NcclError(r, absl::StrCat(who, ": ncclCommGetAsyncError"), v1::INTERNAL));
      }
      if (async == ncclInProgress) {
        pending = true;
        continue;
      }
      if (async != ncclSuccess) return FailLocked(NcclError(async, who, v1::UNAVAILABLE));
      if (!recorded[i]) {
        if (cudaError_t err = cudaSetDevice(m.device); err != cudaSuccess) {
          return FailLocked(CudaError(err, absl::StrCat(who, ": cudaSetDevice")));
        }
        if (cudaError_t err = cudaEventRecord(m.event, m.stream); err != cudaSuccess) {
          return FailLocked(CudaError(err, absl::StrCat(who, ": cudaEventRecord")));
        }
        recorded[i] = 1;
      }
      cudaError_t err = cudaEventQuery(m.event);
      if (err == cudaErrorNotReady) {
        pending = true;
      } else if (err != cudaSuccess) {
        return FailLocked(CudaError(err, absl::StrCat(who, ": cudaEventQuery")));
      }
    }
    if (!pending) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return FailLocked(MakeError(
          v1::TIMEOUT, absl::StrCat(what, ": not complete after ", absl::FormatDuration(timeout_),
                                    " (a peer rank is dead or stuck?)")));
    }
    // Unlocked while pausing, so Abort can get in.
    mu_.Unlock();
    backoff.Pause();
    mu_.Lock();
    if (aborted_) {
      return MakeError(v1::PEER_FAILED, absl::StrCat(what, ": aborted: ", abort_reason_));
    }
  }
}

absl::Status NcclGroupState::FailLocked(absl::Status status) {
  if (failure_.ok()) failure_ = status;
  spdlog::error("event=nccl_failed group=\"{}\" code={} error=\"{}\"", Describe(),
                v1::Code_Name(CodeOf(status)), std::string(status.message()));
  // After an async error or timeout the comms are unusable (NCCL requires an
  // abort), and aborting also stops our kernels spinning on a dead peer.
  AbortCommsLocked();
  return status;
}

void NcclGroupState::AbortCommsLocked() {
  for (Member& m : members_) {
    if (m.comm == nullptr) continue;
    if (ncclResult_t r = ncclCommAbort(m.comm); r != ncclSuccess) {
      spdlog::warn("event=nccl_abort_failed rank={} device={} error=\"{}\"", m.rank, m.device,
                   ncclGetErrorString(r));
    }
    m.comm = nullptr;  // invalid after ncclCommAbort whatever it returned
  }
}

void NcclGroupState::Abort(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  if (failure_.ok()) {
    failure_ = MakeError(v1::PEER_FAILED, absl::StrCat("nccl ", Describe(), " aborted: ", reason));
  }
  spdlog::warn("event=nccl_abort group=\"{}\" reason=\"{}\"", Describe(), reason);
  AbortCommsLocked();
}

void NcclGroupState::TeardownCommsLocked() {
  bool any = false;
  for (const Member& m : members_) any = any || m.comm != nullptr;
  if (!any) return;
  // Finalize may synchronize with the other local ranks, so all of them are
  // finalized in one group (one thread owns them), then polled.
  bool ok = ncclGroupStart() == ncclSuccess;
  if (ok) {
    for (const Member& m : members_) {
      if (m.comm != nullptr && !Accepted(ncclCommFinalize(m.comm))) ok = false;
    }
    if (!Accepted(ncclGroupEnd())) ok = false;
  }
  const absl::Time deadline = absl::Now() + timeout_;
  Backoff backoff;
  while (ok) {
    bool pending = false;
    for (const Member& m : members_) {
      if (m.comm == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(m.comm, &async) != ncclSuccess ||
          (async != ncclSuccess && async != ncclInProgress)) {
        ok = false;
        break;
      }
      pending = pending || async == ncclInProgress;
    }
    if (!ok || !pending) break;
    if (absl::Now() >= deadline) {
      ok = false;
      break;
    }
    backoff.Pause();
  }
  if (!ok) {
    spdlog::warn("event=nccl_finalize_failed group=\"{}\" error=\"{}\"", Describe(),
                 ncclGetLastError(nullptr));
    AbortCommsLocked();
    return;
  }
  for (Member& m : members_) {
    if (m.comm == nullptr) continue;
    if (ncclResult_t r = ncclCommDestroy(m.comm); r != ncclSuccess) {
      spdlog::warn("event=nccl_destroy_failed rank={} error=\"{}\"", m.rank, ncclGetErrorString(r));
    }
    m.comm = nullptr;
  }
}

NcclGroupState::~NcclGroupState() {
  DeviceGuard guard;
  {
    absl::MutexLock lock(&mu_);
    TeardownCommsLocked();
  }
  // After the comms: finalize may still flush work queued on these streams.
  for (Member& m : members_) {
    if (m.stream == nullptr && m.event == nullptr) continue;
    if (cudaSetDevice(m.device) != cudaSuccess) continue;
    if (m.event != nullptr) cudaEventDestroy(m.event);
    if (m.stream != nullptr) cudaStreamDestroy(m.stream);
  }
}

namespace {

absl::Status ValidateOptions(const std::vector<NcclBackendOptions>& options, int device_count) {
  if (options.empty()) return absl::InvalidArgumentError("nccl backend: no local ranks");
  const NcclBackendOptions& first = options.front();
  if (first.nranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend: nranks=", first.nranks, " must be >= 1"));
  }
  if (first.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl backend: timeout must be positive");
  }
  if (options.size() > static_cast<size_t>(first.nranks)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl backend: ", options.size(),
                                                   " local ranks but nranks=", first.nranks));
  }
  std::set<int> ranks, devices;
  for (const NcclBackendOptions& o : options) {
    if (o.nranks != first.nranks || o.generation != first.generation ||
        o.timeout != first.timeout || o.store != first.store || o.key_prefix != first.key_prefix) {
      return absl::InvalidArgumentError(
          "nccl backend: local ranks disagree on nranks/generation/timeout/store/key_prefix");
    }
    if (o.rank < 0 || o.rank >= o.nranks) {
      return absl::InvalidArgumentError(absl::StrCat("nccl backend: rank=", o.rank,
                                                     " is out of range [0, ", o.nranks, ")"));
    }
    if (o.device < 0 || o.device >= device_count) {
      return absl::InvalidArgumentError(absl::StrCat("nccl backend: device=", o.device,
                                                     " but ", device_count, " visible devices"));
    }
    if (!ranks.insert(o.rank).second) {
      return absl::InvalidArgumentError(absl::StrCat("nccl backend: rank ", o.rank, " twice"));
    }
    // NCCL refuses two ranks of one communicator on the same GPU.
    if (!devices.insert(o.device).second) {
      return absl::InvalidArgumentError(absl::StrCat("nccl backend: device ", o.device, " twice"));
    }
  }
  return absl::OkStatus();
}

// Rank 0's group publishes the id; everyone else waits for it. Hex, because
// the store's values travel as text.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(const std::vector<NcclBackendOptions>& options) {
  const NcclBackendOptions& first = options.front();
  const std::string key = first.key_prefix + "nccl_id";
  const bool has_rank0 = std::any_of(options.begin(), options.end(),
                                     [](const NcclBackendOptions& o) { return o.rank == 0; });
  const bool has_all = options.size() == static_cast<size_t>(first.nranks);
  ncclUniqueId id;
  if (has_rank0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, "nccl backend: ncclGetUniqueId", v1::UNAVAILABLE);
    }
    if (!has_all) {
      if (first.store == nullptr) {
        return absl::InvalidArgumentError("nccl backend: no rendezvous store for the unique id");
      }
      const std::string value =
          absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal)));
      if (absl::Status s = first.store->Set(key, value); !s.ok()) {
        return MakeError(CodeOf(s), absl::StrCat("nccl backend: publishing '", key,
                                                 "': ", s.message()));
      }
    }
    return id;
  }
  if (first.store == nullptr) {
    return absl::InvalidArgumentError("nccl backend: no rendezvous store for the unique id");
  }
  if (absl::Status s = first.store->Wait({key}, first.timeout); !s.ok()) {
    return MakeError(CodeOf(s), absl::StrCat("nccl backend: waiting for '", key,
                                             "' from rank 0: ", s.message()));
  }
  absl::StatusOr<std::optional<std::string>> value = first.store->Get(key);
  if (!value.ok()) {
    return MakeError(CodeOf(value.status()), absl::StrCat("nccl backend: reading '", key,
                                                          "': ", value.status().message()));
  }
  if (!value->has_value()) {
    return MakeError(v1::STATE, absl::StrCat("nccl backend: '", key, "' vanished after Wait"));
  }
  const std::string bytes = absl::HexStringToBytes(**value);
  if (bytes.size() != sizeof(id.internal) || (*value)->size() != 2 * sizeof(id.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl backend: '", key, "' is not a ", sizeof(id.internal), "-byte id"));
  }
  std::copy(bytes.begin(), bytes.end(), id.internal);
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::Create(
    const NcclBackendOptions& options) {
  absl::StatusOr<std::vector<std::unique_ptr<NcclBackend>>> group = CreateLocalGroup({options});
  if (!group.ok()) return group.status();
  return std::move(group->front());
}

absl::StatusOr<std::vector<std::unique_ptr<NcclBackend>>> NcclBackend::CreateLocalGroup(
    const std::vector<NcclBackendOptions>& options) {
  int device_count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&device_count); err != cudaSuccess) {
    return MakeError(v1::UNAVAILABLE,
                     absl::StrCat("nccl backend: cudaGetDeviceCount: ", cudaGetErrorName(err),
                                  " (", cudaGetErrorString(err), ")"));
  }
  if (absl::Status s = ValidateOptions(options, device_count); !s.ok()) return s;

  const NcclBackendOptions& first = options.front();
  auto group = std::make_shared<NcclGroupState>(first.nranks, first.generation, first.timeout);
  for (const NcclBackendOptions& o : options) {
    NcclGroupState::Member m;
    m.rank = o.rank;
    m.device = o.device;
    group->members().push_back(m);
  }
  // On any error below, `group`'s destructor releases what was created.
  if (absl::Status s = group->CreateStreams(); !s.ok()) return s;
  absl::StatusOr<ncclUniqueId> id = ExchangeUniqueId(options);
  if (!id.ok()) return id.status();
  if (absl::Status s = group->InitComms(*id); !s.ok()) return s;

  spdlog::info("event=nccl_connected group=\"{}\"", group->Describe());
  std::vector<std::unique_ptr<NcclBackend>> backends;
  for (size_t i = 0; i < options.size(); ++i) {
    backends.push_back(
        std::unique_ptr<NcclBackend>(new NcclBackend(group, static_cast<int>(i), options[i])));
  }
  return backends;
}

NcclBackend::NcclBackend(std::shared_ptr<NcclGroupState> group, int index,
                         const NcclBackendOptions& options)
    : group_(std::move(group)),
      index_(index),
      rank_(options.rank),
      nranks_(options.nranks),
      device_(options.device),
      generation_(options.generation) {}

// The group's comms and streams go with its last backend (~NcclGroupState).
NcclBackend::~NcclBackend() = default;

cudaStream_t NcclBackend::stream() const { return group_->members()[index_].stream; }

void NcclBackend::Abort(const std::string& reason) { group_->Abort(reason); }

absl::Status NcclBackend::AllreduceAvg(void* data, size_t count, DType dtype) {
  return GroupAllreduceAvg({NcclDeviceBuffer{this, data, count}}, dtype);
}

absl::Status NcclBackend::GroupAllreduceAvg(const std::vector<NcclDeviceBuffer>& buffers,
                                            DType dtype) {
  ncclDataType_t type;
  if (!IsValidDType(static_cast<int32_t>(dtype)) || !ToNcclDataType(dtype, &type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl allreduce: invalid dtype ", static_cast<int32_t>(dtype)));
  }
  if (buffers.empty()) return absl::InvalidArgumentError("nccl allreduce: no buffers");
  NcclGroupState* group = nullptr;
  std::vector<int> slots;
  std::set<int> seen;
  for (const NcclDeviceBuffer& b : buffers) {
    if (b.backend == nullptr) return absl::InvalidArgumentError("nccl allreduce: null backend");
    if (group == nullptr) group = b.backend->group_.get();
    if (b.backend->group_.get() != group) {
      return absl::InvalidArgumentError("nccl allreduce: backends of different local groups");
    }
    if (!seen.insert(b.backend->index_).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl allreduce: two buffers for rank ", b.backend->rank_));
    }
    if (b.count != buffers.front().count) {
      return absl::InvalidArgumentError("nccl allreduce: buffers differ in count");
    }
    if (b.count > 0 && b.data == nullptr) {
      return absl::InvalidArgumentError("nccl allreduce: null buffer");
    }
    slots.push_back(b.backend->index_);
  }
  // A local rank left out would make every peer wait for it until timeout.
  if (buffers.size() != group->members().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl allreduce: ", buffers.size(), " buffers for ",
                     group->members().size(), " local ranks (every local rank must take part)"));
  }
  // Every rank sees the same count, so every rank skips consistently.
  if (buffers.front().count == 0) return absl::OkStatus();
  return group->Allreduce(buffers, slots, type, dtype);
}

}  // namespace gradsync
