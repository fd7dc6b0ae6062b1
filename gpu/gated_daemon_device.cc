#include "gpu/gated_daemon_device.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/monotonic.h"
#include "common/status_macros.h"

namespace gradsync::gpu {
namespace {

// The group's collectives hold its GPUs shared; creating (NCCL's init
// allocates) and destroying it (frees) is memory work.
class GatedCollectiveGroup final : public CollectiveGroup {
 public:
  GatedCollectiveGroup(std::unique_ptr<CollectiveGroup> group, DeviceGate* gate,
                       std::vector<DeviceId> devices, absl::Duration timeout,
                       absl::Duration memory_wait)
      : group_(std::move(group)),
        gate_(gate),
        devices_(std::move(devices)),
        timeout_(timeout),
        memory_wait_(memory_wait) {}

  ~GatedCollectiveGroup() override {
    const absl::Status st = gate_->EnterMemoryWork(devices_, MonotonicNow() + memory_wait_,
                                                   "destroying the communicators");
    group_.reset();  // even past the wait: a leaked communicator keeps its threads
    if (st.ok()) gate_->ExitMemoryWork(devices_);
  }

  absl::Status AllreduceSum(const std::vector<DeviceBuffer>& buffers, DType dtype) override {
    return Gated([&] { return group_->AllreduceSum(buffers, dtype); });
  }
  absl::Status Broadcast(const std::vector<DeviceBuffer>& buffers, int root) override {
    return Gated([&] { return group_->Broadcast(buffers, root); });
  }

  void Abort(const std::string& reason) override {
    aborted_.store(true, std::memory_order_release);
    group_->Abort(reason);
    gate_->Wake();
  }

 private:
  // Runs `collective` holding the group's GPUs shared.
  template <typename Fn>
  absl::Status Gated(Fn collective) {
    if (absl::Status st = gate_->EnterCollective(devices_, MonotonicNow() + timeout_, &aborted_);
        !st.ok()) {
      // The contract: a failed collective leaves the group aborted.
      group_->Abort(std::string(st.message()));
      return st;
    }
    absl::Status st = collective();
    gate_->ExitCollective(devices_);
    return st;
  }

  std::unique_ptr<CollectiveGroup> group_;
  DeviceGate* const gate_;
  const std::vector<DeviceId> devices_;
  const absl::Duration timeout_;
  const absl::Duration memory_wait_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

GatedDaemonDevice::GatedDaemonDevice(std::unique_ptr<DaemonDevice> device,
                                     absl::Duration memory_wait)
    : device_(std::move(device)), memory_wait_(memory_wait) {}

absl::StatusOr<void*> GatedDaemonDevice::Alloc(const DeviceId& device, size_t bytes) {
  RETURN_IF_ERROR(gate_.EnterMemoryWork({device}, MonotonicNow() + memory_wait_,
                                        absl::StrCat("allocating ", bytes, " bytes")));
  absl::StatusOr<void*> out = device_->Alloc(device, bytes);
  gate_.ExitMemoryWork({device});
  return out;
}

absl::Status GatedDaemonDevice::Free(const DeviceId& device, void* ptr) {
  // Not admitted: the memory is leaked rather than risk the deadlock.
  RETURN_IF_ERROR(gate_.EnterMemoryWork({device}, MonotonicNow() + memory_wait_, "freeing"));
  absl::Status out = device_->Free(device, ptr);
  gate_.ExitMemoryWork({device});
  return out;
}

// Pinned host memory: cudaHostAlloc/cudaFreeHost can wait on the device's
// running work, as cudaMalloc/cudaFree can.
absl::StatusOr<void*> GatedDaemonDevice::AllocHost(const DeviceId& device, size_t bytes) {
  RETURN_IF_ERROR(
      gate_.EnterMemoryWork({device}, MonotonicNow() + memory_wait_,
                            absl::StrCat("allocating ", bytes, " bytes of host memory")));
  absl::StatusOr<void*> out = device_->AllocHost(device, bytes);
  gate_.ExitMemoryWork({device});
  return out;
}

absl::Status GatedDaemonDevice::FreeHost(const DeviceId& device, void* ptr) {
  RETURN_IF_ERROR(
      gate_.EnterMemoryWork({device}, MonotonicNow() + memory_wait_, "freeing host memory"));
  absl::Status out = device_->FreeHost(device, ptr);
  gate_.ExitMemoryWork({device});
  return out;
}

absl::StatusOr<void*> GatedDaemonDevice::OpenMemory(const DeviceId& device,
                                                    const IpcHandle& handle) {
  RETURN_IF_ERROR(gate_.EnterMemoryWork({device}, MonotonicNow() + memory_wait_,
                                        "opening an IPC memory handle"));
  absl::StatusOr<void*> out = device_->OpenMemory(device, handle);
  gate_.ExitMemoryWork({device});
  return out;
}

absl::Status GatedDaemonDevice::CloseMemory(const DeviceId& device, void* base) {
  RETURN_IF_ERROR(gate_.EnterMemoryWork({device}, MonotonicNow() + memory_wait_,
                                        "closing an IPC memory handle"));
  absl::Status out = device_->CloseMemory(device, base);
  gate_.ExitMemoryWork({device});
  return out;
}

absl::StatusOr<std::unique_ptr<CollectiveGroup>> GatedDaemonDevice::CreateCollectives(
    const CollectiveOptions& options) {
  // The device enters the gate only around its allocating phases (streams,
  // NCCL init and warm-up, a failed group's destruction), not while it
  // waits for remote ranks: other jobs' collectives on these GPUs pause
  // only while memory work really runs.
  CollectiveOptions gated = options;
  gated.enter_memory_work = [this, devices = options.devices](const char* what) {
    return gate_.EnterMemoryWork(devices, MonotonicNow() + memory_wait_, what);
  };
  gated.exit_memory_work = [this, devices = options.devices] { gate_.ExitMemoryWork(devices); };
  ASSIGN_OR_RETURN(std::unique_ptr<CollectiveGroup> group, device_->CreateCollectives(gated));
  return std::unique_ptr<CollectiveGroup>(new GatedCollectiveGroup(
      std::move(group), &gate_, options.devices, options.timeout, memory_wait_));
}

}  // namespace gradsync::gpu
