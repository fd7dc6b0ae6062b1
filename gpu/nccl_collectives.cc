#include "gpu/nccl_collectives.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_macros.h"
#include "gpu/cuda_device_switch.h"
#include "gpu/cuda_status.h"
#include "gpu/cuda_uuid.h"
#include "gpu/nccl_loader.h"
#include "spdlog/spdlog.h"

// Invariants this file keeps (the review's list, as far as it concerns the
// collective layer; the others are the caller's and are stated in
// nccl_collectives.h and device.h):
//  I1 One thread owns every local rank: it creates all communicators in one
//     NCCL group and launches every collective in one group. Abort() from
//     other threads only raises a flag; no other thread ever touches a
//     communicator, so nothing here needs a lock around NCCL.
//  I2 Nothing blocks without a bound. Communicators are non-blocking
//     (config.blocking = 0, NCCL_COMM_BLOCKING forced to 0 by the loader);
//     init, collectives and finalize are polled against a deadline on the
//     steady clock; ncclCommAbort runs on its own thread with kAbortDeadline
//     and an overrun ends the process (_exit), the one deliberate exit.
//  I3 A failed or aborted call returns only after ncclCommAbort returned on
//     every communicator: the caller may then close IPC mappings and free
//     buffers, no NCCL kernel can still touch them.
//  I4 The NCCL streams never wait on a foreign (trainer) event.
//  I5 No cudaMalloc/cudaFree while a collective may run: the warm-up buffers
//     are allocated before the first collective and freed after it was seen
//     complete (or after the abort returned).
//  I6 A generation is created once per unique-id key; a failed group stays
//     failed (sticky status) and is replaced, never re-initialized.
//  I7 Ranks are identified by GPU UUID, mapped to ordinals here; the current
//     device of the calling thread is changed only when needed and restored
//     only if changed.

namespace gradsync::gpu {
namespace {

// Deadlines on the monotonic clock; absl::Now() is the wall
// clock, which NTP may step.
using Clock = std::chrono::steady_clock;

Clock::duration ToClock(absl::Duration d) {
  // Capped, so that now() + d cannot overflow for an "infinite" timeout.
  return std::chrono::duration_cast<Clock::duration>(
      absl::ToChronoNanoseconds(std::min(d, absl::Hours(24 * 365))));
}

std::atomic<int> leaked_bootstrap_roots{0};

// Polling pause. A small allreduce completes in tens of
// microseconds, so the first rounds only yield; then sleeps double up to
// 50 µs, which bounds how late a completion is noticed. (Linux adds the
// thread's timer slack, 50 µs by default, to each sleep: a step is
// ~55-100 µs in practice, against up to 1 ms before.)
class Backoff {
 public:
  void Pause() {
    if (rounds_ < kYieldRounds) {
      ++rounds_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }

 private:
  static constexpr int kYieldRounds = 64;
  static constexpr std::chrono::microseconds kMaxSleep{50};
  std::chrono::microseconds sleep_{4};
  int rounds_ = 0;
};

// CudaDeviceSwitch (cuda_device_switch.h) switches only when
// needed and restores only where the thread had a context before.
using DeviceGuard = CudaDeviceSwitch;

absl::Status CudaError(cudaError_t err, absl::string_view what) {
  // A sticky error (e.g. an illegal address in an NCCL kernel, seen by the
  // completion poll) carries the same mark as the device's own calls, so the
  // scheduler exits the daemon whichever layer saw it (cuda_status.h).
  if (IsStickyCudaError(err)) return CudaRuntimeError(err, what);
  // No device / no driver is an environment problem.
  const bool unavailable = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver;
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  return unavailable ? absl::UnavailableError(msg) : absl::InternalError(msg);
}

// ncclGetLastError reads one process-wide buffer that NCCL
// never clears, so its text may describe an older failure.
absl::Status NcclError(const NcclApi& nccl, ncclResult_t result, absl::string_view what,
                       absl::StatusCode code) {
  const char* last = nccl.GetLastError(nullptr);
  return absl::Status(
      code, absl::StrCat(what, ": ", nccl.GetErrorString(result),
                         (last != nullptr && *last != '\0')
                             ? absl::StrCat(" (last NCCL error, possibly unrelated: ", last, ")")
                             : std::string()));
}

// Non-blocking communicators may answer ncclInProgress to any call.
bool Accepted(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

bool ToNcclDataType(DType dtype, ncclDataType_t* out) {
  switch (dtype) {
    case DType::kFloat32:
      *out = ncclFloat32;
      return true;
    case DType::kFloat64:
      *out = ncclFloat64;
      return true;
    case DType::kFloat16:
      *out = ncclFloat16;
      return true;
    case DType::kBFloat16:
      *out = ncclBfloat16;
      return true;
  }
  return false;
}

// ncclCommAbort waits for NCCL work in flight and is known to
// hang on some failures. It runs on a thread of its own while the caller
// waits at most kAbortDeadline; past that the process ends, so that the
// supervisor restarts the daemon instead of every trainer of the node
// hanging. The caller holds no lock that anyone needs (see I1).
void AbortWithDeadline(const NcclApi& nccl, std::vector<ncclComm_t> comms,
                       const std::string& group) {
  if (comms.empty()) return;
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::vector<ncclResult_t> results;
  };
  auto done = std::make_shared<Done>();
  const NcclApi* api = &nccl;
  std::thread aborter([api, comms, done] {
    std::vector<ncclResult_t> results;
    for (ncclComm_t c : comms) results.push_back(api->CommAbort(c));
    std::lock_guard<std::mutex> lock(done->mu);
    done->results = std::move(results);
    done->done = true;
    done->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(done->mu);
  if (!done->cv.wait_until(lock, Clock::now() + ToClock(kAbortDeadline),
                           [&] { return done->done; })) {
    const std::string msg =
        absl::StrCat("ncclCommAbort did not return within ", absl::FormatDuration(kAbortDeadline),
                     " on ", group, "; exiting with status ", kAbortOverrunExitCode,
                     " so that the supervisor restarts the daemon");
    spdlog::critical("event=nccl_abort_overrun error={}", LogValue(msg));
    spdlog::default_logger()->flush();
    std::fprintf(stderr, "gradsyncd: %s\n", msg.c_str());
    std::fflush(stderr);
    _exit(kAbortOverrunExitCode);
  }
  for (ncclResult_t r : done->results) {
    if (r != ncclSuccess) {
      // The communicator is gone whatever abort returned.
      spdlog::warn("event=nccl_abort_failed group={} error={}", LogValue(group),
                   LogValue(nccl.GetErrorString(r)));
    }
  }
  lock.unlock();
  aborter.join();
}

class NcclCollectives final : public CollectiveGroup {
 public:
  struct Rank {
    int rank = 0;
    int ordinal = 0;
    DeviceId id;
    ncclComm_t comm = nullptr;  // null once aborted or destroyed
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
  };

  NcclCollectives(const NcclApi& nccl, const CollectiveOptions& options, std::vector<Rank> ranks)
      : nccl_(nccl),
        nranks_(options.nranks),
        generation_(options.generation),
        timeout_(ToClock(options.timeout)),
        timeout_text_(absl::FormatDuration(options.timeout)),
        ranks_(std::move(ranks)) {
    describe_ = absl::StrCat("ranks ",
                             absl::StrJoin(ranks_, ", ",
                                           [](std::string* out, const Rank& r) {
                                             absl::StrAppend(out, r.rank, " (", r.id, " ordinal ",
                                                             r.ordinal, ")");
                                           }),
                             " of nranks=", nranks_, " generation=", generation_);
  }
  ~NcclCollectives() override;

  absl::Status CreateStreams();
  absl::Status Init(const ncclUniqueId& id, Clock::time_point deadline,
                    const std::function<bool()>& cancelled);
  absl::Status AllreduceSum(const std::vector<DeviceBuffer>& buffers, DType dtype) override;
  absl::Status Broadcast(const std::vector<DeviceBuffer>& buffers, int root) override;
  void Abort(const std::string& reason) override;

  const std::string& describe() const { return describe_; }

 private:
  // One grouped ncclAllReduce(ncclSum), in place; with root >= 0 one
  // grouped ncclBroadcast from that global rank instead.
  absl::Status Launch(const std::vector<DeviceBuffer>& buffers, ncclDataType_t type,
                      absl::string_view what, int root = -1);
  // The checks every collective makes before launching: one buffer per
  // local rank, equal counts, no null data (debug builds: on its GPU).
  absl::Status CheckBuffers(const std::vector<DeviceBuffer>& buffers, absl::string_view what);
  // Polls every communicator until ready and, with `events`, records each
  // rank's completion event once its communicator accepted the work and
  // waits for it. Fails (aborting) on error, deadline, Abort or `cancelled`.
  absl::Status Poll(absl::string_view what, bool events, Clock::time_point deadline,
                    const std::function<bool()>* cancelled, DeviceGuard& guard);
  // Records the first failure, aborts every communicator (bounded) and
  // returns `status`: a failed call returns after the abort finished (I3).
  absl::Status Fail(absl::Status status);
  void AbortComms();
  absl::Status AbortedStatus(absl::string_view what);

  const NcclApi& nccl_;
  const int nranks_;
  const uint64_t generation_;
  const Clock::duration timeout_;
  const std::string timeout_text_;
  std::string describe_;  // built once; messages are built only on error
  // Owned by the thread that created the group (I1).
  std::vector<Rank> ranks_;
  absl::Status failure_;  // sticky

  std::atomic<bool> abort_requested_{false};
  std::mutex reason_mu_;  // guards abort_reason_ only; never held across NCCL/CUDA
  std::string abort_reason_;
};

absl::Status NcclCollectives::CreateStreams() {
  DeviceGuard guard;
  for (Rank& r : ranks_) {
    const std::string where = absl::StrCat("nccl rank ", r.rank, " on ", r.id);
    if (cudaError_t err = guard.Use(r.ordinal); err != cudaSuccess) {
      return CudaError(err, absl::StrCat(where, ": cudaSetDevice(", r.ordinal, ")"));
    }
    // Non-blocking: nothing on the legacy default stream (the daemon's or
    // a library's) can serialize with or hold up the collective.
    if (cudaError_t err = cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking);
        err != cudaSuccess) {
      r.stream = nullptr;
      return CudaError(err, absl::StrCat(where, ": cudaStreamCreateWithFlags"));
    }
    if (cudaError_t err = cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming);
        err != cudaSuccess) {
      r.done = nullptr;
      return CudaError(err, absl::StrCat(where, ": cudaEventCreateWithFlags"));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclCollectives::Init(const ncclUniqueId& id, Clock::time_point deadline,
                                   const std::function<bool()>& cancelled) {
  DeviceGuard guard;
  // I1: every local rank in one group; otherwise the first init would wait
  // for the second, which this thread never reaches.
  absl::Status status;
  if (ncclResult_t r = nccl_.GroupStart(); r != ncclSuccess) {
    return NcclError(nccl_, r, absl::StrCat("nccl init of ", describe_, ": ncclGroupStart"),
                     absl::StatusCode::kInternal);
  }
  for (Rank& r : ranks_) {
    if (cudaError_t err = guard.Use(r.ordinal); err != cudaSuccess) {
      status = CudaError(
          err, absl::StrCat("nccl init of ", describe_, ": cudaSetDevice(", r.ordinal, ")"));
      break;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // I2: a dead peer leaves init pending, not hung
    ncclResult_t res = nccl_.CommInitRankConfig(&r.comm, nranks_, id, r.rank, &config);
    if (!Accepted(res)) {
      status = NcclError(
          nccl_, res,
          absl::StrCat("nccl init of ", describe_, ": ncclCommInitRankConfig(rank=", r.rank, ")"),
          absl::StatusCode::kUnavailable);
      break;
    }
  }
  // The group is closed even when a call inside it failed.
  if (ncclResult_t r = nccl_.GroupEnd(); !Accepted(r) && status.ok()) {
    status = NcclError(nccl_, r, absl::StrCat("nccl init of ", describe_, ": ncclGroupEnd"),
                       absl::StatusCode::kUnavailable);
  }
  for (const Rank& r : ranks_) {
    if (status.ok() && r.comm == nullptr) {
      status = absl::InternalError(
          absl::StrCat("nccl init of ", describe_, ": no communicator for rank ", r.rank));
    }
  }
  if (!status.ok()) return Fail(status);
  RETURN_IF_ERROR(Poll("nccl init", /*events=*/false, deadline, &cancelled, guard));

  // Connect now. One float per rank, allocated before any
  // collective and freed after it completed (I5).
  std::vector<DeviceBuffer> warmup;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    void* p = nullptr;
    cudaError_t err = guard.Use(r.ordinal);
    if (err == cudaSuccess) err = cudaMalloc(&p, sizeof(float));
    if (err == cudaSuccess) {
      warmup.push_back(DeviceBuffer{static_cast<int>(i), p, 1});
      err = cudaMemsetAsync(p, 0, sizeof(float), r.stream);  // same stream: ordered
    }
    if (err != cudaSuccess) {
      status = Fail(CudaError(err, absl::StrCat("nccl warm-up of ", describe_, " on ", r.id)));
      break;
    }
  }
  if (status.ok()) status = Launch(warmup, ncclFloat32, "nccl warm-up allreduce");
  if (status.ok()) {
    status = Poll("nccl warm-up allreduce (connecting to peers)", /*events=*/true, deadline,
                  &cancelled, guard);
  }
  // Done or aborted: no kernel uses the buffers any more.
  for (const DeviceBuffer& b : warmup) {
    if (guard.Use(ranks_[b.device_index].ordinal) == cudaSuccess) cudaFree(b.data);
  }
  return status;
}

absl::Status NcclCollectives::Launch(const std::vector<DeviceBuffer>& buffers, ncclDataType_t type,
                                     absl::string_view what, int root) {
  absl::Status status;
  if (ncclResult_t r = nccl_.GroupStart(); r != ncclSuccess) {
    return Fail(NcclError(nccl_, r, absl::StrCat(what, " on ", describe_, ": ncclGroupStart"),
                          absl::StatusCode::kInternal));
  }
  for (const DeviceBuffer& b : buffers) {
    const Rank& r = ranks_[b.device_index];
    // ncclSum over inputs the caller pre-scaled in fp32; a broadcast is in
    // place (sendbuff == recvbuff), as NCCL allows.
    ncclResult_t res =
        root < 0 ? nccl_.AllReduce(b.data, b.data, b.count, type, ncclSum, r.comm, r.stream)
                 : nccl_.Broadcast(b.data, b.data, b.count, type, root, r.comm, r.stream);
    if (!Accepted(res)) {
      status = NcclError(
          nccl_, res,
          absl::StrCat(what, " on ", describe_, ": ", root < 0 ? "ncclAllReduce" : "ncclBroadcast",
                       "(rank=", r.rank, ")"),
          absl::StatusCode::kUnavailable);
      break;
    }
  }
  if (ncclResult_t r = nccl_.GroupEnd(); !Accepted(r) && status.ok()) {
    status = NcclError(nccl_, r, absl::StrCat(what, " on ", describe_, ": ncclGroupEnd"),
                       absl::StatusCode::kUnavailable);
  }
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

absl::Status NcclCollectives::Poll(absl::string_view what, bool events, Clock::time_point deadline,
                                   const std::function<bool()>* cancelled, DeviceGuard& guard) {
  // Per rank: the completion event was recorded. NCCL enqueues a
  // non-blocking group's kernels only when the communicator turns
  // ncclSuccess, so recording earlier would complete too soon.
  std::vector<char> recorded(ranks_.size(), 0);
  Backoff backoff;
  for (;;) {
    bool pending = false;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Rank& r = ranks_[i];
      ncclResult_t async = ncclSuccess;
      if (ncclResult_t res = nccl_.CommGetAsyncError(r.comm, &async); res != ncclSuccess) {
        return Fail(NcclError(
            nccl_, res,
            absl::StrCat(what, " on ", describe_, ": ncclCommGetAsyncError(rank=", r.rank, ")"),
            absl::StatusCode::kInternal));
      }
      if (async == ncclInProgress) {
        pending = true;
        continue;
      }
      if (async != ncclSuccess) {
        return Fail(NcclError(nccl_, async,
                              absl::StrCat(what, " on ", describe_, ": rank ", r.rank,
                                           " failed (a peer failed or is unreachable?)"),
                              absl::StatusCode::kUnavailable));
      }
      if (!events) continue;
      if (!recorded[i]) {
        cudaError_t err = guard.Use(r.ordinal);
        if (err == cudaSuccess) err = cudaEventRecord(r.done, r.stream);
        if (err != cudaSuccess) {
          return Fail(CudaError(
              err, absl::StrCat(what, " on ", describe_, ": rank ", r.rank, ": cudaEventRecord")));
        }
        recorded[i] = 1;
      }
      cudaError_t err = cudaEventQuery(r.done);
      if (err == cudaErrorNotReady) {
        pending = true;
      } else if (err != cudaSuccess) {
        return Fail(CudaError(
            err, absl::StrCat(what, " on ", describe_, ": rank ", r.rank, ": cudaEventQuery")));
      }
    }
    if (!pending) return absl::OkStatus();
    if (abort_requested_.load(std::memory_order_acquire)) return Fail(AbortedStatus(what));
    if (cancelled != nullptr && *cancelled && (*cancelled)()) {
      return Fail(absl::CancelledError(absl::StrCat(what, " on ", describe_, ": cancelled")));
    }
    if (Clock::now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, " on ", describe_, ": not complete after ", timeout_text_,
                       " (a peer rank did not join, is dead or is stuck?)")));
    }
    backoff.Pause();
  }
}

absl::Status NcclCollectives::AbortedStatus(absl::string_view what) {
  std::lock_guard<std::mutex> lock(reason_mu_);
  return absl::AbortedError(absl::StrCat(what, " on ", describe_, ": aborted: ", abort_reason_));
}

absl::Status NcclCollectives::Fail(absl::Status status) {
  if (failure_.ok()) {
    failure_ = status;
    spdlog::error("event=nccl_failed group={} code={} error={}", LogValue(describe_),
                  absl::StatusCodeToString(status.code()), LogValue(status.message()));
  }
  // After an async error or a timeout NCCL requires an abort, and aborting
  // also stops kernels spinning on a dead peer.
  AbortComms();
  return status;
}

void NcclCollectives::AbortComms() {
  std::vector<ncclComm_t> comms;
  for (Rank& r : ranks_) {
    if (r.comm != nullptr) comms.push_back(r.comm);
    r.comm = nullptr;  // invalid after ncclCommAbort, whatever it returns
  }
  AbortWithDeadline(nccl_, std::move(comms), describe_);
}

void NcclCollectives::Abort(const std::string& reason) {
  // I1: only the flag; the owning thread sees it within one poll step
  // (<= 50 µs while a collective runs) or at its next call, and aborts.
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (abort_requested_.load(std::memory_order_relaxed)) return;  // first reason wins
    abort_reason_ = reason;
    abort_requested_.store(true, std::memory_order_release);
  }
  spdlog::warn("event=nccl_abort_requested group={} reason={}", LogValue(describe_),
               LogValue(reason));
}

absl::Status NcclCollectives::CheckBuffers(const std::vector<DeviceBuffer>& buffers,
                                           absl::string_view what) {
  // Every local rank takes part with the same count: a rank left out would
  // make every peer wait for it until the timeout.
  if (buffers.size() != ranks_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", buffers.size(), " buffers for ",
                                                   ranks_.size(),
                                                   " local ranks (each must take part once)"));
  }
  std::vector<char> seen(ranks_.size(), 0);
  for (const DeviceBuffer& b : buffers) {
    if (b.device_index < 0 || b.device_index >= static_cast<int>(ranks_.size()) ||
        seen[b.device_index]++) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": device_index ", b.device_index,
                                                     " out of range or given twice (",
                                                     ranks_.size(), " local ranks)"));
    }
    if (b.count != buffers.front().count) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": buffers differ in count"));
    }
    if (b.count > 0 && b.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
    }
#ifndef NDEBUG
    // The caller checks at registration; this debug check
    // costs about a microsecond per buffer.
    if (b.count > 0) {
      cudaPointerAttributes attr{};
      const int ordinal = ranks_[b.device_index].ordinal;
      cudaError_t err = cudaPointerGetAttributes(&attr, b.data);
      if (err != cudaSuccess || attr.type != cudaMemoryTypeDevice || attr.device != ordinal) {
        cudaGetLastError();  // not sticky; do not leave it for the next caller
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": buffer ", absl::StrFormat("%p", b.data), " is not device memory of ",
            ranks_[b.device_index].id, " (ordinal ", ordinal, ")"));
      }
    }
#endif
  }
  return absl::OkStatus();
}

absl::Status NcclCollectives::AllreduceSum(const std::vector<DeviceBuffer>& buffers, DType dtype) {
  if (!failure_.ok()) return failure_;
  if (abort_requested_.load(std::memory_order_acquire)) {
    return Fail(AbortedStatus("nccl allreduce"));
  }
  ncclDataType_t type;
  if (!IsValidDType(static_cast<int32_t>(dtype)) || !ToNcclDataType(dtype, &type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl allreduce: invalid dtype ", static_cast<int32_t>(dtype)));
  }
  RETURN_IF_ERROR(CheckBuffers(buffers, "nccl allreduce"));
  // Every rank sees the same count, so every rank skips consistently.
  if (buffers.front().count == 0) return absl::OkStatus();

  const Clock::time_point deadline = Clock::now() + timeout_;
  DeviceGuard guard;
  RETURN_IF_ERROR(Launch(buffers, type, "nccl allreduce(sum)"));
  return Poll("nccl allreduce(sum)", /*events=*/true, deadline, nullptr, guard);
}

absl::Status NcclCollectives::Broadcast(const std::vector<DeviceBuffer>& buffers, int root) {
  if (!failure_.ok()) return failure_;
  if (abort_requested_.load(std::memory_order_acquire)) {
    return Fail(AbortedStatus("nccl broadcast"));
  }
  if (root < 0 || root >= nranks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl broadcast: root ", root, " is not a rank of ", describe_));
  }
  RETURN_IF_ERROR(CheckBuffers(buffers, "nccl broadcast"));
  if (buffers.front().count == 0) return absl::OkStatus();
  const Clock::time_point deadline = Clock::now() + timeout_;
  DeviceGuard guard;
  // Bytes: ncclUint8 moves any dtype unchanged.
  RETURN_IF_ERROR(Launch(buffers, ncclUint8, "nccl broadcast", root));
  return Poll("nccl broadcast", /*events=*/true, deadline, nullptr, guard);
}

NcclCollectives::~NcclCollectives() {
  DeviceGuard guard;
  const bool any =
      std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.comm != nullptr; });
  if (any) {
    if (abort_requested_.load(std::memory_order_acquire) || !failure_.ok()) {
      AbortComms();
    } else {
      // Finalize may synchronize the local ranks with each other, so all of
      // them are finalized in one group (I1), then polled; any failure or
      // the deadline aborts instead (Poll does).
      bool ok = nccl_.GroupStart() == ncclSuccess;
      if (ok) {
        for (const Rank& r : ranks_) {
          if (!Accepted(nccl_.CommFinalize(r.comm))) ok = false;
        }
        if (!Accepted(nccl_.GroupEnd())) ok = false;
      }
      if (!ok) {
        (void)Fail(NcclError(nccl_, ncclInternalError, absl::StrCat("nccl finalize of ", describe_),
                             absl::StatusCode::kInternal));
      } else if (Poll("nccl finalize", /*events=*/false, Clock::now() + timeout_, nullptr, guard)
                     .ok()) {
        for (Rank& r : ranks_) {
          if (ncclResult_t res = nccl_.CommDestroy(r.comm); res != ncclSuccess) {
            spdlog::warn("event=nccl_destroy_failed rank={} error={}", r.rank,
                         LogValue(nccl_.GetErrorString(res)));
          }
          r.comm = nullptr;
        }
      }
    }
  }
  // After the communicators: NCCL's work on these streams is over.
  for (Rank& r : ranks_) {
    if (r.stream == nullptr && r.done == nullptr) continue;
    if (guard.Use(r.ordinal) != cudaSuccess) continue;
    if (r.done != nullptr) cudaEventDestroy(r.done);
    if (r.stream != nullptr) cudaStreamDestroy(r.stream);
  }
}

absl::Status Validate(const CollectiveOptions& o) {
  if (o.nranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: nranks=", o.nranks, " must be >= 1"));
  }
  if (o.devices.empty()) return absl::InvalidArgumentError("nccl: no local devices");
  if (o.first_rank < 0 ||
      static_cast<int64_t>(o.first_rank) + static_cast<int64_t>(o.devices.size()) > o.nranks) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ranks [", o.first_rank, ", ",
                                                   o.first_rank + o.devices.size(),
                                                   ") do not fit nranks=", o.nranks));
  }
  if (o.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl: timeout must be positive");
  }
  std::set<std::string> ids;
  for (const DeviceId& d : o.devices) {
    // NCCL refuses two ranks of one communicator on one GPU.
    if (!ids.insert(absl::AsciiStrToLower(d)).second) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: device ", d, " twice"));
    }
  }
  const bool all_local = static_cast<int>(o.devices.size()) == o.nranks;
  if (!all_local && o.first_rank == 0 && !o.publish) {
    return absl::InvalidArgumentError("nccl: no publish function for the unique id");
  }
  if (!all_local && o.first_rank != 0 && !o.fetch) {
    return absl::InvalidArgumentError("nccl: no fetch function for the unique id");
  }
  return absl::OkStatus();
}

// UUID -> ordinal in this process (which may run under CUDA_VISIBLE_DEVICES).
absl::StatusOr<std::vector<int>> MapDevices(const std::vector<DeviceId>& devices) {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return CudaError(err, "nccl: no usable CUDA device: cudaGetDeviceCount");
  }
  std::vector<std::string> visible;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaError_t err = cudaGetDeviceProperties(&prop, i); err != cudaSuccess) {
      return CudaError(err, absl::StrCat("nccl: cudaGetDeviceProperties(", i, ")"));
    }
    visible.push_back(FormatGpuUuid(prop.uuid.bytes));
  }
  std::vector<int> ordinals;
  for (const DeviceId& d : devices) {
    auto it = std::find_if(visible.begin(), visible.end(),
                           [&](const std::string& v) { return SameGpu(v, d); });
    if (it == visible.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "nccl: no visible GPU has id ", d, " (visible: ", absl::StrJoin(visible, ", "), ")"));
    }
    ordinals.push_back(static_cast<int>(it - visible.begin()));
  }
  return ordinals;
}

// o.fetch(key) until `deadline`, in slices, so that cancellation is seen
// promptly whatever the store's wait does. `late`: the message on deadline.
absl::StatusOr<std::string> FetchSliced(const CollectiveOptions& o, const std::string& key,
                                        Clock::time_point deadline,
                                        const std::function<bool()>& cancelled,
                                        const std::string& late) {
  constexpr auto kSlice = std::chrono::milliseconds(200);
  for (;;) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("nccl: cancelled while waiting for '", key, "'"));
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return absl::DeadlineExceededError(absl::StrCat("nccl: ", late));
    const auto slice = std::min<Clock::duration>(deadline - now, kSlice);
    // fetch takes a MonotonicNow() deadline: the end of this slice.
    absl::StatusOr<std::string> value = o.fetch(
        key, FromSteadyClock(now) +
                 absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(slice)));
    if (value.ok()) return value;
    const absl::StatusCode code = value.status().code();
    if (code == absl::StatusCode::kNotFound) {
      // A store that answers "not yet" at once: do not hammer it.
      std::this_thread::sleep_for(std::min<Clock::duration>(slice, std::chrono::milliseconds(20)));
    } else if (code != absl::StatusCode::kDeadlineExceeded) {
      return absl::Status(code,
                          absl::StrCat("nccl: fetching '", key, "': ", value.status().message()));
    }
  }
}

// Rank 0's node publishes the id; the others fetch it. Hex: the store's
// values travel as text.
// `*created`: ncclGetUniqueId succeeded here, which starts NCCL's bootstrap
// root (it stays until every rank connected, so a failure after it leaks).
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(const NcclApi& nccl, const CollectiveOptions& o,
                                              Clock::time_point deadline,
                                              const std::function<bool()>& cancelled,
                                              bool* created) {
  const std::string key = NcclUniqueIdKey(o.generation);
  const bool all_local = static_cast<int>(o.devices.size()) == o.nranks;
  ncclUniqueId id;
  if (o.first_rank == 0) {
    if (ncclResult_t r = nccl.GetUniqueId(&id); r != ncclSuccess) {
      return NcclError(nccl, r, "nccl: ncclGetUniqueId", absl::StatusCode::kUnavailable);
    }
    *created = true;
    // NCCL applies its nccl.conf files at its first real call (this one):
    // check again.
    if (std::getenv("NCCL_COMM_ID") != nullptr) {
      return absl::FailedPreconditionError(
          "nccl: NCCL_COMM_ID is set (nccl.conf?): generations would share one bootstrap "
          "address; unset it");
    }
    if (!all_local) {
      const std::string value =
          absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal)));
      if (absl::Status s = o.publish(key, value); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("nccl: publishing the unique id under '", key,
                                                   "': ", s.message()));
      }
    }
    return id;
  }
  ASSIGN_OR_RETURN(
      std::string value,
      FetchSliced(
          o, key, deadline, cancelled,
          absl::StrCat("the unique id '", key,
                       "' was not published in time (the node holding rank 0 did not create "
                       "generation ",
                       o.generation, "?)")));
  std::string bytes;
  if (value.size() != 2 * sizeof(id.internal) ||
      (bytes = absl::HexStringToBytes(value)).size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: '", key, "' is not a ", sizeof(id.internal), "-byte hex id"));
  }
  std::copy(bytes.begin(), bytes.end(), id.internal);
  return id;
}

// Every rank of the job has its unique id: each local rank says so, then
// this node waits (cancellable, without the device gate) until every
// other rank has. Init, which holds the gate while NCCL allocates, then
// starts with no rank missing, so a slow peer is waited for here.
absl::Status AwaitEveryRank(const CollectiveOptions& o, Clock::time_point deadline,
                            const std::function<bool()>& cancelled) {
  const auto key = [&o](int rank) {
    return absl::StrCat("nccl/g", o.generation, "/arrived/", rank);
  };
  const int local = static_cast<int>(o.devices.size());
  for (int i = 0; i < local; ++i) {
    if (absl::Status s = o.publish(key(o.first_rank + i), "1"); !s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("nccl: announcing rank ", o.first_rank + i, ": ", s.message()));
    }
  }
  for (int r = 0; r < o.nranks; ++r) {
    if (r >= o.first_rank && r < o.first_rank + local) continue;
    RETURN_IF_ERROR(FetchSliced(o, key(r), deadline, cancelled,
                                absl::StrCat("rank ", r, " of generation ", o.generation,
                                             " never arrived to create its communicator"))
                        .status());
  }
  return absl::OkStatus();
}

}  // namespace

std::string NcclUniqueIdKey(uint64_t generation) {
  return absl::StrCat("nccl/g", generation, "/unique_id");
}

int LeakedBootstrapRoots() { return leaked_bootstrap_roots.load(); }

absl::Status LoadNcclBeforeThreads() { return NcclApi::Get().status(); }

absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateNcclCollectives(
    const CollectiveOptions& options) {
  const Clock::time_point deadline = Clock::now() + ToClock(options.timeout);
  RETURN_IF_ERROR(Validate(options));
  // Cancellation is polled before anything slow and in both
  // waits (the id exchange and init/warm-up).
  const std::function<bool()> cancelled = options.cancelled;
  if (cancelled && cancelled()) return absl::CancelledError("nccl: creation cancelled");
  // With NCCL_COMM_ID every generation's unique id carries
  // the same address and magic, so a late rank of an old generation could
  // join the new one.
  if (std::getenv("NCCL_COMM_ID") != nullptr) {
    return absl::FailedPreconditionError(
        "nccl: NCCL_COMM_ID is set: generations would share one bootstrap address; unset it");
  }
  ASSIGN_OR_RETURN(const NcclApi* nccl, NcclApi::Get());
  const bool all_local = static_cast<int>(options.devices.size()) == options.nranks;
  const bool leaks_root = options.first_rank == 0 && !all_local;
  if (leaks_root && LeakedBootstrapRoots() >= kMaxLeakedBootstrapRoots) {
    // Every later multi-node job would be refused too: the daemon exits
    // (and is restarted) rather than fail them all.
    return MarkDeviceLost(absl::FailedPreconditionError(absl::StrCat(
        "nccl: ", LeakedBootstrapRoots(),
        " failed generations left NCCL bootstrap threads and sockets behind; restart the daemon")));
  }

  ASSIGN_OR_RETURN(std::vector<int> ordinals, MapDevices(options.devices));
  std::vector<NcclCollectives::Rank> ranks;
  for (size_t i = 0; i < options.devices.size(); ++i) {
    NcclCollectives::Rank r;
    r.rank = options.first_rank + static_cast<int>(i);
    r.ordinal = ordinals[i];
    r.id = options.devices[i];
    ranks.push_back(std::move(r));
  }
  // The device gate (CollectiveOptions::enter_memory_work) is held only
  // while streams and communicators are created or destroyed, never across
  // the waits for other ranks.
  const auto enter = [&options](const char* what) {
    return options.enter_memory_work ? options.enter_memory_work(what) : absl::OkStatus();
  };
  const auto leave = [&options] {
    if (options.exit_memory_work) options.exit_memory_work();
  };
  // On any error below, the group's destructor releases what was created
  // (streams, communicators): memory work, so under the gate.
  auto group = std::make_unique<NcclCollectives>(*nccl, options, std::move(ranks));
  const auto discard = [&] {
    const bool entered = enter("destroying a failed group's communicators").ok();
    group.reset();
    if (entered) leave();
  };
  RETURN_IF_ERROR(enter("creating streams"));
  if (absl::Status s = group->CreateStreams(); !s.ok()) {
    group.reset();
    leave();
    return s;
  }
  leave();
  bool id_created = false;
  absl::StatusOr<ncclUniqueId> id =
      ExchangeUniqueId(*nccl, options, deadline, cancelled, &id_created);
  if (!id.ok()) {
    // A publish that failed after ncclGetUniqueId leaks the root too.
    if (leaks_root && id_created) leaked_bootstrap_roots.fetch_add(1);
    discard();
    return id.status();
  }
  if (!all_local) {
    if (absl::Status s = AwaitEveryRank(options, deadline, cancelled); !s.ok()) {
      if (leaks_root) leaked_bootstrap_roots.fetch_add(1);
      discard();
      return s;
    }
  }
  if (absl::Status s = enter("creating communicators"); !s.ok()) {
    if (leaks_root) leaked_bootstrap_roots.fetch_add(1);
    discard();
    return s;
  }
  if (absl::Status s = group->Init(*id, deadline, cancelled); !s.ok()) {
    if (leaks_root) leaked_bootstrap_roots.fetch_add(1);
    group.reset();
    leave();
    return s;
  }
  leave();
  spdlog::info("event=nccl_connected group={} nccl={}", LogValue(group->describe()),
               NcclVersionString(nccl->version));
  return std::unique_ptr<CollectiveGroup>(std::move(group));
}

}  // namespace gradsync::gpu
