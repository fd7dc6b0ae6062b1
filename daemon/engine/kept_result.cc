#include "daemon/engine/kept_result.h"

#include <algorithm>
#include <cstring>

namespace gradsync {

void KeptResult::Kept(uint64_t iteration, uint32_t bucket) {
  if (whole_ || iteration != iteration_) {
    whole_ = false;
    iteration_ = iteration;
    kept_buckets_.clear();
  }
  // What was written now belongs to iteration_, whose buckets are counted.
  sink_.written = false;
  if (kept_buckets_.size() <= bucket) kept_buckets_.resize(bucket + 1, false);
  kept_buckets_[bucket] = true;
}

void KeptResult::Complete(uint64_t iteration, size_t buckets, int divisor, bool skipped) {
  if (Holds(iteration) || iteration != iteration_) return;
  const bool all =
      kept_buckets_.size() == buckets &&
      std::all_of(kept_buckets_.begin(), kept_buckets_.end(), [](bool k) { return k; });
  if (!all) return;
  whole_ = true;
  divisor_ = divisor;
  skipped_ = skipped;
}

void KeptResult::Received(uint64_t iteration, int divisor, bool skipped) {
  sink_.written = false;  // the whole buffer was overwritten with it
  iteration_ = iteration;
  kept_buckets_.clear();
  whole_ = true;
  divisor_ = divisor;
  skipped_ = skipped;
}

void KeptResult::WriteBack(uint8_t* arena, const std::vector<ReduceSpan>& spans) const {
  for (const ReduceSpan& span : spans) {
    std::memcpy(arena + span.offset, buffer_.data() + span.offset, span.bytes);
  }
}

}  // namespace gradsync
