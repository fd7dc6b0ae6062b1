// GlooWorkerBackend: the daemon's CPU cross-node backend. It runs Gloo in a
// worker process of its own (gloo_worker.h; one per job generation) and
// supervises it, so that whatever Gloo does on its own threads — above all
// std::terminate on a malformed message that reached one of its ports —
// fails this generation's job instead of the daemon.
//
// The bucket is reduced in a buffer shared with the worker (a memfd, grown
// to the largest bucket): the daemon's local sum writes straight into it
// (Staging); data elsewhere is copied in and the result copied back. One
// command round trip over the channel per collective; IssueAllreduceSum
// keeps several in flight (pieces of a bucket in disjoint parts of the
// shared buffer), the worker runs them one after another in that order. Errors: what the worker's
// GlooBackend reported (same codes as GlooBackend), or PEER_FAILED when the worker died, naming the
// generation, how it died and, when Gloo threw, what it threw and the TCP peers the worker was
// connected to (a stranger that took over a Gloo pair is among them). A worker that neither answers
// nor dies within the timeout plus a grace period is killed (TIMEOUT).
//
// Abort kills the worker: its sockets close, so the neighbours fail at once,
// and an AllreduceSum in flight returns PEER_FAILED with the reason. After
// any failure the backend stays failed (the daemon forms a new generation,
// with a new worker).
//
// Threads: AllreduceSum from one thread (the scheduler's); Abort from any.
#ifndef GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_BACKEND_H_
#define GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_BACKEND_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/backends/backend.h"
#include "daemon/backends/gloo_backend.h"
#include "daemon/backends/gloo_worker.h"
#include "daemon/backends/gloo_worker_process.h"
#include "daemon/backends/worker_channel.h"

namespace gradsync {
namespace v1 {
class GlooWorkerRequest;
}  // namespace v1

class GlooWorkerBackend final : public Backend {
 public:
  // Starts the worker (`worker_argv`: by default this very executable in
  // worker mode) and connects this generation's full mesh through it; the
  // worker's store requests are served with `options.store`. Blocks up to
  // about `options.timeout`.
  static absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> Create(
      const GlooBackendOptions& options,
      std::vector<std::string> worker_argv = ThisExecutableAsGlooWorker());
  // Create in two steps, for a caller that may Abort the connect from
  // another thread (the leader aborting the generation while it forms):
  // Start spawns the worker, ConnectMesh then blocks as Create does. An
  // Abort meanwhile kills the worker and ConnectMesh returns PEER_FAILED
  // with the reason. ConnectMesh's options are Start's, except that their
  // wire dtype (agreed between Start and ConnectMesh) is the one used.
  static absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> Start(
      const GlooBackendOptions& options,
      std::vector<std::string> worker_argv = ThisExecutableAsGlooWorker());
  absl::Status ConnectMesh(const GlooBackendOptions& options);
  // Spawns a worker ahead of the next Start, which adopts it instead of
  // spawning its own (gloo_worker_process.h): its start-up then overlaps the
  // wait for the join. Without one (or with a dead one) Start spawns.
  static void PrepareSpare(
      const std::vector<std::string>& worker_argv = ThisExecutableAsGlooWorker());
  ~GlooWorkerBackend() override;

  GlooWorkerBackend(const GlooWorkerBackend&) = delete;
  GlooWorkerBackend& operator=(const GlooWorkerBackend&) = delete;

  std::string name() const override { return "gloo"; }
  int num_nodes() const override { return num_nodes_; }
  absl::Status AllreduceSum(void* data, size_t count, DType dtype) override;
  absl::Status IssueAllreduceSum(void* data, size_t count, DType dtype) override;
  absl::Status AwaitIssued() override;
  // Sent in the next IssueAllreduceSum's request when the worker can fold
  // them into it, else as a request of their own now (a one-node job sums
  // nothing, at once).
  absl::Status AllreduceCountsWithNext(double* counts, size_t n, size_t next_count,
                                       DType next_dtype, bool* deferred) override;
  // The arenas are mapped by the worker with the next request that
  // reduces in one.
  void ShareArenas(std::vector<SharedArena> arenas) override ABSL_LOCKS_EXCLUDED(mu_);
  bool ReducesInArenas(const uint8_t* data, uint64_t bytes,
                       absl::Span<uint8_t* const> copies) override ABSL_LOCKS_EXCLUDED(mu_);
  // The worker sums in the arena, divides and copies the average to the
  // other arenas before it answers: a worker that dies meanwhile fails it
  // (and is dead, so writes nothing more, by the time the error returns).
  absl::Status IssueAllreduceAverage(uint8_t* data, size_t count, DType dtype, int divisor,
                                     absl::Span<uint8_t* const> copies,
                                     AverageCheck* check) override;
  ElementSpan InputsTestedInCollective(size_t count, DType dtype) const override;
  // Through the shared buffer's start (copied in on the root, out elsewhere);
  // nothing may be in flight.
  absl::Status Broadcast(void* data, size_t bytes, int root_node) override;
  // The shared buffer itself: a bucket summed into it is not copied.
  uint8_t* Staging(uint64_t bytes) override;
  WireStats wire_stats() const override;
  void Abort(const std::string& reason) override ABSL_LOCKS_EXCLUDED(mu_);

  // The worker's pid (0 for a one-node job, which needs none).
  pid_t worker_pid() const { return pid_; }

 private:
  explicit GlooWorkerBackend(const GlooBackendOptions& options);
  absl::Status Spawn(const std::vector<std::string>& argv) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends `connect`, serves the worker's store requests, returns its answer.
  absl::Status Connect(const GlooBackendOptions& options);
  // The worker's next `done` (serving store requests with `store`, if any);
  // with `counts`, the `n` summed counts it carries are copied there.
  absl::Status AwaitDone(const std::string& during, gloo::rendezvous::Store* store,
                         double* counts = nullptr, size_t n = 0, AverageCheck* check = nullptr);
  // OK while no failure or Abort happened; else that failure.
  absl::Status CheckUsable() ABSL_LOCKS_EXCLUDED(mu_);
  // Which shared arena (1-based) holds `bytes` at `data`; 0 when none.
  int ArenaOf(const uint8_t* data, uint64_t bytes) const;
  // Reaps the worker after its channel closed; says how and why it died.
  absl::Status WorkerDied(const std::string& during) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EnsureBuffer(size_t bytes);
  // Records the first failure and stops the worker.
  absl::Status Fail(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  void Kill() ABSL_LOCKS_EXCLUDED(mu_);
  std::string Who() const;

  // One issued allreduce, until AwaitIssued returns it.
  struct Issued {
    size_t count = 0;
    DType dtype = DType::kFloat32;
    bool sent = false;          // false: nothing to exchange (one node, empty)
    void* copy_back = nullptr;  // data outside the shared buffer: copy the result there
    double* counts = nullptr;   // AllreduceCountsWithNext's, sent with this one
    size_t counts_n = 0;
    bool counts_only = false;       // no elements: AwaitIssued takes it on the way
    AverageCheck* check = nullptr;  // IssueAllreduceAverage's, set from the answer
  };
  // Sends `request` for `issued`'s collective and queues it.
  absl::Status SendIssued(const v1::GlooWorkerRequest& request, Issued issued);
  // Whether an issued collective with elements is not yet awaited.
  bool ElementsInFlight() const;

  const int node_rank_;
  const int num_nodes_;
  const uint64_t generation_;
  const std::string store_prefix_;  // the worker's store requests stay under it
  const absl::Duration timeout_;
  WireDType wire_dtype_;  // set before the mesh connects
  std::atomic<uint64_t> wire_payload_bytes_{0};

  // The calling thread's (Create, then AllreduceSum's).
  WorkerChannel channel_;
  int buffer_fd_ = -1;
  void* buffer_ = nullptr;
  size_t buffer_bytes_ = 0;
  std::string fatal_;  // what the worker said before it died
  // Oldest first from issued_head_; capacity kept: no allocation per bucket.
  std::vector<Issued> issued_;
  size_t issued_head_ = 0;
  // AllreduceCountsWithNext's, until the next IssueAllreduceSum sends them.
  double* pending_counts_ = nullptr;
  size_t pending_counts_n_ = 0;

  // ShareArenas' as the calling thread last adopted them, and whether the
  // worker has yet to map them.
  std::vector<SharedArena> arenas_;
  bool arenas_unsent_ = false;

  pid_t pid_ = 0;   // set by Spawn, before any other thread sees this object
  int pidfd_ = -1;  // signals never reach a reused pid
  absl::Mutex mu_;
  bool reaped_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::vector<SharedArena> shared_arenas_ ABSL_GUARDED_BY(mu_);
  bool arenas_changed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_BACKEND_H_
