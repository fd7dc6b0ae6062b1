#include "daemon/engine/kept_result.h"

#include <algorithm>
#include <cstring>

namespace gradsync {

void KeptResult::Keep(uint64_t iteration, uint32_t bucket, const uint8_t* arena,
                      const std::vector<ReduceSpan>& spans) {
  if (whole_ || iteration != iteration_) {
    whole_ = false;
    iteration_ = iteration;
    kept_buckets_.clear();
  }
  for (const ReduceSpan& span : spans) {
    // The scheduler checked every span against the arena it planned.
    std::memcpy(buffer_.data() + span.offset, arena + span.offset, span.bytes);
  }
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
