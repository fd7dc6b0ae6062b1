// NcclBackend: the GPU data path's collective. One NcclBackend per local GPU
// (= one NCCL rank: the job has one rank per trainer GPU), averaging device
// buffers in place with ncclAllReduce(ncclAvg).
//
// Local groups. The daemon drives every local GPU of its node from one
// thread, and NCCL requires a thread that owns several ranks to create their
// communicators, and to launch their collectives, inside one
// ncclGroupStart/ncclGroupEnd (otherwise the first rank waits for the second,
// which is never reached). So the daemon must create its backends with
// CreateLocalGroup (all local ranks in one call) and run collectives with the
// static GroupAllreduceAvg (one buffer per local backend). Create is the
// one-device shorthand. The backends of one group share their state: they
// fail, abort and are torn down together (the NCCL communicators are
// finalized/destroyed, grouped, when the last backend of the group goes).
//
// Unique id: the group holding global rank 0 calls ncclGetUniqueId and Set()s
// it (hex) under key_prefix + "nccl_id"; the others Wait() for it and Get()
// it. A key_prefix of GenerationKeyPrefix(generation) + "nccl/" makes the key
// generation-scoped on the leader (a stale id of an older generation is never
// read, and a Wait ends when the generation aborts).
//
// Nothing blocks unboundedly: communicators are non-blocking
// (config.blocking = 0), and init, collectives and teardown are completed by
// polling ncclCommGetAsyncError (and cudaEventQuery for the collective's
// kernels) against a deadline. So a dead peer costs at most `timeout`:
//   - init: the id exchange and the communicator init each get `timeout`
//     (kDeadlineExceeded / gradsync TIMEOUT naming the ranks);
//   - allreduce: kDeadlineExceeded on timeout, kUnavailable on an NCCL async
//     error (e.g. a remote peer failed), kAborted after Abort(). Any failure
//     aborts every communicator of the group (ncclCommAbort); the group then
//     stays failed and the daemon re-joins and creates a new one for the
//     next generation.
//
// Threads: one thread issues collectives; Abort may be called from any
// thread at any time. A mutex serializes every use of the communicators with
// ncclCommAbort, so Abort never races with an enqueue, a poll or teardown.
#ifndef GRADSYNC_DAEMON_BACKENDS_NCCL_BACKEND_H_
#define GRADSYNC_DAEMON_BACKENDS_NCCL_BACKEND_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "daemon/cluster/rendezvous_client.h"

namespace gradsync {

struct NcclBackendOptions {
  int rank = 0;    // global NCCL rank, in [0, nranks)
  int nranks = 1;  // one per trainer GPU of the job
  int device = 0;  // local CUDA device ordinal
  uint64_t generation = 0;
  // Bounds each phase of init, every collective and teardown.
  absl::Duration timeout = absl::Seconds(300);
  // Leader key-value store; may be null when the local group holds every rank.
  std::shared_ptr<RendezvousClient> store;
  // Prefix of the unique-id key, e.g. GenerationKeyPrefix(generation) + "nccl/".
  std::string key_prefix;
};

class NcclGroupState;  // defined in nccl_backend.cc

class NcclBackend;

// One in-place average: `count` elements at device pointer `data`, which
// must live on `backend`'s device.
struct NcclDeviceBuffer {
  NcclBackend* backend = nullptr;
  void* data = nullptr;
  size_t count = 0;
};

class NcclBackend {
 public:
  // One local rank (the calling thread owns no other rank of this job).
  static absl::StatusOr<std::unique_ptr<NcclBackend>> Create(const NcclBackendOptions& options);

  // Every local rank of a node, initialized in one ncclGroupStart/End; the
  // options must agree on nranks, generation, timeout, store and key_prefix
  // and differ in rank and device. Returns the backends in options' order.
  static absl::StatusOr<std::vector<std::unique_ptr<NcclBackend>>> CreateLocalGroup(
      const std::vector<NcclBackendOptions>& options);

  ~NcclBackend();
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  // Averages each buffer in place across all nranks, all collectives
  // launched in one NCCL group, and waits (bounded by the timeout) until
  // they have completed. All backends must belong to one local group, at
  // most one buffer per backend, same count everywhere (NCCL's contract:
  // every rank issues the same collectives with the same sizes). The work
  // runs on the backends' own streams: the caller must have finished
  // writing the buffers (e.g. synchronized its streams) before calling.
  static absl::Status GroupAllreduceAvg(const std::vector<NcclDeviceBuffer>& buffers,
                                        DType dtype);

  // GroupAllreduceAvg of this backend alone (its group must be just itself).
  absl::Status AllreduceAvg(void* data, size_t count, DType dtype);

  // Aborts every communicator of this backend's group; an in-flight or
  // future collective returns kAborted. Thread-safe, idempotent.
  void Abort(const std::string& reason);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int device() const { return device_; }
  uint64_t generation() const { return generation_; }
  // The stream NCCL work is launched on (owned by the backend).
  cudaStream_t stream() const;

 private:
  NcclBackend(std::shared_ptr<NcclGroupState> group, int index, const NcclBackendOptions& options);

  const std::shared_ptr<NcclGroupState> group_;
  const int index_;  // this rank's slot in the group
  const int rank_;
  const int nranks_;
  const int device_;
  const uint64_t generation_;
};

// Maps a gradsync dtype to NCCL's; false for an invalid value.
bool ToNcclDataType(DType dtype, ncclDataType_t* out);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_NCCL_BACKEND_H_
