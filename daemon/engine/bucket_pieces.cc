#include "daemon/engine/bucket_pieces.h"

#include <algorithm>

#include "common/monotonic.h"

namespace gradsync {
namespace {

constexpr uint64_t kPageBytes = 4096;

// Whole pages keep pieces apart in memory (no cache line or page shared
// between a piece being written back and one being reduced).
uint64_t UnitElements(size_t element_bytes) {
  return std::max<uint64_t>(1, kPageBytes / std::max<size_t>(1, element_bytes));
}

}  // namespace

uint64_t CountBucketPieces(uint64_t elements, size_t element_bytes, uint64_t piece_bytes) {
  const uint64_t unit = UnitElements(element_bytes);
  const uint64_t max_units =
      std::max<uint64_t>(1, piece_bytes / std::max<size_t>(1, element_bytes) / unit);
  const uint64_t units = (elements + unit - 1) / unit;
  return (units + max_units - 1) / max_units;
}

void CutBucketPieces(uint64_t elements, size_t element_bytes, uint64_t piece_bytes,
                     std::vector<BucketPiece>* pieces) {
  pieces->clear();
  if (elements == 0) return;
  const uint64_t unit = UnitElements(element_bytes);
  const uint64_t units = (elements + unit - 1) / unit;
  const uint64_t n = CountBucketPieces(elements, element_bytes, piece_bytes);
  uint64_t first = 0;
  for (uint64_t i = 0; i < n; ++i) {
    // Near-equal: piece i ends at unit floor(units * (i + 1) / n).
    const uint64_t end = i + 1 == n ? elements : std::min(elements, units * (i + 1) / n * unit);
    pieces->push_back({first, end - first});
    first = end;
  }
}

absl::Status RunPiecePipeline(const std::vector<BucketPiece>& pieces, Backend& backend,
                              const PieceSteps& steps, PipelineTimings* timings) {
  PipelineTimings t;
  absl::Status status;
  size_t awaited = 0;  // pieces[0, awaited) are done and written back
  for (size_t k = 0; k < pieces.size() && status.ok(); ++k) {
    const int64_t t0 = MonotonicNowNs();
    steps.sum(pieces[k]);
    const int64_t t1 = MonotonicNowNs();
    status = steps.issue(pieces[k]);
    t.sum_ns += t1 - t0;
    t.collective_ns += MonotonicNowNs() - t1;
    if (!status.ok()) break;
    if (k == 0) continue;
    // k-1's collective ran while k was summed; k's runs during this write-back.
    const int64_t t2 = MonotonicNowNs();
    status = backend.AwaitIssued();
    const int64_t t3 = MonotonicNowNs();
    t.collective_ns += t3 - t2;
    if (!status.ok()) break;
    steps.write_back(pieces[awaited++]);
    t.write_back_ns += MonotonicNowNs() - t3;
  }
  if (status.ok() && awaited < pieces.size()) {
    const int64_t t2 = MonotonicNowNs();
    status = backend.AwaitIssued();
    const int64_t t3 = MonotonicNowNs();
    t.collective_ns += t3 - t2;
    if (status.ok()) {
      steps.write_back(pieces[awaited++]);
      t.write_back_ns += MonotonicNowNs() - t3;
    }
  }
  if (timings != nullptr) *timings = t;
  return status;
}

}  // namespace gradsync
