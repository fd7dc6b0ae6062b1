// DeviceGate: per GPU of this process, memory management never overlaps a
// collective, whichever job runs either.
//
// Why: cudaMalloc, cudaFree, cudaIpcOpenMemHandle / cudaIpcCloseMemHandle
// and NCCL's own communicator creation and destruction (which allocate and
// free device memory) may synchronize the device, i.e. wait for every
// kernel on it; an NCCL kernel waits for its peers, whose progress may need
// this very thread (NCCL user guide, "Using multiple NCCL communicators
// concurrently"; NVIDIA/nccl#194, #787; the XLA fix for JAX#11637). The
// daemon reaches this when one job's collectives still run while another's
// buffers are allocated or freed (a finished job released while the next
// one starts on the same GPU).
//
// Rule: collectives hold their GPUs shared (several may run at once),
// memory work holds them exclusively and waits for the collectives in
// flight there to end. A waiting memory call blocks new collectives
// (writer preference), so a busy job cannot starve a new one. Every wait
// has a deadline; nothing is held across a wait that can block forever:
// a collective is bounded by its group's timeout (then aborted), memory
// work by the device call itself with no collective running.
//
// Threads: every method is thread-safe.
#ifndef GRADSYNC_GPU_DEVICE_GATE_H_
#define GRADSYNC_GPU_DEVICE_GATE_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/monotonic_mutex.h"
#include "gpu/device.h"

namespace gradsync::gpu {

class DeviceGate {
 public:
  // Deadlines are MonotonicNow() times (common/monotonic.h). DEADLINE_EXCEEDED
  // names the GPU and what held it; ABORTED once *cancelled is true (Wake
  // makes a waiter look at it).
  absl::Status EnterCollective(const std::vector<DeviceId>& devices, absl::Time deadline,
                               const std::atomic<bool>* cancelled);
  void ExitCollective(const std::vector<DeviceId>& devices);
  absl::Status EnterMemoryWork(const std::vector<DeviceId>& devices, absl::Time deadline,
                               absl::string_view what);
  void ExitMemoryWork(const std::vector<DeviceId>& devices);
  void Wake();

  // For tests: collectives in flight / memory calls waiting on `device`.
  int collectives(const DeviceId& device);
  int memory_waiting(const DeviceId& device);

 private:
  struct PerDevice {
    int collectives = 0;  // in flight
    bool memory_work = false;
    int memory_waiting = 0;  // blocks new collectives
  };

  MonotonicMutex mu_;
  absl::flat_hash_map<DeviceId, PerDevice> devices_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_DEVICE_GATE_H_
