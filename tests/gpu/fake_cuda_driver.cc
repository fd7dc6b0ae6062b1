// A fake libcuda.so.1 for cuda_trainer_device_fake_test: one GPU whose
// "device memory" is host memory the test registers, a primary context, a
// per-thread context stack, and counters (fake_cuda_driver.h). It checks the
// contract the real driver enforces and a GPU-less machine cannot: entry
// points looked up by base name through cuGetProcAddress_v2, a current
// context for the calls that need one, push/pop balance, the flags passed.
//
// Environment (read by cuInit / cuGetProcAddress): FAKE_CUDA_INIT_ERROR=1
// makes cuInit fail with CUDA_ERROR_NO_DEVICE; FAKE_CUDA_HIDE=<name> makes
// cuGetProcAddress not find that symbol.
#include "tests/gpu/fake_cuda_driver.h"

#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex mu;
FakeCudaState state;
struct Allocation {
  uintptr_t base;
  size_t size;
  bool ipc_capable;
};
std::vector<Allocation> allocations;
thread_local std::vector<CUcontext> stack;

CUcontext const kPrimary = reinterpret_cast<CUcontext>(uintptr_t{0x1000});

const Allocation* Find(CUdeviceptr p) {
  for (const Allocation& a : allocations) {
    if (p >= a.base && p < a.base + a.size) return &a;
  }
  return nullptr;
}

// The calls the real driver refuses without a current context.
bool NeedContext() {
  if (!stack.empty() && stack.back() == kPrimary) return true;
  ++state.context_errors;
  return false;
}

CUresult DeviceGet(CUdevice* dev, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *dev = 0;
  return CUDA_SUCCESS;
}

CUresult DeviceGetCount(int* count) {
  *count = 1;
  return CUDA_SUCCESS;
}

CUresult DeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  for (int i = 0; i < 16; ++i) uuid->bytes[i] = static_cast<char>(0xa0 + i);
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(mu);
  ++state.primary_retains;
  *ctx = kPrimary;
  return CUDA_SUCCESS;
}

CUresult PrimaryCtxRelease(CUdevice dev) {
  if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(mu);
  --state.primary_retains;
  return CUDA_SUCCESS;
}

CUresult CtxPushCurrent(CUcontext ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  stack.push_back(ctx);
  return CUDA_SUCCESS;
}

CUresult CtxPopCurrent(CUcontext* ctx) {
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx != nullptr) *ctx = stack.back();
  stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult PointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu);
  const Allocation* a = Find(ptr);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (attr != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) return CUDA_ERROR_NOT_SUPPORTED;
  *static_cast<int*>(data) = 0;
  return CUDA_SUCCESS;
}

// Like the real one: zeroes for a pointer CUDA does not know, no context
// needed. Booleans are written as one byte, to catch a reader that assumes
// a wider type it did not zero.
CUresult PointerGetAttributes(unsigned n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu);
  const Allocation* a = Find(ptr);
  for (unsigned i = 0; i < n; ++i) {
    switch (attrs[i]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned*>(data[i]) = a ? CU_MEMORYTYPE_DEVICE : 0;
        break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *static_cast<int*>(data[i]) = a ? 0 : -2;
        break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *static_cast<bool*>(data[i]) = false;
        break;
      case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *static_cast<bool*>(data[i]) = a != nullptr && a->ipc_capable;
        break;
      default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

CUresult MemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  const Allocation* a = Find(ptr);
  if (a == nullptr) return CUDA_ERROR_NOT_FOUND;
  *base = a->base;
  *size = a->size;
  return CUDA_SUCCESS;
}

CUresult IpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr ptr) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  const Allocation* a = Find(ptr);
  if (a == nullptr || a->base != ptr) return CUDA_ERROR_INVALID_VALUE;
  std::memset(h, 0, sizeof(*h));
  std::memcpy(h->reserved, "fakemem", 7);
  std::memcpy(h->reserved + 8, &ptr, sizeof(ptr));
  return CUDA_SUCCESS;
}

// "Maps" a handle to the registered allocation it names.
CUresult IpcOpenMemHandle(CUdeviceptr* p, CUipcMemHandle h, unsigned flags) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  if (std::memcmp(h.reserved, "fakemem", 7) != 0) return CUDA_ERROR_INVALID_VALUE;
  ++state.ipc_opens;
  state.last_open_flags = flags;
  std::memcpy(p, h.reserved + 8, sizeof(*p));
  return CUDA_SUCCESS;
}

CUresult IpcCloseMemHandle(CUdeviceptr) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  ++state.ipc_closes;
  return CUDA_SUCCESS;
}

struct FakeEvent {
  int magic = 0x5eed;
};

CUresult EventCreate(CUevent* ev, unsigned flags) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  state.last_event_flags = flags;
  ++state.live_events;
  *ev = reinterpret_cast<CUevent>(new FakeEvent);
  return CUDA_SUCCESS;
}

CUresult EventDestroy(CUevent ev) {
  std::lock_guard<std::mutex> lock(mu);
  auto* e = reinterpret_cast<FakeEvent*>(ev);
  if (e == nullptr || e->magic != 0x5eed) return CUDA_ERROR_INVALID_HANDLE;
  e->magic = 0;
  delete e;
  --state.live_events;
  return CUDA_SUCCESS;
}

CUresult EventRecord(CUevent ev, CUstream stream) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  auto* e = reinterpret_cast<FakeEvent*>(ev);
  if (e == nullptr || e->magic != 0x5eed) return CUDA_ERROR_INVALID_HANDLE;
  state.last_stream = stream;
  return CUDA_SUCCESS;
}

CUresult IpcGetEventHandle(CUipcEventHandle* h, CUevent ev) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  std::memset(h, 0, sizeof(*h));
  std::memcpy(h->reserved, "fakeevt", 7);
  std::memcpy(h->reserved + 8, &ev, sizeof(ev));
  return CUDA_SUCCESS;
}

CUresult MemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream stream) {
  std::lock_guard<std::mutex> lock(mu);
  if (!NeedContext()) return CUDA_ERROR_INVALID_CONTEXT;
  const Allocation* a = Find(p);
  if (a == nullptr || p + n > a->base + a->size) return CUDA_ERROR_INVALID_VALUE;
  std::memset(reinterpret_cast<void*>(p), v, n);
  state.last_stream = stream;
  return CUDA_SUCCESS;
}

const std::map<std::string, void*>& Table() {
  static const auto* table = new std::map<std::string, void*>{
      {"cuDeviceGet", reinterpret_cast<void*>(&DeviceGet)},
      {"cuDeviceGetCount", reinterpret_cast<void*>(&DeviceGetCount)},
      {"cuDeviceGetUuid", reinterpret_cast<void*>(&DeviceGetUuid)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&PrimaryCtxRetain)},
      {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&PrimaryCtxRelease)},
      {"cuCtxPushCurrent", reinterpret_cast<void*>(&CtxPushCurrent)},
      {"cuCtxPopCurrent", reinterpret_cast<void*>(&CtxPopCurrent)},
      {"cuPointerGetAttribute", reinterpret_cast<void*>(&PointerGetAttribute)},
      {"cuPointerGetAttributes", reinterpret_cast<void*>(&PointerGetAttributes)},
      {"cuMemGetAddressRange", reinterpret_cast<void*>(&MemGetAddressRange)},
      {"cuIpcGetMemHandle", reinterpret_cast<void*>(&IpcGetMemHandle)},
      {"cuIpcOpenMemHandle", reinterpret_cast<void*>(&IpcOpenMemHandle)},
      {"cuIpcCloseMemHandle", reinterpret_cast<void*>(&IpcCloseMemHandle)},
      {"cuEventCreate", reinterpret_cast<void*>(&EventCreate)},
      {"cuEventDestroy", reinterpret_cast<void*>(&EventDestroy)},
      {"cuEventRecord", reinterpret_cast<void*>(&EventRecord)},
      {"cuIpcGetEventHandle", reinterpret_cast<void*>(&IpcGetEventHandle)},
      {"cuMemsetD8Async", reinterpret_cast<void*>(&MemsetD8Async)},
  };
  return *table;
}

}  // namespace

extern "C" {

// The entry points a client finds with dlsym. cuda.h's prototypes (and its
// cuGetProcAddress -> cuGetProcAddress_v2 rename) give them their names.
CUresult CUDAAPI cuInit(unsigned int) {
  std::lock_guard<std::mutex> lock(mu);
  ++state.init_calls;
  const char* fail = getenv("FAKE_CUDA_INIT_ERROR");
  return fail != nullptr && fail[0] == '1' ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** str) {
  static thread_local std::string name;
  name = "FAKE_CUDA_ERROR_" + std::to_string(static_cast<int>(error));
  *str = name.c_str();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorString(CUresult, const char** str) {
  *str = "fake driver error";
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult* status) {
  std::lock_guard<std::mutex> lock(mu);
  if (state.min_requested_version == 0 || version < state.min_requested_version) {
    state.min_requested_version = version;
  }
  if (version > state.max_requested_version) state.max_requested_version = version;
  state.requested_flags_or |= flags;
  const char* hide = getenv("FAKE_CUDA_HIDE");
  auto it = Table().find(symbol);
  if (it == Table().end() || (hide != nullptr && std::string(hide) == symbol)) {
    *pfn = nullptr;
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = it->second;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  ++state.resolved;
  return CUDA_SUCCESS;
}

FakeCudaState* fake_cuda_state() { return &state; }

void fake_cuda_reset() {
  std::lock_guard<std::mutex> lock(mu);
  state = FakeCudaState{};
  allocations.clear();
}

void fake_cuda_add_allocation(void* base, size_t size, int ipc_capable) {
  std::lock_guard<std::mutex> lock(mu);
  allocations.push_back({reinterpret_cast<uintptr_t>(base), size, ipc_capable != 0});
}

void* fake_cuda_current() { return stack.empty() ? nullptr : stack.back(); }
int fake_cuda_depth() { return static_cast<int>(stack.size()); }
void fake_cuda_push(void* ctx) { stack.push_back(static_cast<CUcontext>(ctx)); }
void fake_cuda_pop() {
  if (!stack.empty()) stack.pop_back();
}

}  // extern "C"
