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
// first sum and the last write-back, which nothing overlaps, stay short.
inline constexpr uint64_t kPieceBytes = 8 << 20;

// Elements [first, first + count) of the bucket's spans laid end to end.
struct BucketPiece {
  uint64_t first = 0;
  uint64_t count = 0;
};

// Cuts `elements` elements of `element_bytes` bytes (the dtype the
// collective reduces) into the fewest pieces of at most `piece_bytes`,
// of near-equal size, each but the last a whole number of 4 KB pages.
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

struct PipelineTimings {
  int64_t sum_ns = 0;         // in `sum`
  int64_t collective_ns = 0;  // issuing and waiting: the collectives' exposed time
  int64_t write_back_ns = 0;  // in `write_back`
};

// Runs the pieces in order: sum k, issue k, then await k-1 and write it
// back while k's collective runs. One collective outstanding besides the
// one being waited for: the order is the same on every node. The first
// error (issue or await) ends it: nothing more is issued or written back.
absl::Status RunPiecePipeline(const std::vector<BucketPiece>& pieces, Backend& backend,
                              const PieceSteps& steps, PipelineTimings* timings);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_BUCKET_PIECES_H_
