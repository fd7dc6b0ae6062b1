// Backend: the cross-node step of a bucket's reduction.
//
// The daemon first sums a bucket over its local trainers into one contiguous
// buffer, then asks the backend to sum that buffer across all nodes of the
// job (in place), then divides by the world size and writes the result back
// to every local trainer. The scheduler calls AllreduceSum from one thread,
// in plan order, so every node issues the same collectives in the same
// order with the same sizes.
#ifndef GRADSYNC_DAEMON_BACKENDS_BACKEND_H_
#define GRADSYNC_DAEMON_BACKENDS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace gradsync {

// The arguments every AllreduceSum checks first: a valid dtype, and a
// buffer when there is anything to sum (count 0 is a no-op).
inline absl::Status CheckAllreduceArgs(const void* data, size_t count, DType dtype,
                                       const char* who) {
  if (!IsValidDType(static_cast<int32_t>(dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " allreduce: invalid dtype ", static_cast<int32_t>(dtype)));
  }
  if (count != 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(who, " allreduce: null buffer"));
  }
  return absl::OkStatus();
}

// A local trainer's gradient arena as a backend in another process can map
// it: the POSIX shared-memory object holding it and where.
struct SharedArena {
  uint8_t* base = nullptr;  // the daemon's mapping of the arena
  uint64_t bytes = 0;
  std::string segment;          // the object's name
  uint64_t segment_offset = 0;  // the arena's first byte in the object
  uint64_t device = 0;          // the object the daemon mapped (fstat)
  uint64_t inode = 0;
};

// What crossed the wire: the dtype of the cross-node hop and the bytes
// handed to the collective (count x wire element size, summed; a ring
// allreduce sends 2(n-1)/n times that per node).
struct WireStats {
  std::string dtype = "off";
  uint64_t payload_bytes = 0;
};

// Elements [begin, end) of a piece.
struct ElementSpan {
  size_t begin = 0;
  size_t end = 0;
  bool empty() const { return begin >= end; }
  bool operator==(const ElementSpan& o) const { return begin == o.begin && end == o.end; }
};

// What a checked IssueAllreduceAverage found in one piece.
struct AverageCheck {
  // An element of the average is NaN or Inf.
  bool result_non_finite = false;
  // The elements whose input the collective tested itself
  // (InputsTestedInCollective), and the first of them that is NaN or Inf:
  // its index in the piece and its value.
  ElementSpan inputs_tested;
  bool input_non_finite = false;
  uint64_t input_element = 0;
  double input_value = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "local", "gloo", "nccl".
  virtual std::string name() const = 0;
  virtual int num_nodes() const = 0;

  // Sums `count` elements of `dtype` at `data` across every node, in place.
  // Errors (gradsync codes): PEER_FAILED when a peer failed or on Abort,
  // TIMEOUT on timeout. After an error the backend is unusable until recreated.
  virtual absl::Status AllreduceSum(void* data, size_t count, DType dtype) = 0;

  // The same sum, split in two so that several can be outstanding: Issue
  // starts it, AwaitIssued waits for the oldest issued one not yet awaited
  // (collectives complete in issue order, on every node alike). `data`
  // must stay untouched until then. A backend whose collectives run on the
  // calling thread completes it inside Issue (this default). Errors as
  // AllreduceSum, from either call; after one, await nothing more.
  virtual absl::Status IssueAllreduceSum(void* data, size_t count, DType dtype) {
    return AllreduceSum(data, count, dtype);
  }
  virtual absl::Status AwaitIssued() { return absl::OkStatus(); }

  // Sums a few small counts across every node, in place (the scheduler's
  // per-iteration agreement on active trainers, uneven inputs): exact in
  // float64. Errors as AllreduceSum.
  virtual absl::Status AllreduceCounts(double* counts, size_t n) {
    return AllreduceSum(counts, n, DType::kFloat64);
  }

  // The same exact sum, allowed to complete with the next collective the
  // caller issues (IssueAllreduceSum of `next_count` > 0 elements of
  // `next_dtype`, then AwaitIssued): a backend that runs its collectives in
  // another process folds the counts into that collective when it is small
  // (count_fold.h), or else starts their own collective at once, so it runs
  // while the caller sums the next bucket; either way `counts` is filled by
  // the time that collective is awaited, and the collectives every node
  // issues are the same. Sets *deferred then; otherwise (this default) sums
  // at once and clears it. `counts` must stay valid until that await.
  // Errors as AllreduceSum, from this call, that Issue or that await.
  virtual absl::Status AllreduceCountsWithNext(double* counts, size_t n, size_t next_count,
                                               DType next_dtype, bool* deferred) {
    (void)next_count, (void)next_dtype;
    *deferred = false;
    return AllreduceCounts(counts, n);
  }

  // Makes `bytes` bytes at `data` on every node equal to node `root_node`'s
  // (gs_broadcast's cross-node hop). Never concurrent with AllreduceSum:
  // the caller runs it between iterations, when the scheduler issues
  // nothing. Errors as AllreduceSum; UNIMPLEMENTED where the backend has
  // no broadcast.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root_node) {
    (void)data, (void)bytes;
    if (num_nodes() == 1 && root_node == 0) return absl::OkStatus();
    return absl::UnimplementedError(absl::StrCat(name(), " backend: no broadcast across nodes"));
  }

  // The local trainers' arenas, for a backend whose collectives run in
  // another process: it may then reduce in them directly
  // (IssueAllreduceAverage). Replaces any shared before; the arenas must
  // stay mapped while the backend lives. Safe to call from any thread.
  virtual void ShareArenas(std::vector<SharedArena> arenas) { (void)arenas; }

  // Whether IssueAllreduceAverage can run on `bytes` bytes at `data` and
  // copy the average to each of `copies` (the same bytes in other arenas).
  virtual bool ReducesInArenas(const uint8_t* data, uint64_t bytes,
                               absl::Span<uint8_t* const> copies) {
    (void)data, (void)bytes, (void)copies;
    return false;
  }

  // IssueAllreduceSum on `data` (where ReducesInArenas said yes), then,
  // inside the same collective request, the sum divided by `divisor` is
  // written at `data` and copied to every one of `copies`: when
  // AwaitIssued returns OK for it, every local trainer holds the average,
  // and after an error none is told so. `check` non-null: filled by that
  // AwaitIssued (see AverageCheck); it must stay valid until then.
  virtual absl::Status IssueAllreduceAverage(uint8_t* data, size_t count, DType dtype, int divisor,
                                             absl::Span<uint8_t* const> copies,
                                             AverageCheck* check) {
    (void)data, (void)count, (void)dtype, (void)divisor, (void)copies, (void)check;
    // Only a backend whose ReducesInArenas can say yes overrides this; a
    // caller that did not ask it first has a bug.
    return absl::InternalError(absl::StrCat(
        name(), " backend: IssueAllreduceAverage called although its ReducesInArenas is false"));
  }
  // The elements of a `count`-element piece of `dtype` whose input (this
  // node's) the next checked IssueAllreduceAverage tests for NaN and Inf
  // itself, while reducing: the caller need not scan them first. Empty:
  // none. Ask before issuing that piece: counts deferred into it
  // (AllreduceCountsWithNext) can change the answer.
  virtual ElementSpan InputsTestedInCollective(size_t count, DType dtype) const {
    (void)count, (void)dtype;
    return {};
  }

  // A buffer of at least `bytes` that AllreduceSum reduces without copying
  // when `data` lies in it (a backend whose collectives run in another
  // process), or nullptr: any memory is as good. Valid until the next call;
  // never called concurrently with AllreduceSum.
  virtual uint8_t* Staging(uint64_t /*bytes*/) { return nullptr; }

  // Safe to call from any thread.
  virtual WireStats wire_stats() const { return {}; }

  // Makes an in-flight or future AllreduceSum fail promptly (another node
  // died). Safe to call from any thread.
  virtual void Abort(const std::string& reason) = 0;
};

// One node: the local reduction is the whole reduction.
class LocalBackend final : public Backend {
 public:
  std::string name() const override { return "local"; }
  int num_nodes() const override { return 1; }
  absl::Status AllreduceSum(void*, size_t, DType) override { return absl::OkStatus(); }
  void Abort(const std::string&) override {}
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_BACKEND_H_
