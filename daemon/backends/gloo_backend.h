// GlooBackend: the cross-node allreduce on CPU, through Gloo's ring
// allreduce over its TCP transport. One backend = one Gloo context = one job
// generation: rank = node_rank, size = num_nodes, connected through the
// rendezvous store under the generation's key prefix (store_prefix, given
// by whoever forms the world: "g<generation>/gloo"). After a failure
// or Abort the backend stays failed; the daemon re-joins and creates a new
// one for the next generation.
//
// Types: float32 and float64 natively, float16 natively (gloo::float16,
// each addition rounded to half), bfloat16 widened into a float32 staging
// buffer (kept and reused, so steady state does not allocate), summed in
// float32 and rounded once (nearest even).
//
// Failures never escape as exceptions from these calls: a peer that died
// or closed its connections gives PEER_FAILED (gradsync code), Abort
// PEER_FAILED naming the reason, Gloo's timeout TIMEOUT. What Gloo throws on
// its own event-loop thread cannot be caught (std::terminate): the daemon
// therefore runs this class in a worker process (gloo_worker_backend.h).
// On any failure this node also closes its own
// connections, so neighbours blocked on it fail at once instead of waiting
// for their timeout (a failure ripples around the ring).
//
// SIGPIPE: Create() ignores it process-wide if it still has the default
// action (a write to a peer that died would otherwise kill the daemon).
//
// Abort: Gloo (this 2022 snapshot) has no public way to cancel a running
// collective. Closing the pairs (Context::closeConnections) is not enough:
// it only makes the *peers* fail, while a local thread blocked in a receive
// waits for its timeout (and when every node aborts at once, every node
// closes first and nobody is woken). What does wake everyone is Gloo's own
// timeout path: when a wait on an unbound buffer times out, the tcp context
// fails every pending send/receive of every pair with an IoException (the
// blocked allreduce throws) and closes the sockets (the peers see it at
// once). Abort triggers exactly that through the public API: it creates a
// one-byte unbound buffer with no receive posted and waits 1 ms on it.
// Limit: a segment whose header was already read and whose payload is still
// arriving is not among the operations Gloo fails, so a thread blocked on
// exactly that segment ends at the operation timeout instead.
#ifndef GRADSYNC_DAEMON_BACKENDS_GLOO_BACKEND_H_
#define GRADSYNC_DAEMON_BACKENDS_GLOO_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "daemon/backends/backend.h"
#include "daemon/backends/ring_average.h"
#include "daemon/backends/wire_dtype.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace gradsync {

struct GlooBackendOptions {
  int node_rank = 0;
  int num_nodes = 1;
  // Where this node's Gloo TCP device binds: a host name or address (the
  // `host` the node sent in Join), or else a network interface name.
  std::string host;
  std::string iface;
  uint64_t generation = 0;
  // Where this generation's Gloo keys live in `store` (GlooKeyPrefix,
  // daemon/cluster/rendezvous_keys.h: the leader scopes them to the
  // generation). Not needed when num_nodes == 1.
  std::string store_prefix;
  // Per-allreduce timeout; Create (store waits + TCP connects) also ends
  // within about this long.
  absl::Duration timeout = absl::Seconds(300);
  // The rendezvous store (GlooStore over the leader; any Gloo store works).
  // Not needed when num_nodes == 1.
  std::shared_ptr<gloo::rendezvous::Store> store;
  // fp32 buckets cross the wire as this (wire_cast.h), pre-scaled by
  // 1 / world_size; other dtypes are never compressed.
  WireDType wire_dtype = WireDType::kOff;
  int world_size = 1;
};

// What GlooBackend::AllreduceAverage did beyond the sum.
struct RingAverageOutcome {
  // The result is the average (else the sum, still to divide).
  bool divided = false;
  // Elements [averaged_begin, averaged_end) were averaged and, when asked,
  // checked on this node; non_finite: one of those is NaN or Inf.
  size_t averaged_begin = 0;
  size_t averaged_end = 0;
  bool non_finite = false;
  // Checked: the first of this node's own inputs in those elements that is
  // NaN or Inf (RingAverage::input_element), and its value.
  bool input_non_finite = false;
  size_t input_element = 0;
  double input_value = 0;
};

class GlooBackend final : public Backend {
 public:
  // Connects the full mesh of this generation; blocks until every node has
  // connected or the timeout passes. Once per generation: the generation's
  // store keys are written once, so a failed Create means re-joining.
  static absl::StatusOr<std::unique_ptr<GlooBackend>> Create(const GlooBackendOptions& options);
  ~GlooBackend() override;

  GlooBackend(const GlooBackend&) = delete;
  GlooBackend& operator=(const GlooBackend&) = delete;

  std::string name() const override { return "gloo"; }
  int num_nodes() const override { return num_nodes_; }
  int node_rank() const { return node_rank_; }
  uint64_t generation() const { return generation_; }

  absl::Status AllreduceSum(void* data, size_t count, DType dtype) override;
  // AllreduceSum, and where CanAverageInRing (ring_average.h) also the
  // divide by `divisor` inside the ring's reduction, bit for bit the sum
  // divided after it; `*outcome` says whether it divided and what it
  // checked for NaN/Inf (`check`). Else only the sum (divided false).
  absl::Status AllreduceAverage(void* data, size_t count, DType dtype, int divisor, bool check,
                                RingAverageOutcome* outcome);
  // gloo::broadcast of the bytes, in place (the root's are the input).
  absl::Status Broadcast(void* data, size_t bytes, int root_node) override;
  void Abort(const std::string& reason) override;

  // Sizes the bfloat16 staging buffer up front (elements), so that not even
  // the first call of the largest bucket allocates.
  void ReserveStaging(size_t elements);

 private:
  GlooBackend(const GlooBackendOptions& options, std::shared_ptr<gloo::Context> context);

  template <typename T>
  void RunAllreduce(T* data, size_t count);
  // INTERNAL when, checking, the ring averaged other elements than
  // RingOwnedElements: the daemon scanned only the rest of its input.
  absl::Status CheckOwnedRange(const RingAverage& ring, size_t count, DType dtype,
                               bool check) const;
  // The checks every collective makes first (arguments, an earlier
  // failure, an abort), then `run` with Gloo's exceptions turned into
  // the node's failure.
  template <typename Run>
  absl::Status RunGuarded(const void* data, size_t count, DType dtype, Run&& run);
  // gather_sum.h: every node's buffer gathered, then added in node order.
  // PEER_FAILED naming the node whose row came short.
  template <typename T>
  absl::Status RunGatherSum(T* data, size_t count);
  // Fail(status) unless it is OK.
  absl::Status FailIfError(absl::Status status) {
    return status.ok() ? status : Fail(std::move(status));
  }
  // fp32 in place, through the 16-bit wire type.
  void RunCompressedAllreduce(float* data, size_t count);
  // Records the first failure, closes this node's connections, returns it.
  absl::Status Fail(absl::Status status);
  // Fails every pending operation of the context and closes its sockets
  // (see Abort above); `reason` is logged.
  void CloseContext(const std::string& reason);
  std::string Describe(size_t count, DType dtype) const;

  const int node_rank_;
  const int num_nodes_;
  const uint64_t generation_;
  const absl::Duration timeout_;
  const std::shared_ptr<gloo::Context> context_;  // null when num_nodes == 1
  const WireDType wire_dtype_;
  const int world_size_;

  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);

  // Only touched by the (single) thread calling AllreduceSum.
  std::vector<float> staging_;
  // RunGatherSum's copies (grows to the largest, then kept: no allocation
  // per iteration); double for float64's alignment.
  std::vector<double> gathered_;
  std::vector<double> gather_send_;  // this node's row
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GLOO_BACKEND_H_
