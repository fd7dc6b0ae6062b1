// The host simulation of the device seam (device.h), for tests only: the
// whole GPU data path runs on machines without a GPU, in real separate
// processes, and a missing wait shows up as a wrong result.
//
//   device memory  one shared-memory segment per allocation (mode 0600);
//                  the IPC handle is its name (plus a magic and a kind)
//   streams        a worker thread per stream running operations in order,
//                  each after a random delay (0-2 ms by default)
//   events         two shared counters (recorded, completed); the stream
//                  completes them in order; a pending event whose owner
//                  process died is UNAVAILABLE, never pending forever
//   collectives    in-process sum over local GPUs; across processes (one
//                  per simulated node) a shared-memory rendezvous whose
//                  name travels through CollectiveOptions.publish / fetch
//
// Selecting the simulated node (every process of a test sees the same one):
//   GRADSYNC_SIM_GPUS=N                N GPUs "SIM-GPU-0".."SIM-GPU-<N-1>"
//   GRADSYNC_SIM_VISIBLE_DEVICES=2,0   this process's ordinals (like
//                                      CUDA_VISIBLE_DEVICES; default: all)
//   GRADSYNC_SIM_MIN_DELAY_US / GRADSYNC_SIM_MAX_DELAY_US   per-operation
//                                      delay on a stream (default 0 / 2000)
//   GRADSYNC_SIM_LOSE_DEVICE_AT=OP     SimOptions::lose_device_at (tests of
//                                      the daemon's exit on a sticky error)
//   GRADSYNC_SIM_STALL_AT=OP           SimOptions::stall_at (tests of
//                                      cancelling a communicator init, and
//                                      of the scheduler's watchdog)
//   GRADSYNC_SIM_PREFIX=NAME           SimOptions::prefix (default gssim):
//                                      a test gives its processes one of
//                                      their own and removes it at the end
//                                      (tests/testing/sim_segment_prefix.h)
// or pass SimOptions to Create.
//
// What a trainer's framework does (allocate, launch the backward kernel
// that writes a gradient, synchronize) is on SimTrainerDevice next to the
// TrainerDevice interface: Alloc, CreateStream, WriteAsync, Synchronize.
// A test's "native stream" for WrapStream is the Stream* of CreateStream.
//
// Device pointers are host addresses in shared memory: a test may read or
// write them directly, once the stream or event that orders it is done —
// reading earlier is exactly the bug the simulation exists to expose.
//
// Differences from CUDA worth knowing: the legacy default stream (null) is
// an ordinary in-order stream per GPU and does not synchronize with the
// others; Free/Close never wait (queued operations keep their memory
// mapped).
//
// Refused as CUDA and NCCL refuse them (INVALID_ARGUMENT, saying which):
//   a process opening an IPC handle (memory or event) it exported itself;
//   exporting an event not created interprocess (CreateLocalEvent);
//   two ranks of one communicator on one GPU of one host, the host being
//   SimOptions::host (default $NCCL_HOSTID, else the machine's hostname),
//   as NCCL tells hosts apart — at creation, on every rank;
//   a kernel launch (WriteAsync, SumAsync) on a stream of another GPU than
//   the calling thread's current device, and recording an event on a stream
//   of another GPU (cudaErrorInvalidResourceHandle / CUDA_ERROR_INVALID_HANDLE).
//
// The current device (sim_current_device.h): per host thread, ordinal 0
// until SimTrainerDevice::SetDevice (cudaSetDevice). The daemon device's
// calls select their GPU as the real one does (CudaDeviceSwitch: a thread
// that never chose a device keeps the last one selected). Copies, stream
// waits and event queries work across devices, as in CUDA.
//
// Rules the simulation checks where CUDA leaves undefined behaviour or a
// deadlock (so that tests can assert them):
//   Free of an allocation a live process still maps  FAILED_PRECONDITION
//     naming that process (it is freed all the same; the mapping dangles)
//   an imported event queried after its owner destroyed it  FAILED_PRECONDITION
//   a daemon's Alloc/Free/OpenMemory/CloseMemory/CreateCollectives on a GPU
//     where one of its collectives is in flight  FAILED_PRECONDITION (CUDA
//     may synchronize the device and deadlock on the NCCL kernel; the
//     daemon's GatedDaemonDevice prevents it)
// DaemonDevice calls refuse a null stream: the daemon works on its own.
//
// Threads: as device.h, and every call is also safe from any thread.
// Fork before creating a device, or create new devices in the child.
#ifndef GRADSYNC_GPU_SIM_SIM_DEVICE_H_
#define GRADSYNC_GPU_SIM_SIM_DEVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/device.h"

namespace gradsync::gpu {

namespace sim {
class Node;
}  // namespace sim

struct SimOptions {
  int num_gpus = 1;
  std::vector<int> visible;  // this process's ordinal -> GPU index; empty: all
  absl::Duration min_op_delay = absl::ZeroDuration();
  absl::Duration max_op_delay = absl::Milliseconds(2);
  std::string prefix = "gssim";  // segment names "<prefix>.<pid>.<tag>..."
  // The host NCCL would see; empty: $NCCL_HOSTID, else the hostname.
  std::string host;
  // A daemon device's first call of this kind fails with a sticky error
  // (marked IsDeviceLost), and so does every later call: "alloc", "free",
  // "open_memory", "close_memory", "open_event", "create_collectives".
  std::string lose_device_at;
  // "create_collectives": the daemon device's CreateCollectives waits like
  // an NCCL init whose peer never joins — until CollectiveOptions::cancelled
  // (CANCELLED) or its timeout (DEADLINE_EXCEEDED) — after printing
  // "event=sim_stall point=create_collectives" to stderr.
  // "collective": the daemon device's AllreduceSum ignores its timeout, as
  // an NCCL kernel waiting for a stopped peer does: it returns only once
  // the peers arrive, one fails, or the group is aborted (tests of the
  // scheduler's watchdog).
  std::string stall_at;

  // From the GRADSYNC_SIM_* variables above; INVALID_ARGUMENT naming the
  // variable when one is malformed.
  static absl::StatusOr<SimOptions> FromEnv();
};

// "SIM-GPU-<index>".
DeviceId SimDeviceId(int index);
// options.host, else $NCCL_HOSTID, else the machine's hostname.
std::string SimHost(const SimOptions& options);

class SimTrainerDevice final : public TrainerDevice {
 public:
  static absl::StatusOr<std::unique_ptr<SimTrainerDevice>> Create(const SimOptions& options);
  static absl::StatusOr<std::unique_ptr<SimTrainerDevice>> CreateFromEnv();
  ~SimTrainerDevice() override;  // destroys its streams (running what is queued) and events

  // TrainerDevice.
  absl::StatusOr<Allocation> FindAllocation(const void* ptr) override;
  absl::StatusOr<DeviceId> IdOfOrdinal(int ordinal) override;
  absl::StatusOr<void*> OpenMemory(const DeviceId& device, const IpcHandle& handle) override;
  absl::Status CloseMemory(void* base) override;
  absl::StatusOr<IpcHandle> ExportMemory(void* base) override;
  absl::StatusOr<Event*> CreateEvent(const DeviceId& device) override;
  absl::StatusOr<IpcHandle> ExportEvent(Event* event) override;
  void DestroyEvent(Event* event) override;
  absl::Status RecordEvent(Event* event, Stream* stream) override;
  absl::Status StreamWaitEvent(Stream* stream, Event* event) override;
  absl::Status MemsetAsync(void* ptr, size_t bytes, Stream* stream) override;
  absl::StatusOr<DeviceId> DeviceOfPointer(const void* ptr) override;
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) override;
  Stream* WrapStream(void* native) override;
  absl::Status SynchronizeStream(const DeviceId& device, Stream* stream,
                                 absl::Duration timeout) override;

  // The framework's side (cudaMalloc, cudaFree, cudaStreamCreate, the
  // backward kernel, cudaStreamSynchronize). Memory is zeroed. Those naming
  // a device act on it as a framework's device guard would, leaving the
  // thread's current device as it was.
  // An event as cudaEventCreate makes one (default flags): usable in this
  // process, refused by ExportEvent as CUDA refuses it.
  absl::StatusOr<Event*> CreateLocalEvent(const DeviceId& device);
  absl::StatusOr<void*> Alloc(const DeviceId& device, size_t bytes);
  absl::Status Free(void* base);
  absl::StatusOr<Stream*> CreateStream(const DeviceId& device);
  void DestroyStream(Stream* stream);
  // Copies `bytes` from host `src` (captured now) to device `dst` on
  // `stream` (null: default stream of the current device), later: a
  // simulated kernel producing a gradient, so refused (INVALID_ARGUMENT)
  // when `stream` is not on the calling thread's current device.
  absl::Status WriteAsync(void* dst, const void* src, size_t bytes, Stream* stream);
  // cudaSetDevice / cudaGetDevice for the calling thread (any device of
  // this process; INVALID_ARGUMENT naming an unknown one).
  absl::Status SetDevice(const DeviceId& device);
  DeviceId CurrentDevice() const;
  // DEADLINE_EXCEEDED if `stream` (null: every default stream) still has
  // work after `timeout`.
  absl::Status Synchronize(Stream* stream, absl::Duration timeout = absl::Seconds(10));

 private:
  explicit SimTrainerDevice(std::unique_ptr<sim::Node> node);
  absl::StatusOr<Event*> NewEvent(const DeviceId& device, bool interprocess);
  std::unique_ptr<sim::Node> node_;
};

class SimDaemonDevice final : public DaemonDevice {
 public:
  static absl::StatusOr<std::unique_ptr<SimDaemonDevice>> Create(const SimOptions& options);
  static absl::StatusOr<std::unique_ptr<SimDaemonDevice>> CreateFromEnv();
  ~SimDaemonDevice() override;

  // DaemonDevice.
  std::string name() const override { return "sim"; }
  absl::Status CheckDevice(const DeviceId& device) override;
  absl::StatusOr<void*> Alloc(const DeviceId& device, size_t bytes) override;
  absl::Status Free(const DeviceId& device, void* ptr) override;
  absl::StatusOr<IpcHandle> ExportMemory(const DeviceId& device, void* base) override;
  absl::StatusOr<void*> OpenMemory(const DeviceId& device, const IpcHandle& handle) override;
  absl::Status CloseMemory(const DeviceId& device, void* base) override;
  absl::StatusOr<uint64_t> MappedSize(const DeviceId& device, void* base) override;
  absl::StatusOr<Event*> OpenEvent(const DeviceId& device, const IpcHandle& handle) override;
  absl::StatusOr<Completion> QueryEvent(Event* event) override;
  void CloseEvent(Event* event) override;
  absl::StatusOr<Stream*> CreateStream(const DeviceId& device) override;
  void DestroyStream(Stream* stream) override;
  absl::StatusOr<Completion> QueryStream(Stream* stream) override;
  absl::Status CopyAsync(void* dst, const void* src, size_t bytes, Stream* stream) override;
  absl::Status ZeroAsync(void* dst, size_t bytes, Stream* stream) override;
  absl::Status SumAsync(void* dst, const std::vector<const void*>& srcs, size_t count, DType dtype,
                        double scale, const NonFiniteCheck& check, Stream* stream) override;
  // Plain process memory (the simulation has no pinned memory); copies
  // must stay within one block of it.
  absl::StatusOr<void*> AllocHost(const DeviceId& device, size_t bytes) override;
  absl::Status FreeHost(const DeviceId& device, void* ptr) override;
  absl::Status CopyToHostAsync(void* host, const void* src, size_t bytes, Stream* stream) override;
  absl::Status CopyFromHostAsync(void* dst, const void* host, size_t bytes,
                                 Stream* stream) override;
  absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateCollectives(
      const CollectiveOptions& options) override;

  // Test hook: DEADLINE_EXCEEDED if `stream` still has work after `timeout`.
  absl::Status Synchronize(Stream* stream, absl::Duration timeout = absl::Seconds(10));

 private:
  explicit SimDaemonDevice(std::unique_ptr<sim::Node> node);
  // OK, or the simulated sticky error (SimOptions::lose_device_at).
  absl::Status Lost(const char* op);
  // The AllocHost block holding [host, host + bytes): INVALID_ARGUMENT
  // otherwise. Queued copies hold it, so a FreeHost never frees under them.
  absl::StatusOr<std::shared_ptr<std::vector<uint8_t>>> HostBlock(const void* host, size_t bytes,
                                                                  const char* what);
  std::unique_ptr<sim::Node> node_;
  std::atomic<bool> lost_{false};
  absl::Mutex host_mu_;
  std::map<const uint8_t*, std::shared_ptr<std::vector<uint8_t>>> host_ ABSL_GUARDED_BY(host_mu_);
};

// Test hooks on any simulated stream: hold its queued work until resumed,
// so "not yet written" is certain rather than likely. INVALID_ARGUMENT if
// `stream` is not a live simulated stream.
absl::Status SimPauseStream(Stream* stream);
absl::Status SimResumeStream(Stream* stream);

// Removes the segments of dead processes (a SIGKILLed trainer's memory and
// events) named with `prefix`; returns their names.
std::vector<std::string> RemoveStaleSimSegments(const std::string& prefix = "gssim");

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_SIM_SIM_DEVICE_H_
