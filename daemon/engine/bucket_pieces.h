// BucketPieces: a cross-node bucket cut into pieces whose collectives are
// pipelined with the local passes around them. While the backend reduces
// piece k across nodes, the daemon sums piece k+1 over its trainers and
// writes piece k-1's average back, so one big bucket no longer pays its
// local sum and write-back on top of the collective.
//
// Every node must issue the same collectives in the same order (Gloo pairs
// them by order), so the cut depends only on what the plan fixes (the
// bucket's element count and dtype, agreed through the plan fingerprint)
// and on kPieceBytes, a constant of the daemon: never on a node's flags.
#ifndef GRADSYNC_DAEMON_ENGINE_BUCKET_PIECES_H_
#define GRADSYNC_DAEMON_ENGINE_BUCKET_PIECES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "daemon/backends/backend.h"

namespace gradsync {

// Large enough that a piece's collective runs at the transport's speed (a
// Gloo ring costs ~0.3 ms per call on loopback), small enough that the
// daemon's sums and the worker's averages keep up with the collectives.
inline constexpr uint64_t kPieceBytes = 8 << 20;
// A bucket cut in several pieces starts and ends with a piece of
// kPieceBytes / kEndPieceDivisor: the first piece's sum and the last one's
// average have no collective to hide behind, so they are kept short, while
// the second piece's sum (4x the first) still fits in the first collective.
inline constexpr uint64_t kEndPieceDivisor = 4;
// Only a bucket of at least this many pieces of kPieceBytes gets the end
// pieces: they add two collectives, each with Gloo's per-call cost (on a
// busy 2-core machine ~2-3 ms, measured: a 16 MiB bucket was slower cut
// 2 + 6 + 6 + 2 MiB than 8 + 8, a 64 MiB one faster cut 2 + 8 x 7.5 + 2).
inline constexpr uint64_t kMinPiecesToRamp = 3;

// Elements [first, first + count) of the bucket's spans laid end to end.
struct BucketPiece {
  uint64_t first = 0;
  uint64_t count = 0;
};

// Cuts `elements` elements of `element_bytes` bytes (the dtype the
// collective reduces) into pieces of at most `piece_bytes`, each but the
// last a whole number of 4 KB pages: the fewest near-equal pieces of at
// most `piece_bytes`; when that is kMinPiecesToRamp or more, a first and a
// last piece of piece_bytes / kEndPieceDivisor (rounded down to pages)
// around the fewest near-equal pieces of at most `piece_bytes` between.
// Empty for 0 elements. Replaces `*pieces` (its capacity is reused).
void CutBucketPieces(uint64_t elements, size_t element_bytes, uint64_t piece_bytes,
                     std::vector<BucketPiece>* pieces);
// How many pieces CutBucketPieces makes of the same bucket.
uint64_t CountBucketPieces(uint64_t elements, size_t element_bytes, uint64_t piece_bytes);

// The passes of one bucket, per piece.
struct PieceSteps {
  // Sums the piece over the local trainers into where the collective runs.
  absl::FunctionRef<void(const BucketPiece&)> sum;
  // backend.IssueAllreduceSum on the piece's summed data.
  absl::FunctionRef<absl::Status(const BucketPiece&)> issue;
  // Writes the piece's cross-node sum, averaged, back to the trainers.
  absl::FunctionRef<void(const BucketPiece&)> write_back;
};

// Where a bucket's time went, two ways. The daemon's own work: every sum,
// every write-back, and its waits for the collectives. The critical path:
// the first piece's sum (no collective runs yet), the span from the first
// issue to the last collective's return (the later pieces' sums and all
// but the last write-back run inside it, while a collective is in flight),
// and the last piece's write-back; these three add up to the bucket.
struct PipelineTimings {
  int64_t sum_ns = 0;                 // in `sum`
  int64_t collective_ns = 0;          // issuing and waiting: the daemon's wait for the collectives
  int64_t write_back_ns = 0;          // in `write_back`
  int64_t exposed_sum_ns = 0;         // the first piece's sum
  int64_t collective_span_ns = 0;     // first issue -> the last collective awaited
  int64_t exposed_write_back_ns = 0;  // the last piece's write-back
};

// Runs the pieces in order: sum k, issue k, then await k-1 and write it
// back while k's collective runs. One collective outstanding besides the
// one being waited for: the order is the same on every node. The first
// error (issue or await) ends it: nothing more is issued or written back.
absl::Status RunPiecePipeline(const std::vector<BucketPiece>& pieces, Backend& backend,
                              const PieceSteps& steps, PipelineTimings* timings);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_BUCKET_PIECES_H_
