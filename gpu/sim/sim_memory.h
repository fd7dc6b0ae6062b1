// Simulated device memory: one shared-memory segment per allocation, its
// name as the IPC handle, and the process's registry of every allocation it
// made or mapped (what CUDA's context knows about device pointers).
//
// A segment is a header page (magic, GPU, size, owner pid) followed by the
// data, so a handle naming anything else is refused and a mapping opened on
// the wrong GPU is caught. Regions are shared_ptr: an operation queued on a
// stream holds the regions it touches, so Free or Close never pulls memory
// out from under in-flight work (CUDA would synchronize instead).
//
// The header also lists the processes that map the allocation (their first
// Open to their last Close), so that Free can report an importer still
// alive: CUDA's undefined behaviour, turned into FAILED_PRECONDITION.
//
// Threads: the registry is process-wide and thread-safe. A forked child
// inherits the parent's mappings but must create its own devices.
#ifndef GRADSYNC_GPU_SIM_SIM_MEMORY_H_
#define GRADSYNC_GPU_SIM_SIM_MEMORY_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu/device.h"
#include "ipc/shared_segment.h"

namespace gradsync::gpu::sim {

// What a handle names.
enum class HandleKind : unsigned char { kMemory = 'M', kEvent = 'E' };

// "GSIM", kind, 3 zero bytes, then the segment name, NUL-padded.
IpcHandle EncodeHandle(HandleKind kind, const std::string& segment_name);
// INVALID_ARGUMENT for anything EncodeHandle(kind, ...) did not produce.
absl::StatusOr<std::string> DecodeHandle(HandleKind kind, const IpcHandle& handle);

// "<prefix>.<pid>.<tag><n>": unique in this machine while this process
// lives, and removable by ipc::RemoveStaleSegments(prefix) once it is dead.
std::string NewSegmentName(const std::string& prefix, const std::string& tag);

// "0x7f..." for messages.
std::string PointerString(const void* p);

// Whether `pid` is a live process (a zombie counts as dead).
bool ProcessAlive(pid_t pid);

// One mapped allocation.
struct Region {
  ipc::SharedSegment segment;
  std::string name;
  char* base = nullptr;  // the device pointer: the data after the header
  size_t size = 0;
  int device_index = 0;
  bool owned = false;  // allocated by this process (else opened)
  int open_count = 0;  // opened regions: balance of OpenMemory/CloseMemory
};

class Registry {
 public:
  static Registry& Get();  // the process's; never destroyed

  // A new zeroed allocation of `bytes` (> 0) on sim GPU `device_index`.
  absl::StatusOr<std::shared_ptr<Region>> Allocate(const std::string& prefix, int device_index,
                                                   size_t bytes);
  // Frees an allocation of this process by its base (and unlinks its name);
  // FAILED_PRECONDITION naming a live process that still maps it (freed
  // all the same: that mapping dangles, as under CUDA).
  absl::Status Free(void* base);

  // Maps the allocation a handle names (once per process: reopening returns
  // the same region, counted), checking it lives on `device_index`.
  absl::StatusOr<std::shared_ptr<Region>> Open(const IpcHandle& handle, int device_index);
  absl::Status Close(void* base);

  // The region containing [ptr, ptr + bytes), or INVALID_ARGUMENT.
  absl::StatusOr<std::shared_ptr<Region>> Find(const void* ptr, size_t bytes);
  // The allocation of this process whose base is exactly `base`.
  absl::StatusOr<std::shared_ptr<Region>> FindOwnedBase(const void* base);

 private:
  Registry() = default;

  absl::Mutex mu_;
  // Every mapped region by base address (owned and opened), for Find.
  std::map<uintptr_t, std::shared_ptr<Region>> by_base_ ABSL_GUARDED_BY(mu_);
  // Opened regions by segment name, for reopening.
  std::map<std::string, std::shared_ptr<Region>> opened_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync::gpu::sim

#endif  // GRADSYNC_GPU_SIM_SIM_MEMORY_H_
