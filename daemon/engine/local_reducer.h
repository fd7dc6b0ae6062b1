// LocalReducer: reduces one bucket across this node's trainers and, through
// the Backend, across nodes; then writes the average back to every trainer.
//
// The bucket is a list of byte spans, identical in every trainer's arena
// (usually one contiguous span). One node: a single streaming pass (read
// every trainer's gradient once, write the average into each once). Several
// nodes, piece by piece with the collectives pipelined (bucket_pieces.h):
// where the backend reduces in the trainers' arenas itself
// (Backend::ReducesInArenas), sum into trainer 0's arena and let the
// backend's collective divide and copy the average out; else sum into a
// staging buffer, backend allreduce, then divide and write back.
// Half-precision gradients are accumulated in fp32. Threads split the bucket; nothing is allocated
// per call.
#ifndef GRADSYNC_DAEMON_ENGINE_LOCAL_REDUCER_H_
#define GRADSYNC_DAEMON_ENGINE_LOCAL_REDUCER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/dtype.h"
#include "daemon/backends/backend.h"
#include "daemon/engine/bucket_pieces.h"
#include "daemon/engine/worker_pool.h"

namespace gradsync {

struct ReduceSpan {
  uint64_t offset = 0;  // byte offset in every arena
  uint64_t bytes = 0;   // a multiple of the dtype's size
};

struct ReduceTimings {
  int64_t local_reduce_ns = 0;  // local sum (+ write back on one node)
  int64_t collective_ns = 0;    // the backend's cross-node allreduce
  // The part of local_reduce_ns after the collective that copies the result
  // into every arena (0 on one node: fused into the sum).
  int64_t write_back_ns = 0;
  size_t threads = 1;  // threads the bucket was split across
};

inline constexpr size_t kMaxLocalTrainers = 256;

// Elastic jobs: one bucket's local sum (the collective's input, staged
// dtype), kept so that an iteration a node's death interrupted can be
// redone after the trainers' memory already received an average. Reduce
// takes pieces [0, pieces) from `sums` instead of summing the arenas, and
// writes each piece it sums there from the loop that sums it, with no
// second pass over memory (pieces counts them).
struct KeptSums {
  uint8_t* sums = nullptr;
  size_t pieces = 0;
};

// Elastic CPU jobs across nodes: where Reduce also writes the bucket's
// average, at each span's arena offset, from the write-back loop itself
// (KeptResult owns the buffer, the arena's size). `written` is set before
// the first average lands there, so the owner knows its previous content
// is gone even if the reduction then fails. (GpuReducer::Reduce takes it
// too, with `base` null: its copy is in device memory, and it only sets
// `written`.)
struct KeptResultSink {
  uint8_t* base = nullptr;
  bool written = false;
};

// What the non-finite check (Reduce's `nonfinite`) found in one bucket. The
// check is fused into the sum and the write-back (a per-block OR of values
// already in registers, tested once per block); the search for the culprit
// runs only once something was found.
struct NonFiniteReport {
  // The bucket's result holds a NaN or an Inf. Across nodes this is the
  // allreduce's result, identical on every node: a non-finite local sum
  // anywhere poisons it (NaN + x = NaN, Inf + x = Inf, Inf - Inf = NaN).
  bool result_non_finite = false;
  // A local trainer's gradient holds one: the first such element (lowest
  // arena offset). False with result_non_finite: it came from another node,
  // or a sum of finite values overflowed.
  bool local = false;
  size_t trainer = 0;         // index into Reduce's `arenas`
  uint64_t arena_offset = 0;  // the element's byte offset in the arena
  double value = 0;
};

class LocalReducer {
 public:
  // `threads`: workers including the caller. `staging_bytes`: the largest
  // StagingBytes() of any bucket when a cross-node backend is used, else 0.
  LocalReducer(size_t threads, uint64_t staging_bytes);

  // Staging needed for a bucket of `bytes` bytes of `dtype` (halves widen to fp32).
  static uint64_t StagingBytes(uint64_t bytes, DType dtype);

  // `arenas[t]` is trainer t's arena base. The spans must lie within every
  // arena (the caller checked them against the plan). `arenas` is empty on
  // a node of several whose trainers all joined (gs_join): it contributes
  // zeros to the collective and writes nothing back. Returns the backend's
  // error if the cross-node step fails (the arenas are then left partially
  // summed, which does not matter: the iteration failed). `threads`: how
  // many of the pool's threads to use (0: all); the split changes which
  // thread sums an element, never how, so results are bit-identical.
  // `nonfinite` non-null: check every input and the result for NaN/Inf (see
  // NonFiniteReport); where a result element is not finite the trainers'
  // memory is left unspecified (the iteration is failed or skipped).
  // `kept`, `kept_result` (elastic jobs): see KeptSums and KeptResultSink;
  // both are written by the passes that sum and write back, not after them.
  // `input_copies` (elastic jobs with several local trainers, across
  // nodes): one base per arena, laid out like it; the pass that sums the
  // arenas also streams each trainer's input there (non-temporal, from the
  // chunk it just read), so that a trainer dying mid-iteration leaves its
  // node the others' inputs to sum again. Pieces taken from `kept` are not
  // summed, so not copied; nor is one trainer's unchecked in-place input
  // (no pass reads it; the scheduler passes copies for two or more).
  absl::Status Reduce(const std::vector<uint8_t*>& arenas, const std::vector<ReduceSpan>& spans,
                      DType dtype, int world_size, Backend& backend, ReduceTimings* timings,
                      size_t threads = 0, NonFiniteReport* nonfinite = nullptr,
                      KeptSums* kept = nullptr, KeptResultSink* kept_result = nullptr,
                      const std::vector<uint8_t*>* input_copies = nullptr);

  size_t threads() const { return pool_.size(); }
  // What one thread's slice of the non-finite check found (internal).
  struct SliceFinding {
    uint32_t result_bad = 0;
    bool local = false;
    size_t trainer = 0;
    uint64_t arena_offset = 0;
    double value = 0;
  };
  // Grows the staging buffer (at plan changes only, never per call).
  void EnsureStaging(uint64_t bytes) {
    if (staging_.size() < bytes) staging_.resize(bytes);
  }

 private:
  // The cross-node path when the backend reduces in the trainers' arenas
  // and writes the average there itself (Backend::ReducesInArenas): the
  // daemon only sums into trainer 0's arena (or, one trainer, checks it),
  // piece by piece ahead of each piece's collective. `run(phase, piece)`
  // runs one of Reduce's passes over a piece.
  // `may_fold_scan`: one trainer's input scan may leave out what the
  // collective tests itself (Backend::InputsTestedInCollective); not where
  // the scan also copies the inputs.
  absl::Status ReduceInArenas(const std::vector<uint8_t*>& arenas, uint64_t offset, DType dtype,
                              int world_size, Backend& backend, NonFiniteReport* nonfinite,
                              bool may_fold_scan,
                              absl::FunctionRef<void(int, const BucketPiece&)> run,
                              PipelineTimings* pipeline);
  // The input scan (phase 5) of `piece` outside `tested` (piece-relative).
  static void ScanUntested(const BucketPiece& piece, const ElementSpan& tested,
                           absl::FunctionRef<void(int, const BucketPiece&)> run);
  // Folds each piece's AverageCheck into `nonfinite`; with `fold`, the
  // culprit the collective found in the inputs it tested, and INTERNAL
  // where it tested others than the scan left out.
  absl::Status CollectPieceChecks(uint64_t offset, size_t unit, bool fold,
                                  NonFiniteReport* nonfinite);
  absl::Status ReduceZeros(const std::vector<ReduceSpan>& spans, DType dtype, Backend& backend,
                           ReduceTimings* timings);

  WorkerPool pool_;
  std::vector<uint8_t> staging_;        // fp32 for half types; native otherwise
  std::vector<BucketPiece> pieces_;     // the cross-node bucket's, reused
  std::vector<SliceFinding> findings_;  // one per pool thread
  // ReduceInArenas': the other trainers' copy of a piece, and what each
  // piece's check found (filled when its collective is awaited).
  std::vector<uint8_t*> copies_;
  struct PieceFlag {
    AverageCheck check;
    ElementSpan tested;  // the inputs the scan left to the collective
  };
  std::vector<PieceFlag> piece_flags_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_LOCAL_REDUCER_H_
