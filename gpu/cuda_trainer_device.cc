#include "gpu/cuda_trainer_device.h"

// Types and prototypes only: nothing from libcuda is linked. decltype(&cuX)
// below names the prototype cuda.h maps cuX to (cuIpcOpenMemHandle ->
// cuIpcOpenMemHandle_v2, ...), which is the variant cuGetProcAddress returns
// for CUDA_VERSION.
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gpu/cuda_uuid.h"

namespace gradsync::gpu {
namespace {

static_assert(sizeof(CUipcMemHandle) == IpcHandle::kSize, "CUDA IPC handle size changed");
static_assert(sizeof(CUipcEventHandle) == IpcHandle::kSize, "CUDA IPC handle size changed");
static_assert(sizeof(CUuuid) == 16, "CUuuid is 16 bytes");

// The driver entry points this device uses. Immutable once loaded.
struct Driver {
  std::string library;
  decltype(&cuGetErrorName) GetErrorName = nullptr;
  decltype(&cuGetErrorString) GetErrorString = nullptr;
  decltype(&cuDeviceGet) DeviceGet = nullptr;
  decltype(&cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&cuDeviceGetUuid) DeviceGetUuid = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain = nullptr;
  decltype(&cuDevicePrimaryCtxRelease) DevicePrimaryCtxRelease = nullptr;
  decltype(&cuCtxPushCurrent) CtxPushCurrent = nullptr;
  decltype(&cuCtxPopCurrent) CtxPopCurrent = nullptr;
  decltype(&cuPointerGetAttribute) PointerGetAttribute = nullptr;
  decltype(&cuPointerGetAttributes) PointerGetAttributes = nullptr;
  decltype(&cuMemGetAddressRange) MemGetAddressRange = nullptr;
  decltype(&cuIpcGetMemHandle) IpcGetMemHandle = nullptr;
  decltype(&cuIpcOpenMemHandle) IpcOpenMemHandle = nullptr;
  decltype(&cuIpcCloseMemHandle) IpcCloseMemHandle = nullptr;
  decltype(&cuEventCreate) EventCreate = nullptr;
  decltype(&cuEventDestroy) EventDestroy = nullptr;
  decltype(&cuEventRecord) EventRecord = nullptr;
  decltype(&cuStreamWaitEvent) StreamWaitEvent = nullptr;
  decltype(&cuIpcGetEventHandle) IpcGetEventHandle = nullptr;
  decltype(&cuMemsetD8Async) MemsetD8Async = nullptr;
  decltype(&cuStreamQuery) StreamQuery = nullptr;
  decltype(&cuMemcpyDtoDAsync) MemcpyDtoDAsync = nullptr;

  // "what: CUDA_ERROR_X (description)".
  std::string Describe(CUresult r) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (GetErrorName == nullptr || GetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
    if (GetErrorString == nullptr || GetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
    return absl::StrCat(name ? name : absl::StrCat("CUresult ", static_cast<int>(r)), " (",
                        text ? text : "no description", ")");
  }

  absl::Status Error(CUresult r, absl::string_view what) const {
    std::string msg = absl::StrCat(what, ": ", Describe(r));
    switch (r) {
      case CUDA_ERROR_INVALID_VALUE:
      case CUDA_ERROR_INVALID_HANDLE:
      case CUDA_ERROR_INVALID_DEVICE:
        return absl::InvalidArgumentError(msg);
      case CUDA_ERROR_OUT_OF_MEMORY:
      case CUDA_ERROR_MAP_FAILED:
      case CUDA_ERROR_TOO_MANY_PEERS:
        return absl::ResourceExhaustedError(msg);
      // Sticky: the context is unusable until the process exits.
      case CUDA_ERROR_ILLEGAL_ADDRESS:
      case CUDA_ERROR_LAUNCH_FAILED:
      case CUDA_ERROR_ILLEGAL_INSTRUCTION:
      case CUDA_ERROR_MISALIGNED_ADDRESS:
      case CUDA_ERROR_INVALID_ADDRESS_SPACE:
      case CUDA_ERROR_INVALID_PC:
      case CUDA_ERROR_HARDWARE_STACK_ERROR:
      case CUDA_ERROR_ASSERT:
      case CUDA_ERROR_ECC_UNCORRECTABLE:
        return absl::InternalError(
            absl::StrCat(msg, "; the trainer's CUDA context is unusable (sticky error)"));
      default:
        return absl::InternalError(msg);
    }
  }
};

absl::StatusOr<std::unique_ptr<Driver>> LoadDriver(const std::string& library) {
  // RTLD_LOCAL: our lookups go through dlsym/cuGetProcAddress, never through
  // global symbol resolution, and we do not shadow anyone else's. Never
  // dlclose'd: the driver does not support being unloaded, and in a trainer
  // the runtime usually has it loaded as well (dlopen just adds a reference).
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver (", library, ") not found: ", why ? why : "dlopen failed"));
  }
  auto driver = std::make_unique<Driver>();
  driver->library = library;
  // Entry points whose ABI never changed are taken straight from the
  // library; everything else through cuGetProcAddress.
  auto init = reinterpret_cast<decltype(&cuInit)>(dlsym(lib, "cuInit"));
  auto get_version =
      reinterpret_cast<decltype(&cuDriverGetVersion)>(dlsym(lib, "cuDriverGetVersion"));
  auto get_proc = reinterpret_cast<decltype(&cuGetProcAddress)>(dlsym(lib, "cuGetProcAddress_v2"));
  driver->GetErrorName = reinterpret_cast<decltype(&cuGetErrorName)>(dlsym(lib, "cuGetErrorName"));
  driver->GetErrorString =
      reinterpret_cast<decltype(&cuGetErrorString)>(dlsym(lib, "cuGetErrorString"));
  if (init == nullptr || get_version == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver (", library, ") not found: the library has no cuInit"));
  }
  if (get_proc == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver (", library,
                     ") is too old: no cuGetProcAddress_v2 (CUDA 12.0 or newer needed)"));
  }
  CUresult r = init(0);
  if (r != CUDA_SUCCESS) {
    return absl::UnavailableError(absl::StrCat(
        "CUDA driver (", library, ") failed to initialize: cuInit: ", driver->Describe(r)));
  }
  int driver_version = 0;
  r = get_version(&driver_version);
  if (r != CUDA_SUCCESS) {
    return absl::UnavailableError(
        absl::StrCat("CUDA driver (", library, "): cuDriverGetVersion: ", driver->Describe(r)));
  }
  if (driver_version < 12000) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA driver (", library, ") is too old: CUDA ", driver_version / 1000, ".",
                     driver_version % 1000 / 10, "; CUDA 12.0 or newer needed"));
  }
  // The ABI of our headers, or the driver's newest when it is older: the
  // functions used here kept their prototypes from 12.0 on.
  const int abi = std::min(CUDA_VERSION, driver_version);
  absl::Status status;
  auto resolve = [&](const char* symbol, auto* out) {
    if (!status.ok()) return;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    // LEGACY_STREAM: a null stream means the legacy default stream, as in
    // code built without --default-stream per-thread (and we pass
    // CU_STREAM_LEGACY explicitly anyway).
    CUresult res = get_proc(symbol, &fn, abi, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found);
    if (res != CUDA_SUCCESS || found != CU_GET_PROC_ADDRESS_SUCCESS || fn == nullptr) {
      status = absl::FailedPreconditionError(
          absl::StrCat("CUDA driver (", library, ") lacks ", symbol, " for CUDA ", abi / 1000, ".",
                       abi % 1000 / 10, " (cuGetProcAddress: ",
                       res != CUDA_SUCCESS ? driver->Describe(res) : "symbol not found", ")"));
      return;
    }
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)>>(fn);
  };
  resolve("cuDeviceGet", &driver->DeviceGet);
  resolve("cuDeviceGetCount", &driver->DeviceGetCount);
  resolve("cuDeviceGetUuid", &driver->DeviceGetUuid);
  resolve("cuDevicePrimaryCtxRetain", &driver->DevicePrimaryCtxRetain);
  resolve("cuDevicePrimaryCtxRelease", &driver->DevicePrimaryCtxRelease);
  resolve("cuCtxPushCurrent", &driver->CtxPushCurrent);
  resolve("cuCtxPopCurrent", &driver->CtxPopCurrent);
  resolve("cuPointerGetAttribute", &driver->PointerGetAttribute);
  resolve("cuPointerGetAttributes", &driver->PointerGetAttributes);
  resolve("cuMemGetAddressRange", &driver->MemGetAddressRange);
  resolve("cuIpcGetMemHandle", &driver->IpcGetMemHandle);
  resolve("cuIpcOpenMemHandle", &driver->IpcOpenMemHandle);
  resolve("cuIpcCloseMemHandle", &driver->IpcCloseMemHandle);
  resolve("cuEventCreate", &driver->EventCreate);
  resolve("cuEventDestroy", &driver->EventDestroy);
  resolve("cuEventRecord", &driver->EventRecord);
  resolve("cuStreamWaitEvent", &driver->StreamWaitEvent);
  resolve("cuIpcGetEventHandle", &driver->IpcGetEventHandle);
  resolve("cuMemsetD8Async", &driver->MemsetD8Async);
  resolve("cuStreamQuery", &driver->StreamQuery);
  resolve("cuMemcpyDtoDAsync", &driver->MemcpyDtoDAsync);
  if (!status.ok()) return status;
  return driver;
}

CUdeviceptr ToDevicePtr(const void* p) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
}
void* FromDevicePtr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// What Event* points to on the trainer side. Never defined as gpu::Event:
// another implementation linked into the same binary may define that.
struct DriverEvent {
  CUevent event = nullptr;
  CUcontext context = nullptr;
};

DriverEvent* Unwrap(Event* e) { return reinterpret_cast<DriverEvent*>(e); }
Event* Wrap(DriverEvent* e) { return reinterpret_cast<Event*>(e); }

// Where a device pointer lives.
struct PointerInfo {
  int ordinal = -1;
  CUdeviceptr base = 0;
  size_t size = 0;
};

class CudaTrainerDevice final : public TrainerDevice {
 public:
  explicit CudaTrainerDevice(std::unique_ptr<Driver> driver) : cu_(std::move(driver)) {}

  ~CudaTrainerDevice() override {
    absl::MutexLock lock(&mu_);
    // Leftovers of a caller that did not clean up (a trainer exiting on an
    // error): unmap and destroy them so a long-lived process does not leak.
    for (auto& [base, open] : opened_) {
      ContextScope scope(*cu_, open.context);
      if (scope.ok()) cu_->IpcCloseMemHandle(base);
    }
    for (DriverEvent* e : events_) {
      ContextScope scope(*cu_, e->context);
      if (scope.ok()) cu_->EventDestroy(e->event);
      delete e;
    }
    for (const auto& [ordinal, context] : contexts_) {
      CUdevice dev;
      if (cu_->DeviceGet(&dev, ordinal) == CUDA_SUCCESS) cu_->DevicePrimaryCtxRelease(dev);
    }
  }

  absl::StatusOr<Allocation> FindAllocation(const void* ptr) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(PointerInfo info, Lookup(ptr));
    ASSIGN_OR_RETURN(DeviceId id, IdOfOrdinalLocked(info.ordinal));
    return Allocation{FromDevicePtr(info.base), info.size, std::move(id)};
  }

  absl::StatusOr<DeviceId> IdOfOrdinal(int ordinal) override {
    absl::MutexLock lock(&mu_);
    return IdOfOrdinalLocked(ordinal);
  }

  absl::StatusOr<void*> OpenMemory(const DeviceId& device, const IpcHandle& handle) override {
    absl::MutexLock lock(&mu_);
    const std::string key = handle.ToBytes();
    if (auto it = by_handle_.find(key); it != by_handle_.end()) {
      ++opened_.at(it->second).refs;
      return FromDevicePtr(it->second);
    }
    ASSIGN_OR_RETURN(CUcontext context, ContextOfDevice(device));
    ContextScope scope(*cu_, context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    CUipcMemHandle h;
    std::memcpy(h.reserved, handle.bytes.data(), IpcHandle::kSize);
    CUdeviceptr base = 0;
    // Lazy peer access: a mapping of another GPU's memory works over NVLink
    // or PCIe without enabling peer access for the whole context.
    CUresult r = cu_->IpcOpenMemHandle(&base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) {
      return cu_->Error(r, absl::StrCat("cuIpcOpenMemHandle on GPU ", device));
    }
    opened_[base] = Opened{key, context, 1};
    by_handle_[key] = base;
    return FromDevicePtr(base);
  }

  absl::Status CloseMemory(void* base) override {
    absl::MutexLock lock(&mu_);
    auto it = opened_.find(ToDevicePtr(base));
    if (it == opened_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CloseMemory: ", absl::Hex(reinterpret_cast<uintptr_t>(base)),
                       " is not a base OpenMemory returned (or it was closed already)"));
    }
    if (--it->second.refs > 0) return absl::OkStatus();
    Opened open = std::move(it->second);
    opened_.erase(it);
    by_handle_.erase(open.handle);
    ContextScope scope(*cu_, open.context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    CUresult r = cu_->IpcCloseMemHandle(ToDevicePtr(base));
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuIpcCloseMemHandle");
    return absl::OkStatus();
  }

  absl::StatusOr<IpcHandle> ExportMemory(void* base) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(PointerInfo info, Lookup(base));
    if (info.base != ToDevicePtr(base)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ExportMemory: ", absl::Hex(reinterpret_cast<uintptr_t>(base)),
                       " is inside an allocation starting at ", absl::Hex(info.base),
                       "; export the base (FindAllocation) and send the offset"));
    }
    ASSIGN_OR_RETURN(CUcontext context, ContextOfOrdinal(info.ordinal));
    ContextScope scope(*cu_, context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    CUipcMemHandle h;
    CUresult r = cu_->IpcGetMemHandle(&h, info.base);
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuIpcGetMemHandle");
    IpcHandle out;
    std::memcpy(out.bytes.data(), h.reserved, IpcHandle::kSize);
    return out;
  }

  absl::StatusOr<Event*> CreateEvent(const DeviceId& device) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CUcontext context, ContextOfDevice(device));
    ContextScope scope(*cu_, context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    CUevent event = nullptr;
    // Interprocess events must not record timing.
    CUresult r = cu_->EventCreate(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) return cu_->Error(r, absl::StrCat("cuEventCreate on GPU ", device));
    auto* e = new DriverEvent{event, context};
    events_.insert(e);
    return Wrap(e);
  }

  absl::StatusOr<IpcHandle> ExportEvent(Event* event) override {
    absl::MutexLock lock(&mu_);
    DriverEvent* e = Unwrap(event);
    if (e == nullptr || !events_.contains(e)) {
      return absl::InvalidArgumentError("ExportEvent: not an event of this device");
    }
    ContextScope scope(*cu_, e->context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    CUipcEventHandle h;
    CUresult r = cu_->IpcGetEventHandle(&h, e->event);
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuIpcGetEventHandle");
    IpcHandle out;
    std::memcpy(out.bytes.data(), h.reserved, IpcHandle::kSize);
    return out;
  }

  void DestroyEvent(Event* event) override {
    absl::MutexLock lock(&mu_);
    DriverEvent* e = Unwrap(event);
    if (e == nullptr || events_.erase(e) == 0) return;
    ContextScope scope(*cu_, e->context);
    if (scope.ok()) cu_->EventDestroy(e->event);  // pending work keeps its own reference
    delete e;
  }

  absl::Status RecordEvent(Event* event, Stream* stream) override {
    DriverEvent* e = Unwrap(event);
    if (e == nullptr) return absl::InvalidArgumentError("RecordEvent: null event");
    // No lock: the event's fields never change while it is alive, and the
    // driver calls are thread-safe. This is the per-gradient hot path.
    ContextScope scope(*cu_, e->context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    CUresult r = cu_->EventRecord(e->event, NativeStream(stream));
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuEventRecord");
    return absl::OkStatus();
  }

  absl::Status StreamWaitEvent(Stream* stream, Event* event) override {
    DriverEvent* e = Unwrap(event);
    if (e == nullptr) return absl::InvalidArgumentError("StreamWaitEvent: null event");
    ContextScope scope(*cu_, e->context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    // Flags 0 (CU_EVENT_WAIT_DEFAULT): wait for the event's latest recording.
    CUresult r = cu_->StreamWaitEvent(NativeStream(stream), e->event, 0);
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuStreamWaitEvent");
    return absl::OkStatus();
  }

  absl::Status MemsetAsync(void* ptr, size_t bytes, Stream* stream) override {
    if (bytes == 0) return absl::OkStatus();
    int ordinal = -1;
    CUresult r =
        cu_->PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ToDevicePtr(ptr));
    if (r != CUDA_SUCCESS) return cu_->Error(r, "MemsetAsync: not device memory");
    CUcontext context;
    {
      absl::MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(context, ContextOfOrdinal(ordinal));
    }
    ContextScope scope(*cu_, context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    r = cu_->MemsetD8Async(ToDevicePtr(ptr), 0, bytes, NativeStream(stream));
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuMemsetD8Async");
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceId> DeviceOfPointer(const void* ptr) override {
    if (ptr == nullptr) return absl::NotFoundError("a null pointer is not device memory");
    // As Lookup: "not a CUDA pointer" comes back as zeroes or as an error.
    unsigned int memory_type = 0;
    int ordinal = -1;
    uint64_t is_managed = 0;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                   CU_POINTER_ATTRIBUTE_IS_MANAGED};
    void* data[] = {&memory_type, &ordinal, &is_managed};
    const CUresult r = cu_->PointerGetAttributes(3, attrs, data, ToDevicePtr(ptr));
    // Managed memory is host-addressable: it takes the host path.
    if (r != CUDA_SUCCESS || memory_type != CU_MEMORYTYPE_DEVICE || ordinal < 0 ||
        is_managed != 0) {
      return absl::NotFoundError(
          absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>(ptr)), " is not CUDA device memory"));
    }
    absl::MutexLock lock(&mu_);
    return IdOfOrdinalLocked(ordinal);
  }

  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) override {
    if (bytes == 0) return absl::OkStatus();
    int ordinal = -1;
    CUresult r =
        cu_->PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ToDevicePtr(dst));
    if (r != CUDA_SUCCESS) return cu_->Error(r, "CopyAsync: the destination is not device memory");
    CUcontext context;
    {
      absl::MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(context, ContextOfOrdinal(ordinal));
    }
    ContextScope scope(*cu_, context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    r = cu_->MemcpyDtoDAsync(ToDevicePtr(dst), ToDevicePtr(src), bytes, NativeStream(stream));
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuMemcpyDtoDAsync");
    return absl::OkStatus();
  }

  // cudaStream_t and CUstream are the same handle.
  Stream* WrapStream(void* native) override { return reinterpret_cast<Stream*>(native); }

  absl::Status SynchronizeStream(const DeviceId& device, Stream* stream,
                                 absl::Duration timeout) override {
    CUcontext context;
    {
      absl::MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(context, ContextOfDevice(device));
    }
    // Polled, not cuStreamSynchronize: a wedged kernel must not hang gs_close.
    ContextScope scope(*cu_, context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    while (true) {
      const CUresult r = cu_->StreamQuery(NativeStream(stream));
      if (r == CUDA_SUCCESS) return absl::OkStatus();
      if (r != CUDA_ERROR_NOT_READY) return cu_->Error(r, "cuStreamQuery");
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("the trainer's stream on GPU ", device,
                                                        " still has work after ",
                                                        absl::FormatDuration(timeout)));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  // Makes `context` current for the scope and restores the caller's.
  class ContextScope {
   public:
    ContextScope(const Driver& cu, CUcontext context) : cu_(cu) {
      result_ = cu_.CtxPushCurrent(context);
    }
    ~ContextScope() {
      if (result_ == CUDA_SUCCESS) {
        CUcontext popped;
        cu_.CtxPopCurrent(&popped);
      }
    }
    ContextScope(const ContextScope&) = delete;
    ContextScope& operator=(const ContextScope&) = delete;
    bool ok() const { return result_ == CUDA_SUCCESS; }
    CUresult result() const { return result_; }

   private:
    const Driver& cu_;
    CUresult result_;
  };

  struct Opened {
    std::string handle;
    CUcontext context = nullptr;
    int refs = 0;
  };

  static CUstream NativeStream(Stream* stream) {
    return stream == nullptr ? CU_STREAM_LEGACY : reinterpret_cast<CUstream>(stream);
  }

  absl::StatusOr<DeviceId> IdOfOrdinalLocked(int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = ids_.find(ordinal); it != ids_.end()) return it->second;
    CUdevice dev;
    CUresult r = cu_->DeviceGet(&dev, ordinal);
    if (r != CUDA_SUCCESS) return cu_->Error(r, absl::StrCat("cuDeviceGet(", ordinal, ")"));
    CUuuid uuid;
    r = cu_->DeviceGetUuid(&uuid, dev);
    if (r != CUDA_SUCCESS) return cu_->Error(r, absl::StrCat("cuDeviceGetUuid(", ordinal, ")"));
    DeviceId id = FormatGpuUuid(uuid.bytes);
    ids_[ordinal] = id;
    return id;
  }

  absl::StatusOr<int> OrdinalOf(const DeviceId& device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [ordinal, id] : ids_) {
      if (id == device) return ordinal;
    }
    int count = 0;
    CUresult r = cu_->DeviceGetCount(&count);
    if (r != CUDA_SUCCESS) return cu_->Error(r, "cuDeviceGetCount");
    for (int i = 0; i < count; ++i) {
      ASSIGN_OR_RETURN(DeviceId id, IdOfOrdinalLocked(i));
      if (id == device) return i;
    }
    const char* visible = getenv("CUDA_VISIBLE_DEVICES");
    return absl::InvalidArgumentError(
        absl::StrCat("GPU ", device, " is not visible to this process (", count,
                     " visible; CUDA_VISIBLE_DEVICES=", visible ? visible : "unset", ")"));
  }

  absl::StatusOr<CUcontext> ContextOfOrdinal(int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = contexts_.find(ordinal); it != contexts_.end()) return it->second;
    CUdevice dev;
    CUresult r = cu_->DeviceGet(&dev, ordinal);
    if (r != CUDA_SUCCESS) return cu_->Error(r, absl::StrCat("cuDeviceGet(", ordinal, ")"));
    CUcontext context = nullptr;
    r = cu_->DevicePrimaryCtxRetain(&context, dev);
    if (r != CUDA_SUCCESS) {
      return cu_->Error(r, absl::StrCat("cuDevicePrimaryCtxRetain(", ordinal, ")"));
    }
    contexts_[ordinal] = context;
    return context;
  }

  absl::StatusOr<CUcontext> ContextOfDevice(const DeviceId& device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ASSIGN_OR_RETURN(int ordinal, OrdinalOf(device));
    return ContextOfOrdinal(ordinal);
  }

  // The allocation containing `ptr`, which must be device memory that CUDA
  // IPC can export (cudaMalloc-style, not managed, not VMM).
  absl::StatusOr<PointerInfo> Lookup(const void* ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ptr == nullptr) return absl::InvalidArgumentError("null device pointer");
    // cuPointerGetAttributes answers "not a CUDA pointer" with zeroed
    // attributes instead of an error, and needs no current context.
    unsigned int memory_type = 0;
    int ordinal = -1;
    uint64_t is_managed = 0;  // "a boolean": wide and zeroed, whatever width is written
    uint64_t ipc_capable = 0;
    CUpointer_attribute attrs[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    void* data[] = {&memory_type, &ordinal, &is_managed, &ipc_capable};
    CUresult r = cu_->PointerGetAttributes(4, attrs, data, ToDevicePtr(ptr));
    const std::string where = absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>(ptr)));
    if (r != CUDA_SUCCESS) {
      // Drivers have answered foreign pointers both ways (zeroes, or an error).
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is not CUDA device memory of this process: cuPointerGetAttributes: ",
          cu_->Describe(r)));
    }
    if (memory_type != CU_MEMORYTYPE_DEVICE || ordinal < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is not CUDA device memory of this process (a host pointer, or freed)"));
    }
    if (is_managed != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is managed memory (cudaMallocManaged), which CUDA IPC cannot share"));
    }
    if (ipc_capable == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          " lives in an allocation CUDA IPC cannot export (virtual memory management, e.g. "
          "PyTorch's expandable_segments, or a stream-ordered pool); use daemon-owned buffers"));
    }
    ASSIGN_OR_RETURN(CUcontext context, ContextOfOrdinal(ordinal));
    ContextScope scope(*cu_, context);
    if (!scope.ok()) return cu_->Error(scope.result(), "cuCtxPushCurrent");
    PointerInfo info;
    info.ordinal = ordinal;
    r = cu_->MemGetAddressRange(&info.base, &info.size, ToDevicePtr(ptr));
    if (r != CUDA_SUCCESS) return cu_->Error(r, absl::StrCat("cuMemGetAddressRange(", where, ")"));
    return info;
  }

  const std::unique_ptr<Driver> cu_;
  absl::Mutex mu_;
  std::map<int, CUcontext> contexts_ ABSL_GUARDED_BY(mu_);  // retained primary contexts
  std::map<int, DeviceId> ids_ ABSL_GUARDED_BY(mu_);        // ordinal -> UUID, cached
  // Mappings of daemon memory: base -> (handle, refs); handle -> base.
  absl::flat_hash_map<CUdeviceptr, Opened> opened_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, CUdeviceptr> by_handle_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<DriverEvent*> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerDevice>> NewCudaTrainerDevice(
    const std::string& driver_library) {
  ASSIGN_OR_RETURN(std::unique_ptr<Driver> driver, LoadDriver(driver_library));
  return std::unique_ptr<TrainerDevice>(new CudaTrainerDevice(std::move(driver)));
}

}  // namespace gradsync::gpu
