// KeptResult: an elastic job's last completed iteration's result, kept by
// the daemon after its trainers got it (docs/DESIGN.md, "Elastic jobs").
//
// A node's death inside an iteration's last collective can leave some
// survivors past the iteration and others still in it. The ones past it
// hand it to the others from here: their trainers' arenas no longer hold it
// once the next backward writes them. Each bucket's average is copied at
// its arena offsets as it is written back (one memcpy of the gradients per
// iteration); the copy of the next iteration's first bucket ends the
// previous result, which by then no survivor can need (that bucket's
// collective completed only once every node had completed the iteration
// before it).
#ifndef GRADSYNC_DAEMON_ENGINE_KEPT_RESULT_H_
#define GRADSYNC_DAEMON_ENGINE_KEPT_RESULT_H_

#include <cstdint>
#include <vector>

#include "daemon/engine/local_reducer.h"

namespace gradsync {

class KeptResult {
 public:
  // The arena's size: each gradient is kept at its arena offset, so the
  // result does not depend on the plan that reduced it.
  void Resize(uint64_t arena_bytes) { buffer_.resize(arena_bytes); }
  bool enabled() const { return !buffer_.empty(); }

  // `bucket` of `iteration` was written back into `arena` over `spans`:
  // copies it. The first copy of an iteration ends the one kept before.
  void Keep(uint64_t iteration, uint32_t bucket, const uint8_t* arena,
            const std::vector<ReduceSpan>& spans);
  // `iteration` completed after `buckets` buckets averaged over `divisor`
  // (`skipped`: --nonfinite=skip skipped it): whole if every bucket was kept.
  void Complete(uint64_t iteration, size_t buckets, int divisor, bool skipped);
  // The buffer now holds `iteration`'s whole result, received from a node
  // that completed it.
  void Received(uint64_t iteration, int divisor, bool skipped);

  // The buffer is about to be overwritten (a result being received).
  void Drop() { whole_ = false; }
  // Whether it holds the whole result of `iteration`.
  bool Holds(uint64_t iteration) const { return whole_ && iteration_ == iteration; }
  int divisor() const { return divisor_; }
  bool skipped() const { return skipped_; }
  uint8_t* data() { return buffer_.data(); }
  uint64_t bytes() const { return buffer_.size(); }

  // Copies the kept result into `arena` over `spans`.
  void WriteBack(uint8_t* arena, const std::vector<ReduceSpan>& spans) const;

 private:
  std::vector<uint8_t> buffer_;
  uint64_t iteration_ = 0;
  std::vector<bool> kept_buckets_;  // of iteration_, while it fills
  bool whole_ = false;
  int divisor_ = 0;
  bool skipped_ = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_KEPT_RESULT_H_
