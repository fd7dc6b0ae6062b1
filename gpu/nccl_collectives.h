// The NCCL CollectiveGroup: one NCCL rank per local GPU, all driven by one
// thread (see device.h). Part of gpu/cuda_daemon_device; usable alone.
//
// Creation (bounded by options.timeout, measured on a monotonic clock):
//   1. NCCL is loaded (gpu/nccl_loader: dlopen, version checks,
//      NCCL_COMM_BLOCKING=0 forced); NCCL_COMM_ID set is refused (it makes
//      every generation share one bootstrap address and magic).
//   2. options.devices (GPU UUIDs) are mapped to this process's ordinals.
//   3. The unique id: the node holding global rank 0 (first_rank == 0) calls
//      ncclGetUniqueId and publishes it, hex, under
//      NcclUniqueIdKey(generation); the others fetch it. Not exchanged at
//      all when this node holds every rank. One init attempt per key: a
//      failed generation is never retried under the same key.
//   4. Every local communicator is created in one ncclGroupStart/End with
//      ncclCommInitRankConfig(config.blocking = 0), then polled with
//      ncclCommGetAsyncError until ready.
//   5. A one-element warm-up ncclAllReduce: NCCL connects peers lazily on the
//      first collective (NCCL_RUNTIME_CONNECT=1), so without it a peer that
//      cannot be reached would fail the first real bucket instead of init.
// options.cancelled is polled throughout (kCancelled). Errors:
// kDeadlineExceeded (a peer did not join in time), kUnavailable (NCCL or a
// peer failed; no device), kInvalidArgument (bad options, unknown GPU),
// kFailedPrecondition (NCCL missing or misconfigured; too many leaked
// bootstrap listeners, marked IsDeviceLost: the daemon exits).
//
// AllreduceSum: ncclSum (never ncclAvg: the caller pre-scales in fp32 in its
// local-sum kernel, which is exact where ncclAvg's per-dtype 1/nranks is not,
// and ncclAvg disables NVLS), all buffers in one group, then completion
// polled from the host. Buffers must live on their rank's GPU (the caller
// checks at registration; debug builds re-check here).
//
// Trainer events: the group never waits on them. A
// cudaStreamWaitEvent on a trainer's IPC event would make NCCL's internal
// stream depend on a foreign process, and abort/finalize would hang when
// that trainer died. The caller polls each trainer's event with
// cudaEventQuery within its deadline and calls AllreduceSum only after all
// completed.
//
// Failure and abort: see nccl_collectives.cc (the abort thread, its
// deadline, and the _exit when NCCL does not return from ncclCommAbort).
#ifndef GRADSYNC_GPU_NCCL_COLLECTIVES_H_
#define GRADSYNC_GPU_NCCL_COLLECTIVES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gpu/device.h"

namespace gradsync::gpu {

absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateNcclCollectives(
    const CollectiveOptions& options);

// Loads NCCL now (gpu/nccl_loader), forcing NCCL_COMM_BLOCKING=0. Call it
// from main before any other thread runs: setenv is not safe against a
// concurrent getenv, and CreateNcclCollectives would otherwise do it on a
// job's thread, with gRPC's threads running. The error (no NCCL) is kept
// and returned again by CreateNcclCollectives.
absl::Status LoadNcclBeforeThreads();

// The key of a generation's unique id, as passed to options.publish/fetch.
// The caller's store should scope it further to the job.
std::string NcclUniqueIdKey(uint64_t generation);

// How long an ncclCommAbort may take before the daemon gives up on NCCL and
// _exit()s with kAbortOverrunExitCode (the supervisor restarts it). Abort
// waits for NCCL work in flight; it is known to hang on some failures
// (NVIDIA/nccl#829, #1013), and a daemon stuck there would hang every
// trainer of the node for good.
inline constexpr absl::Duration kAbortDeadline = absl::Seconds(30);
inline constexpr int kAbortOverrunExitCode = 70;

// Creations on the rank-0 node that failed after ncclGetUniqueId: each
// leaves NCCL's bootstrap root thread and its socket behind (it exits only
// once every rank connected). Past kMaxLeakedBootstrapRoots creation
// refuses with kFailedPrecondition marked IsDeviceLost (device.h): the
// daemon exits with kDeviceLostExitCode and its supervisor restarts it.
inline constexpr int kMaxLeakedBootstrapRoots = 16;
int LeakedBootstrapRoots();

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_NCCL_COLLECTIVES_H_
