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

// The units (pages) of the middle pieces and of each end piece, and how
// many middle pieces: the one cut CountBucketPieces and CutBucketPieces share.
struct Cut {
  uint64_t unit = 1;       // elements per page
  uint64_t units = 0;      // pages in the bucket (the last may be partial)
  uint64_t end_units = 0;  // pages in the first and in the last piece; 0: none
  uint64_t middle = 1;     // pieces between them (all when end_units is 0)
};

Cut PlanCut(uint64_t elements, size_t element_bytes, uint64_t piece_bytes) {
  Cut cut;
  cut.unit = UnitElements(element_bytes);
  const uint64_t max_units =
      std::max<uint64_t>(1, piece_bytes / std::max<size_t>(1, element_bytes) / cut.unit);
  cut.units = (elements + cut.unit - 1) / cut.unit;
  cut.middle = (cut.units + max_units - 1) / max_units;
  if (cut.middle < kMinPiecesToRamp) return cut;  // near-equal pieces, no end pieces
  cut.end_units = std::max<uint64_t>(1, max_units / kEndPieceDivisor);
  const uint64_t middle_units = cut.units - 2 * cut.end_units;
  cut.middle = (middle_units + max_units - 1) / max_units;
  return cut;
}

}  // namespace

uint64_t CountBucketPieces(uint64_t elements, size_t element_bytes, uint64_t piece_bytes) {
  if (elements == 0) return 0;
  const Cut cut = PlanCut(elements, element_bytes, piece_bytes);
  return cut.middle + (cut.end_units > 0 ? 2 : 0);
}

void CutBucketPieces(uint64_t elements, size_t element_bytes, uint64_t piece_bytes,
                     std::vector<BucketPiece>* pieces) {
  pieces->clear();
  if (elements == 0) return;
  const Cut cut = PlanCut(elements, element_bytes, piece_bytes);
  uint64_t first = 0;
  const auto add_until_unit = [&](uint64_t end_unit) {
    const uint64_t end = std::min(elements, end_unit * cut.unit);
    pieces->push_back({first, end - first});
    first = end;
  };
  if (cut.end_units > 0) add_until_unit(cut.end_units);
  // Near-equal middle pieces: piece i ends at unit floor(middle_units * (i + 1) / n).
  const uint64_t start_unit = cut.end_units;
  const uint64_t middle_units = cut.units - 2 * cut.end_units;
  for (uint64_t i = 0; i < cut.middle; ++i) {
    add_until_unit(start_unit + middle_units * (i + 1) / cut.middle);
  }
  if (cut.end_units > 0) add_until_unit(cut.units);
}

absl::Status RunPiecePipeline(const std::vector<BucketPiece>& pieces, Backend& backend,
                              const PieceSteps& steps, PipelineTimings* timings) {
  PipelineTimings t;
  absl::Status status;
  size_t awaited = 0;        // pieces[0, awaited) are done and written back
  int64_t first_issue = 0;   // when the first piece was issued
  int64_t last_awaited = 0;  // when the latest collective returned
  for (size_t k = 0; k < pieces.size() && status.ok(); ++k) {
    const int64_t t0 = MonotonicNowNs();
    steps.sum(pieces[k]);
    const int64_t t1 = MonotonicNowNs();
    if (k == 0) t.exposed_sum_ns = t1 - t0, first_issue = t1;
    status = steps.issue(pieces[k]);
    t.sum_ns += t1 - t0;
    t.collective_ns += MonotonicNowNs() - t1;
    if (!status.ok()) break;
    if (k == 0) continue;
    // k-1's collective ran while k was summed; k's runs during this write-back.
    const int64_t t2 = MonotonicNowNs();
    status = backend.AwaitIssued();
    last_awaited = MonotonicNowNs();
    t.collective_ns += last_awaited - t2;
    if (!status.ok()) break;
    steps.write_back(pieces[awaited++]);
    t.write_back_ns += MonotonicNowNs() - last_awaited;
  }
  if (status.ok() && awaited < pieces.size()) {
    const int64_t t2 = MonotonicNowNs();
    status = backend.AwaitIssued();
    last_awaited = MonotonicNowNs();
    t.collective_ns += last_awaited - t2;
    if (status.ok()) {
      steps.write_back(pieces[awaited++]);
      t.exposed_write_back_ns = MonotonicNowNs() - last_awaited;
      t.write_back_ns += t.exposed_write_back_ns;
    }
  }
  if (first_issue > 0 && last_awaited > first_issue) {
    t.collective_span_ns = last_awaited - first_issue;
  }
  if (timings != nullptr) *timings = t;
  return status;
}

}  // namespace gradsync
