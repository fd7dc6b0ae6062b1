#include "gpu/device_gate.h"

#include "absl/strings/str_cat.h"
#include "common/monotonic.h"

namespace gradsync::gpu {

absl::Status DeviceGate::EnterCollective(const std::vector<DeviceId>& devices, absl::Time deadline,
                                         const std::atomic<bool>* cancelled) {
  MonotonicMutexLock lock(&mu_);
  auto open = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled != nullptr && cancelled->load(std::memory_order_acquire)) return true;
    for (const DeviceId& d : devices) {
      const PerDevice& p = devices_[d];
      if (p.memory_work || p.memory_waiting > 0) return false;
    }
    return true;
  };
  // Monotonic deadline turned into a timeout (MonotonicMutex waits on steady_clock).
  const bool opened = mu_.AwaitWithTimeout(absl::Condition(&open), deadline - MonotonicNow());
  if (cancelled != nullptr && cancelled->load(std::memory_order_acquire)) {
    return absl::AbortedError("collective aborted while waiting for its GPUs' memory work");
  }
  if (!opened) {
    return absl::DeadlineExceededError(
        "memory work (allocation, free or IPC mapping) held this group's GPUs past the "
        "collective's deadline");
  }
  for (const DeviceId& d : devices) ++devices_[d].collectives;
  return absl::OkStatus();
}

void DeviceGate::ExitCollective(const std::vector<DeviceId>& devices) {
  MonotonicMutexLock lock(&mu_);
  for (const DeviceId& d : devices) --devices_[d].collectives;
}

absl::Status DeviceGate::EnterMemoryWork(const std::vector<DeviceId>& devices, absl::Time deadline,
                                         absl::string_view what) {
  MonotonicMutexLock lock(&mu_);
  for (const DeviceId& d : devices) ++devices_[d].memory_waiting;
  auto idle = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const DeviceId& d : devices) {
      const PerDevice& p = devices_[d];
      if (p.memory_work || p.collectives > 0) return false;
    }
    return true;
  };
  const bool got = mu_.AwaitWithTimeout(absl::Condition(&idle), deadline - MonotonicNow());
  for (const DeviceId& d : devices) --devices_[d].memory_waiting;
  if (!got) {
    std::string busy;
    for (const DeviceId& d : devices) {
      const PerDevice& p = devices_[d];
      if (p.collectives > 0)
        busy = absl::StrCat("GPU ", d, " still runs ", p.collectives, " collective(s)");
      else if (p.memory_work)
        busy = absl::StrCat("GPU ", d, " is busy with other memory work");
    }
    return absl::DeadlineExceededError(
        absl::StrCat(what, " not started: ", busy,
                     " (it could synchronize the device and deadlock on a running NCCL kernel)"));
  }
  for (const DeviceId& d : devices) devices_[d].memory_work = true;
  return absl::OkStatus();
}

void DeviceGate::ExitMemoryWork(const std::vector<DeviceId>& devices) {
  MonotonicMutexLock lock(&mu_);
  for (const DeviceId& d : devices) devices_[d].memory_work = false;
}

void DeviceGate::Wake() {
  // Releasing the lock makes MonotonicMutex re-evaluate the waiters' conditions.
  MonotonicMutexLock lock(&mu_);
}

int DeviceGate::collectives(const DeviceId& device) {
  MonotonicMutexLock lock(&mu_);
  return devices_[device].collectives;
}

int DeviceGate::memory_waiting(const DeviceId& device) {
  MonotonicMutexLock lock(&mu_);
  return devices_[device].memory_waiting;
}

}  // namespace gradsync::gpu
