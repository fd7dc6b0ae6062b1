// The device seam: every GPU call the GPU data path makes, behind two small
// interfaces, so that all of the path's logic (handle and offset bookkeeping,
// readiness events, staging, same-device local sums, collectives, failure and
// teardown) runs the same against real CUDA + NCCL and against the host
// simulation that CI uses (no machine that builds this project has a GPU).
//
//   TrainerDevice  what a trainer process (libgradsync) does: identify its
//                  GPU, map the daemon's flat gradient buffer, export its own
//                  allocations (user-pointer mode), record readiness events.
//   DaemonDevice   what gradsyncd does: allocate and export flat buffers, open
//                  trainers' handles, poll their events, stage, sum on the
//                  device, and run the NCCL group collective.
//
// Implementations:
//   gpu/cuda_trainer_device   CUDA driver API loaded with dlopen (libcuda.so.1),
//                             so libgradsync.so loads and works on machines
//                             without CUDA; only a CUDA registration needs it.
//   gpu/cuda_daemon_device    CUDA runtime (static), the local-sum kernel, and
//                             NCCL loaded with dlopen at run time.
//   gpu/sim/sim_device        tests only (testonly = True; never linked into a
//                             release gradsyncd): host shared memory as device
//                             memory, segment names as IPC handles, events as
//                             shared counters completed by a simulated stream
//                             thread, so a missing wait shows up as a wrong
//                             result.
//
// Handles are opaque 64-byte blobs (the size of cudaIpcMemHandle_t and
// cudaIpcEventHandle_t); they travel in local.proto as bytes.
//
// Threads: a TrainerDevice is used by the trainer's calling thread; a
// DaemonDevice by the daemon's scheduler thread, except Abort on a
// CollectiveGroup (any thread). No call blocks without a deadline.
#ifndef GRADSYNC_GPU_DEVICE_H_
#define GRADSYNC_GPU_DEVICE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"

namespace gradsync::gpu {

// An error after which this process can never use its device again (a
// sticky CUDA error poisons every context; too many leaked NCCL bootstrap
// threads): the daemon exits with a distinct code and its supervisor
// restarts it. Marks `status` (an error) so, whichever layer returns it.
absl::Status MarkDeviceLost(absl::Status status);
bool IsDeviceLost(const absl::Status& status);

// A cross-process handle: cudaIpcMemHandle_t / cudaIpcEventHandle_t bytes,
// or the simulation's segment name, zero-padded.
struct IpcHandle {
  static constexpr size_t kSize = 64;
  std::array<unsigned char, kSize> bytes{};

  std::string ToBytes() const { return std::string(bytes.begin(), bytes.end()); }
  // INVALID_ARGUMENT unless `s` is exactly kSize bytes.
  static absl::StatusOr<IpcHandle> FromBytes(const std::string& s);
};

// A GPU's identity that holds in every process of the node, whatever its
// CUDA_VISIBLE_DEVICES: the UUID ("GPU-8f6c..."), never the ordinal (a
// trainer under CUDA_VISIBLE_DEVICES=3 calls its GPU 0).
using DeviceId = std::string;

// Opaque per-implementation objects. Stream wraps cudaStream_t (CUstream),
// Event a cudaEvent_t (CUevent) created with cudaEventInterprocess |
// cudaEventDisableTiming.
struct Stream;
struct Event;

// The allocation that contains a pointer (user-pointer mode: caching
// allocators sub-allocate, so a tensor is `offset` bytes into `base`).
struct Allocation {
  void* base = nullptr;
  size_t size = 0;
  DeviceId device;
};

class TrainerDevice {
 public:
  virtual ~TrainerDevice() = default;

  // The GPU a device pointer lives on; INVALID_ARGUMENT if `ptr` is not
  // device memory of this process (a host pointer, a freed pointer).
  virtual absl::StatusOr<Allocation> FindAllocation(const void* ptr) = 0;
  // The GPU with this process's ordinal `ordinal`.
  virtual absl::StatusOr<DeviceId> IdOfOrdinal(int ordinal) = 0;

  // Maps a daemon-owned allocation (the flat gradient buffer) into this
  // process; returns its base. Close exactly once per successful Open.
  virtual absl::StatusOr<void*> OpenMemory(const DeviceId& device, const IpcHandle& handle) = 0;
  virtual absl::Status CloseMemory(void* base) = 0;
  // Exports an allocation base of this process (user-pointer mode).
  virtual absl::StatusOr<IpcHandle> ExportMemory(void* base) = 0;

  // An interprocess, timing-disabled event on `device`, and its handle.
  virtual absl::StatusOr<Event*> CreateEvent(const DeviceId& device) = 0;
  virtual absl::StatusOr<IpcHandle> ExportEvent(Event* event) = 0;
  virtual void DestroyEvent(Event* event) = 0;
  // Records `event` on `stream` (null: the legacy default stream). Never
  // synchronizes the host with the device.
  virtual absl::Status RecordEvent(Event* event, Stream* stream) = 0;
  // Makes `stream` (null: legacy default) wait, on the device, for
  // `event`'s latest recording (cuStreamWaitEvent): only ever for an event
  // this process recorded itself, so the wait completes without anyone
  // else. Never synchronizes the host. Used before re-recording a pooled
  // readiness event on another stream (client/cuda_tensors.h).
  virtual absl::Status StreamWaitEvent(Stream* stream, Event* event) = 0;
  // Zeroes `bytes` at `ptr` on `stream` (null: legacy default), async.
  virtual absl::Status MemsetAsync(void* ptr, size_t bytes, Stream* stream) = 0;
  // The GPU whose device memory `ptr` points into (this process's own
  // allocation or a mapping); NOT_FOUND when it is not device memory (a
  // pageable or pinned host pointer, managed memory): how gs_broadcast
  // tells a device buffer from a host one.
  virtual absl::StatusOr<DeviceId> DeviceOfPointer(const void* ptr) = 0;
  // Copies `bytes` from `src` to `dst`, both device memory this process
  // can address (its own or mapped), on `stream` (null: legacy default),
  // async (cuMemcpyDtoDAsync). gs_broadcast's pieces of a device buffer.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) = 0;
  // Wraps a caller's native stream handle (cudaStream_t); null = default.
  virtual Stream* WrapStream(void* native) = 0;
  // Waits until everything queued on `stream` (null: the legacy default
  // stream of `device`) has run: before a trainer unmaps memory its
  // kernels may still write. Polls; DEADLINE_EXCEEDED after `timeout`.
  virtual absl::Status SynchronizeStream(const DeviceId& device, Stream* stream,
                                         absl::Duration timeout) = 0;
};

// The outcome of polling an event or a stream.
enum class Completion { kDone, kPending };

// The NCCL communicators of one generation on this node: one rank per
// local GPU, created together and driven together (one thread owns them
// all, so init and every collective are grouped).
struct CollectiveOptions {
  int nranks = 1;                 // NCCL ranks in the whole job (GPUs, not trainers)
  int first_rank = 0;             // global rank of this node's first local GPU
  std::vector<DeviceId> devices;  // this node's GPUs, in rank order
  uint64_t generation = 0;
  absl::Duration timeout = absl::Seconds(300);
  // Publishes / fetches the unique id through the rendezvous store (the
  // node holding rank 0 publishes). Generation-scoped keys: a stale id is
  // never read. Both must respect the deadline, a MonotonicNow() time
  // (common/monotonic.h), never a wall-clock one.
  std::function<absl::Status(const std::string& key, const std::string& value)> publish;
  std::function<absl::StatusOr<std::string>(const std::string& key, absl::Time deadline)> fetch;
  // Polled (from the creating thread) while the group is being created: once
  // it returns true, creation gives up promptly with kCancelled (e.g. the
  // generation ended while a peer was still joining). Unset: never.
  // Additive (g-nccl): an unset field keeps the behaviour above.
  std::function<bool()> cancelled;
  // The device gate (gated_daemon_device.h), entered only around the phases
  // that allocate device memory or create/destroy communicators and
  // streams; never across a wait for other ranks (the unique id exchange,
  // the arrival of every rank before init), so a slow peer of a new job
  // does not hold up other jobs' collectives on these GPUs. An
  // implementation calls exit exactly once per successful enter. Unset:
  // nothing to enter.
  std::function<absl::Status(const char* what)> enter_memory_work;
  std::function<void()> exit_memory_work;
};

// One in-place sum over all ranks: `count` elements at device pointer
// `data` on local GPU `device_index` (index into CollectiveOptions.devices).
// For Broadcast, `count` is in bytes.
struct DeviceBuffer {
  int device_index = 0;
  void* data = nullptr;
  size_t count = 0;
};

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;  // aborts if still running, bounded
  // Sums every buffer in place across all ranks, launched as one group, and
  // returns once it has completed (or failed: kDeadlineExceeded after
  // `timeout`, kUnavailable on a peer's failure, kAborted after Abort). On
  // failure the group is aborted and unusable. The caller has already seen
  // every input's writes complete (events polled): the collective never
  // waits on a trainer's event.
  virtual absl::Status AllreduceSum(const std::vector<DeviceBuffer>& buffers, DType dtype) = 0;
  // Copies the `count` bytes of global rank `root`'s buffer into every
  // other rank's (ncclBroadcast, in place), one buffer per local rank,
  // launched as one group; completion, failure and abort as AllreduceSum.
  // gs_broadcast's pieces of device buffers (its staging slots).
  virtual absl::Status Broadcast(const std::vector<DeviceBuffer>& buffers, int root) = 0;
  // Makes an in-flight or future AllreduceSum fail promptly. Any thread.
  virtual void Abort(const std::string& reason) = 0;
};

// SumAsync's non-finite check (--nonfinite=error|skip).
struct NonFiniteCheck {
  uint32_t* flag = nullptr;  // device memory (Alloc) of the stream's GPU; null: no check
  uint32_t token = 0;        // what a hit stores: new per bucket, so the flag is never reset
};

class DaemonDevice {
 public:
  virtual ~DaemonDevice() = default;

  // "cuda" or "sim".
  virtual std::string name() const = 0;
  // INVALID_ARGUMENT naming `device` when no visible GPU has that id.
  virtual absl::Status CheckDevice(const DeviceId& device) = 0;

  // Daemon-owned device memory (flat gradient buffers, staging), zeroed.
  virtual absl::StatusOr<void*> Alloc(const DeviceId& device, size_t bytes) = 0;
  virtual absl::Status Free(const DeviceId& device, void* ptr) = 0;
  virtual absl::StatusOr<IpcHandle> ExportMemory(const DeviceId& device, void* base) = 0;

  // A trainer's allocation (user-pointer mode), mapped from its start.
  // Close exactly once per successful Open, and never while a collective
  // may be running on it.
  virtual absl::StatusOr<void*> OpenMemory(const DeviceId& device, const IpcHandle& handle) = 0;
  virtual absl::Status CloseMemory(const DeviceId& device, void* base) = 0;
  // The size in bytes of the allocation OpenMemory mapped at `base`, as the
  // device knows it (never the trainer's word): what the tensors placed in
  // it must fit, since a byte past it is an illegal address — a sticky
  // error that ends every job of the daemon.
  virtual absl::StatusOr<uint64_t> MappedSize(const DeviceId& device, void* base) = 0;

  // A trainer's readiness event. Query never blocks; an error (the trainer's
  // context died) is returned as such, not as kPending.
  virtual absl::StatusOr<Event*> OpenEvent(const DeviceId& device, const IpcHandle& handle) = 0;
  virtual absl::StatusOr<Completion> QueryEvent(Event* event) = 0;
  virtual void CloseEvent(Event* event) = 0;

  // The daemon's own streams (one per GPU it works on).
  virtual absl::StatusOr<Stream*> CreateStream(const DeviceId& device) = 0;
  virtual void DestroyStream(Stream* stream) = 0;
  virtual absl::StatusOr<Completion> QueryStream(Stream* stream) = 0;

  // Async on `stream`: copy, and dst = scale * sum_k srcs[k] elementwise
  // (fp16/bf16 accumulated in fp32; dst may be srcs[0]; nsrcs >= 1, all on
  // the stream's GPU). `scale` is double so that fp64 gradients are scaled
  // by 1/world_size in fp64 (a float 1/3 is off by 3e-8 relative); the
  // other types round it to fp32 once.
  // `check.flag` non-null: the non-finite check (gpu/local_sum.h): where a
  // result element is not finite dst receives srcs[0]'s element instead,
  // and *check.flag becomes check.token.
  virtual absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) = 0;
  virtual absl::Status SumAsync(void* dst, const std::vector<const void*>& srcs, size_t count,
                                DType dtype, double scale, const NonFiniteCheck& check,
                                Stream* stream) = 0;
  // Zeroes `bytes` of device memory at `dst` on `stream` (its GPU's), async:
  // a GPU none of whose trainers is active still adds its part (zeros) to
  // the collective.
  virtual absl::Status ZeroAsync(void* dst, size_t bytes, Stream* stream) = 0;

  // Host memory the device copies to and from without the host waiting
  // (cudaMallocHost; a copy into pageable memory would block until the
  // stream got there): where small results (the non-finite flag) are read
  // back. Memory work like Alloc (gated the same way).
  virtual absl::StatusOr<void*> AllocHost(const DeviceId& device, size_t bytes) = 0;
  virtual absl::Status FreeHost(const DeviceId& device, void* ptr) = 0;
  // Async on `stream`: device memory of the stream's GPU to or from `host`
  // (from AllocHost); the host sees or may reuse `host` once the stream is
  // seen done (QueryStream).
  virtual absl::Status CopyToHostAsync(void* host, const void* src, size_t bytes,
                                       Stream* stream) = 0;
  virtual absl::Status CopyFromHostAsync(void* dst, const void* host, size_t bytes,
                                         Stream* stream) = 0;

  // Creates the group's communicators (bounded by options.timeout, and by a
  // one-element warm-up collective so connection failures surface here).
  virtual absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateCollectives(
      const CollectiveOptions& options) = 0;
};

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_DEVICE_H_
