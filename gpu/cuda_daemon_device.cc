#include "gpu/cuda_daemon_device.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "gpu/cuda_device_switch.h"
#include "gpu/cuda_status.h"
#include "gpu/cuda_uuid.h"
#include "gpu/gated_daemon_device.h"
#include "gpu/local_sum.h"

namespace gradsync::gpu {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == IpcHandle::kSize, "CUDA IPC handle size changed");
static_assert(sizeof(cudaIpcEventHandle_t) == IpcHandle::kSize, "CUDA IPC handle size changed");
static_assert(static_cast<int>(LocalSumType::kFloat32) == static_cast<int>(DType::kFloat32) &&
                  static_cast<int>(LocalSumType::kFloat64) == static_cast<int>(DType::kFloat64) &&
                  static_cast<int>(LocalSumType::kFloat16) == static_cast<int>(DType::kFloat16) &&
                  static_cast<int>(LocalSumType::kBFloat16) == static_cast<int>(DType::kBFloat16),
              "LocalSumType mirrors DType");

// How long Alloc waits for its zeroing memset (a fresh allocation, so only a
// wedged GPU makes this long).
constexpr std::chrono::seconds kAllocZeroTimeout(60);

std::string Describe(cudaError_t err) { return DescribeCudaError(err); }

// Selects `ordinal` for the scope; the previous device comes back only where
// the thread had a context (cuda_device_switch.h).
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) : result_(switch_.Use(ordinal)) {}
  cudaError_t result() const { return result_; }

 private:
  CudaDeviceSwitch switch_;
  const cudaError_t result_;
};

// What Stream* and Event* point to on the daemon side (never gpu::Stream or
// gpu::Event themselves: another implementation may define those).
struct RtStream {
  cudaStream_t stream = nullptr;
  int ordinal = -1;
};
struct RtEvent {
  cudaEvent_t event = nullptr;
  int ordinal = -1;
};

RtStream* Unwrap(Stream* s) { return reinterpret_cast<RtStream*>(s); }
RtEvent* Unwrap(Event* e) { return reinterpret_cast<RtEvent*>(e); }

struct Gpu {
  DeviceId id;
  int ordinal = -1;
  int max_blocks = 0;  // for the local-sum kernel: 8 blocks of 256 per SM
};

class CudaDaemonDevice final : public DaemonDevice {
 public:
  CudaDaemonDevice(CollectiveFactory collectives, std::vector<Gpu> gpus)
      : collectives_(std::move(collectives)), gpus_(std::move(gpus)) {}

  ~CudaDaemonDevice() override {
    absl::MutexLock lock(&mu_);
    // After a sticky error every call fails; do not try.
    if (!poisoned_.ok()) return;
    // The caller's leftovers; no collective can run any more (invariant).
    for (const auto& [base, open] : opened_) {
      DeviceScope scope(open.ordinal);
      cudaIpcCloseMemHandle(base);
    }
    for (RtEvent* e : events_) {
      DeviceScope scope(e->ordinal);
      cudaEventDestroy(e->event);
      delete e;
    }
    for (RtStream* s : streams_) {
      DeviceScope scope(s->ordinal);
      cudaStreamDestroy(s->stream);
      delete s;
    }
    for (const auto& [ptr, ordinal] : allocations_) {
      DeviceScope scope(ordinal);
      cudaFree(ptr);
    }
    for (void* ptr : host_allocations_) cudaFreeHost(ptr);
  }

  std::string name() const override { return "cuda"; }

  absl::Status CheckDevice(const DeviceId& device) override { return Find(device).status(); }

  absl::StatusOr<void*> Alloc(const DeviceId& device, size_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("Alloc of 0 bytes");
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
      return Check(err, absl::StrCat("cudaMalloc(", bytes, " bytes) on GPU ", device));
    }
    // Zeroed before anyone can see it: trainers write through IPC from
    // other contexts, with no ordering against this one, so the memset must
    // have completed when Alloc returns. Polled against a deadline.
    err = cudaMemsetAsync(ptr, 0, bytes, cudaStreamLegacy);
    const auto deadline = std::chrono::steady_clock::now() + kAllocZeroTimeout;
    while (err == cudaSuccess || err == cudaErrorNotReady) {
      err = cudaStreamQuery(cudaStreamLegacy);
      if (err != cudaErrorNotReady) break;
      if (std::chrono::steady_clock::now() > deadline) {
        // Leaks `ptr` on purpose: freeing it would block on the same GPU.
        return absl::DeadlineExceededError(absl::StrCat("zeroing a new allocation on GPU ", device,
                                                        " did not finish within ",
                                                        kAllocZeroTimeout.count(), " s"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    if (err != cudaSuccess) {
      absl::Status status = Check(err, absl::StrCat("zeroing a new allocation on GPU ", device));
      if (poisoned_.ok()) cudaFree(ptr);
      return status;
    }
    allocations_[ptr] = gpu->ordinal;
    return ptr;
  }

  absl::Status Free(const DeviceId& device, void* ptr) override {
    absl::MutexLock lock(&mu_);
    auto it = allocations_.find(ptr);
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    if (it == allocations_.end() || it->second != gpu->ordinal) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Free: ", Hex(ptr), " is not an allocation of ", "this device on GPU ", device));
    }
    allocations_.erase(it);
    if (!poisoned_.ok()) return poisoned_;
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    return Check(cudaFree(ptr), "cudaFree");
  }

  absl::StatusOr<IpcHandle> ExportMemory(const DeviceId& device, void* base) override {
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    auto it = allocations_.find(base);
    if (it == allocations_.end() || it->second != gpu->ordinal) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExportMemory: ", Hex(base),
                       " is not the base of an allocation of this device on GPU ", device));
    }
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    cudaIpcMemHandle_t h;
    RETURN_IF_ERROR(Check(cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle"));
    IpcHandle out;
    std::memcpy(out.bytes.data(), &h, IpcHandle::kSize);
    return out;
  }

  absl::StatusOr<void*> OpenMemory(const DeviceId& device, const IpcHandle& handle) override {
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    const std::string key = handle.ToBytes();
    if (auto it = by_handle_.find(key); it != by_handle_.end()) {
      ++opened_.at(it->second).refs;
      return it->second;
    }
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.bytes.data(), IpcHandle::kSize);
    void* base = nullptr;
    absl::Status status = Check(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
                                absl::StrCat("cudaIpcOpenMemHandle on GPU ", device));
    if (!status.ok()) return status;
    // The allocation must live on the GPU the trainer named,
    // whose NCCL rank reads it; with lazy peer access another GPU's memory
    // would map too and hide the misregistration behind slow peer reads.
    cudaPointerAttributes attr{};
    status = Check(cudaPointerGetAttributes(&attr, base), "cudaPointerGetAttributes");
    if (status.ok() && (attr.type != cudaMemoryTypeDevice || attr.device != gpu->ordinal)) {
      status = absl::InvalidArgumentError(
          absl::StrCat("the allocation behind this IPC handle lives on CUDA ordinal ", attr.device,
                       " of gradsyncd, not on GPU ", device, " (ordinal ", gpu->ordinal,
                       ") that the trainer named"));
    }
    if (!status.ok()) {
      if (poisoned_.ok()) cudaIpcCloseMemHandle(base);
      return status;
    }
    // CUDA also counts opens of one handle per context (the same pointer
    // back); ours mirror them, so each Close here balances one Open there.
    opened_[base] = Opened{key, gpu->ordinal, 1};
    by_handle_[key] = base;
    return base;
  }

  // cuMemGetAddressRange (the runtime has no equivalent), through the
  // runtime's driver entry point: no link against libcuda.
  absl::StatusOr<uint64_t> MappedSize(const DeviceId& device, void* base) override {
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    auto it = opened_.find(base);
    if (it == opened_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("MappedSize: ", Hex(base), " on GPU ", device,
                                                     " is not a base OpenMemory returned"));
    }
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    RETURN_IF_ERROR(Check(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                           cudaEnableDefault, &found),
                          "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)"));
    if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
      return absl::FailedPreconditionError("the CUDA driver lacks cuMemGetAddressRange");
    }
    DeviceScope scope(it->second.ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    CUdeviceptr start = 0;
    size_t size = 0;
    const CUresult r = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn)(
        &start, &size, static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(base)));
    if (r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuMemGetAddressRange(", Hex(base), ") on GPU ",
                                              device, ": CUresult ", static_cast<int>(r)));
    }
    // A handle maps its allocation from the start: base is the range's start.
    return static_cast<uint64_t>(size) -
           (reinterpret_cast<uintptr_t>(base) - static_cast<uintptr_t>(start));
  }

  absl::Status CloseMemory(const DeviceId& device, void* base) override {
    absl::MutexLock lock(&mu_);
    auto it = opened_.find(base);
    if (it == opened_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("CloseMemory: ", Hex(base), " on GPU ", device,
                                                     " is not open (closed twice?)"));
    }
    if (--it->second.refs > 0) return absl::OkStatus();
    const int ordinal = it->second.ordinal;
    by_handle_.erase(it->second.handle);
    opened_.erase(it);
    if (!poisoned_.ok()) return poisoned_;
    DeviceScope scope(ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    return Check(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
  }

  absl::StatusOr<Event*> OpenEvent(const DeviceId& device, const IpcHandle& handle) override {
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.bytes.data(), IpcHandle::kSize);
    cudaEvent_t event = nullptr;
    RETURN_IF_ERROR(Check(cudaIpcOpenEventHandle(&event, h),
                          absl::StrCat("cudaIpcOpenEventHandle on GPU ", device)));
    auto* e = new RtEvent{event, gpu->ordinal};
    events_.insert(e);
    return reinterpret_cast<Event*>(e);
  }

  // A poll's answer: done, still pending, or an error (sticky ones poison).
  absl::StatusOr<Completion> ToCompletion(cudaError_t err, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (err == cudaSuccess) return Completion::kDone;
    if (err == cudaErrorNotReady) return Completion::kPending;
    return Check(err, what);
  }

  absl::StatusOr<Completion> QueryEvent(Event* event) override {
    RtEvent* e = Unwrap(event);
    if (e == nullptr) return absl::InvalidArgumentError("QueryEvent: null event");
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    DeviceScope scope(e->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    const cudaError_t err = cudaEventQuery(e->event);
    // A trainer's event gone bad (its exporter destroyed it, its context
    // died: undefined behaviour to use, typically cudaErrorInvalidResourceHandle)
    // is that trainer's failure. A non-sticky error also stays in the
    // runtime's per-thread last error until read: clear it here, or the next
    // cudaGetLastError on this thread (NCCL's, another job's) reports it as
    // its own. A sticky one poisons the device (Check), as it must.
    if (err != cudaSuccess && err != cudaErrorNotReady) cudaGetLastError();
    return ToCompletion(err, "cudaEventQuery on a trainer's event");
  }

  void CloseEvent(Event* event) override {
    RtEvent* e = Unwrap(event);
    absl::MutexLock lock(&mu_);
    if (e == nullptr || events_.erase(e) == 0) return;
    if (poisoned_.ok()) {
      DeviceScope scope(e->ordinal);
      cudaEventDestroy(e->event);
    }
    delete e;
  }

  absl::StatusOr<Stream*> CreateStream(const DeviceId& device) override {
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    cudaStream_t stream = nullptr;
    // Non-blocking: no implicit ordering with the legacy default stream
    // (trainers in this process have none; NCCL's streams are the same).
    RETURN_IF_ERROR(Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                          absl::StrCat("cudaStreamCreateWithFlags on GPU ", device)));
    auto* s = new RtStream{stream, gpu->ordinal};
    streams_.insert(s);
    return reinterpret_cast<Stream*>(s);
  }

  void DestroyStream(Stream* stream) override {
    RtStream* s = Unwrap(stream);
    absl::MutexLock lock(&mu_);
    if (s == nullptr || streams_.erase(s) == 0) return;
    if (poisoned_.ok()) {
      DeviceScope scope(s->ordinal);
      cudaStreamDestroy(s->stream);  // returns at once; queued work still runs
    }
    delete s;
  }

  absl::StatusOr<Completion> QueryStream(Stream* stream) override {
    RtStream* s = Unwrap(stream);
    if (s == nullptr) return absl::InvalidArgumentError("QueryStream: null stream");
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    DeviceScope scope(s->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    return ToCompletion(cudaStreamQuery(s->stream), "cudaStreamQuery");
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, "CopyAsync");
  }

  absl::Status ZeroAsync(void* dst, size_t bytes, Stream* stream) override {
    RtStream* s = Unwrap(stream);
    if (s == nullptr) return absl::InvalidArgumentError("ZeroAsync: null stream");
    if (bytes == 0) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    DeviceScope scope(s->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    return Check(cudaMemsetAsync(dst, 0, bytes, s->stream), "cudaMemsetAsync");
  }

  absl::StatusOr<void*> AllocHost(const DeviceId& device, size_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("AllocHost of 0 bytes");
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    void* ptr = nullptr;
    // Portable: pinned for every context of this process, whichever GPU reads it.
    RETURN_IF_ERROR(Check(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable),
                          absl::StrCat("cudaHostAlloc(", bytes, " bytes)")));
    host_allocations_.insert(ptr);
    return ptr;
  }

  absl::Status FreeHost(const DeviceId& device, void* ptr) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const Gpu* gpu, Find(device));
    if (host_allocations_.erase(ptr) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("FreeHost: ", Hex(ptr), " is not host memory of this device"));
    }
    if (!poisoned_.ok()) return poisoned_;
    DeviceScope scope(gpu->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    return Check(cudaFreeHost(ptr), "cudaFreeHost");
  }

  absl::Status CopyToHostAsync(void* host, const void* src, size_t bytes, Stream* stream) override {
    return Copy(host, src, bytes, cudaMemcpyDeviceToHost, stream, "CopyToHostAsync");
  }

  absl::Status CopyFromHostAsync(void* dst, const void* host, size_t bytes,
                                 Stream* stream) override {
    return Copy(dst, host, bytes, cudaMemcpyHostToDevice, stream, "CopyFromHostAsync");
  }

  absl::Status SumAsync(void* dst, const std::vector<const void*>& srcs, size_t count, DType dtype,
                        double scale, const NonFiniteCheck& check, Stream* stream) override {
    RtStream* s = Unwrap(stream);
    if (s == nullptr) return absl::InvalidArgumentError("SumAsync: null stream");
    if (srcs.empty()) return absl::InvalidArgumentError("SumAsync: no sources");
    if (!IsValidDType(static_cast<int32_t>(dtype))) {
      return absl::InvalidArgumentError(
          absl::StrCat("SumAsync: bad dtype ", static_cast<int>(dtype)));
    }
    // More sources than one launch takes: later launches add to dst, so dst
    // must not be one of those later sources (it has been overwritten). fp16
    // and bf16 are then rounded once per launch, not once in all.
    for (size_t k = kMaxLocalSumSources; k < srcs.size(); ++k) {
      if (srcs[k] == dst) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SumAsync: dst may be srcs[0..", kMaxLocalSumSources - 1, "], not srcs[", k, "]"));
      }
    }
    if (count == 0) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    int max_blocks = 0;
    for (const Gpu& g : gpus_) {
      if (g.ordinal == s->ordinal) max_blocks = g.max_blocks;
    }
    DeviceScope scope(s->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    size_t next = 0;
    while (next < srcs.size()) {
      LocalSumArgs args;
      args.dst = dst;
      args.count = count;
      int n = 0;
      if (next > 0) args.srcs[n++] = dst;  // the running sum so far
      while (n < kMaxLocalSumSources && next < srcs.size()) args.srcs[n++] = srcs[next++];
      args.nsrcs = n;
      args.scale = next == srcs.size() ? scale : 1.0;
      // Every launch checks into the same flag: a hit in any one counts.
      args.nonfinite_flag = check.flag;
      args.nonfinite_token = check.token;
      RETURN_IF_ERROR(
          Check(LaunchLocalSum(args, static_cast<LocalSumType>(dtype), max_blocks, s->stream),
                absl::StrCat("local sum (", DTypeName(dtype), ", ", count, " elements, ", n,
                             " sources)")));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateCollectives(
      const CollectiveOptions& options) override {
    if (!collectives_) {
      return absl::FailedPreconditionError(
          "this CUDA device was created without collectives (NCCL)");
    }
    for (const DeviceId& d : options.devices) {
      RETURN_IF_ERROR(Find(d).status());
    }
    {
      absl::MutexLock lock(&mu_);
      if (!poisoned_.ok()) return poisoned_;
    }
    return collectives_(options);
  }

 private:
  struct Opened {
    std::string handle;
    int ordinal = -1;
    int refs = 0;
  };

  static std::string Hex(const void* p) {
    return absl::StrCat("0x", absl::Hex(reinterpret_cast<uintptr_t>(p)));
  }

  absl::StatusOr<const Gpu*> Find(const DeviceId& device) const {
    for (const Gpu& g : gpus_) {
      if (g.id == device) return &g;
    }
    std::vector<std::string> visible;
    for (const Gpu& g : gpus_) visible.push_back(g.id);
    const char* env = getenv("CUDA_VISIBLE_DEVICES");
    return absl::InvalidArgumentError(absl::StrCat("no GPU visible to gradsyncd has id '", device,
                                                   "' (visible: ", absl::StrJoin(visible, ", "),
                                                   "; CUDA_VISIBLE_DEVICES=", env ? env : "unset",
                                                   ")"));
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, Stream* stream,
                    const char* what) {
    RtStream* s = Unwrap(stream);
    if (s == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null stream"));
    if (bytes == 0) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    if (!poisoned_.ok()) return poisoned_;
    DeviceScope scope(s->ordinal);
    if (scope.result() != cudaSuccess) return Check(scope.result(), "cudaSetDevice");
    return Check(cudaMemcpyAsync(dst, src, bytes, kind, s->stream), "cudaMemcpyAsync");
  }

  // OK for cudaSuccess; else the error, and a sticky one poisons the device.
  absl::Status Check(cudaError_t err, absl::string_view what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (err == cudaSuccess) return absl::OkStatus();
    absl::Status status = CudaRuntimeError(err, what);
    if (IsCudaContextPoisoned(status) && poisoned_.ok()) poisoned_ = status;
    return status;
  }

  const CollectiveFactory collectives_;
  const std::vector<Gpu> gpus_;  // fixed at creation: CUDA's device list never changes in process

  absl::Mutex mu_;
  absl::Status poisoned_ ABSL_GUARDED_BY(mu_);  // the first sticky error, then every call's answer
  absl::flat_hash_map<void*, int> allocations_ ABSL_GUARDED_BY(mu_);  // Alloc'd base -> ordinal
  absl::flat_hash_map<void*, Opened> opened_ ABSL_GUARDED_BY(mu_);    // IPC-opened base
  absl::flat_hash_map<std::string, void*> by_handle_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<RtEvent*> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<RtStream*> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<void*> host_allocations_ ABSL_GUARDED_BY(mu_);  // AllocHost's
};

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonDevice>> NewCudaDaemonDevice(CollectiveFactory collectives) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaErrorStubLibrary) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver (libcuda.so.1) not found: only the toolkit's link stub was loaded: ",
        Describe(err)));
  }
  if (err == cudaErrorInsufficientDriver) {
    // Also what the static runtime answers when libcuda.so.1 is missing.
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA driver (libcuda.so.1) not found or older than the CUDA runtime gradsyncd was built "
        "with (",
        CUDART_VERSION / 1000, ".", CUDART_VERSION % 1000 / 10, "): ", Describe(err)));
  }
  if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
    const char* env = getenv("CUDA_VISIBLE_DEVICES");
    return absl::UnavailableError(
        absl::StrCat("no CUDA device visible (CUDA_VISIBLE_DEVICES=", env ? env : "unset", ")",
                     err == cudaSuccess ? "" : ": ", err == cudaSuccess ? "" : Describe(err)));
  }
  if (err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA is unusable: cudaGetDeviceCount: ", Describe(err)));
  }
  std::vector<Gpu> gpus;
  for (int i = 0; i < count; ++i) {
    // Properties come from the driver without creating a context.
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) {
      return absl::UnavailableError(
          absl::StrCat("cudaGetDeviceProperties(", i, "): ", Describe(err)));
    }
    Gpu g;
    g.id = FormatGpuUuid(prop.uuid.bytes);
    g.ordinal = i;
    g.max_blocks = 8 * std::max(1, prop.multiProcessorCount);
    gpus.push_back(std::move(g));
  }
  // Every job of this daemon shares the device, so its memory calls and
  // collectives pass one gate (gated_daemon_device.h). The wait bound is
  // above any sane collective timeout: a collective ends or is aborted by then.
  return std::unique_ptr<DaemonDevice>(new GatedDaemonDevice(
      std::make_unique<CudaDaemonDevice>(std::move(collectives), std::move(gpus)),
      absl::Minutes(10)));
}

}  // namespace gradsync::gpu
