// KeptResult: an elastic job's last completed iteration's result, kept by
// the daemon after its trainers got it (docs/DESIGN.md, "Elastic jobs").
//
// A node's death inside an iteration's last collective can leave some
// survivors past the iteration and others still in it. The ones past it
// hand it to the others from here: their trainers' arenas no longer hold it
// once the next backward writes them. The LocalReducer's write-back loop
// writes each bucket's average here too, at its arena offsets, while it
// writes the trainers' arenas (sink(): no pass of its own over memory).
// The next iteration's first write-back ends the previous result, which by
// then no survivor can need (a write-back runs only after its piece's
// collective, which completed only once every node had completed the
// iteration before it).
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
  void Resize(uint64_t arena_bytes) {
    buffer_.resize(arena_bytes);
    bytes_ = arena_bytes;
    sink_.base = buffer_.data();
  }
  // The GPU path: the result lies in device memory (GpuSession's kept
  // result, one copy per GPU, `flat_bytes` each), written by GpuReducer;
  // this keeps only which iteration it holds. data() is null then.
  void KeepOnDevice(uint64_t flat_bytes) {
    buffer_.clear();
    bytes_ = flat_bytes;
    sink_.base = nullptr;
  }
  bool enabled() const { return bytes_ > 0; }

  // Where LocalReducer::Reduce writes each bucket's average as it writes
  // it back. Once it wrote there, no iteration is held until the next
  // Kept or Received: a reduction that failed midway leaves a mix.
  KeptResultSink* sink() { return &sink_; }
  // `bucket` of `iteration` was written whole through sink() (its Reduce
  // succeeded). The first bucket of an iteration ends the one kept before.
  void Kept(uint64_t iteration, uint32_t bucket);
  // `iteration` completed after `buckets` buckets averaged over `divisor`
  // (`skipped`: --nonfinite=skip skipped it): whole if every bucket was kept.
  void Complete(uint64_t iteration, size_t buckets, int divisor, bool skipped);
  // The buffer now holds `iteration`'s whole result, received from a node
  // that completed it.
  void Received(uint64_t iteration, int divisor, bool skipped);

  // The buffer is about to be overwritten (a result being received).
  void Drop() { whole_ = false; }
  // Whether it holds the whole result of `iteration`.
  bool Holds(uint64_t iteration) const {
    return whole_ && iteration_ == iteration && !sink_.written;
  }
  int divisor() const { return divisor_; }
  bool skipped() const { return skipped_; }
  uint8_t* data() { return buffer_.data(); }
  uint64_t bytes() const { return bytes_; }

  // Copies the kept result into `arena` over `spans` (host only).
  void WriteBack(uint8_t* arena, const std::vector<ReduceSpan>& spans) const;

 private:
  std::vector<uint8_t> buffer_;
  uint64_t bytes_ = 0;   // buffer_'s, or the device copy's
  KeptResultSink sink_;  // into buffer_
  uint64_t iteration_ = 0;
  std::vector<bool> kept_buckets_;  // of iteration_, while it fills
  bool whole_ = false;
  int divisor_ = 0;
  bool skipped_ = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_KEPT_RESULT_H_
