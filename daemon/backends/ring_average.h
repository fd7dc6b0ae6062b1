// RingAverage: a piece's average computed inside Gloo's ring allreduce
// between 2 nodes, instead of by a pass of its own over the result.
//
// Why it is exact: between 2 nodes Gloo's ring (gloo/allreduce.cc,
// Algorithm::RING) reduces every element exactly once, on the node that
// owns its chunk, as fl(own + peer's), and its allgather only copies. A
// reduce function that writes fl(fl(own + peer's) / d) there writes the
// very bits of summing (gloo::sum) and then dividing (WriteAverage): the
// same two roundings in the same order. With 3 or more nodes an element is
// added once per hop of the ring and would be divided as often, so those
// keep the separate pass.
//
// The reduce function records which elements it wrote: the result's NaN /
// Inf check then reads only the others (the peer's chunk), and an element
// reduced twice on this node fails the piece instead of being divided
// twice. Checking, it also names the first of this node's own inputs in
// its chunk that is NaN or Inf (read before the average overwrites it), so
// the daemon scans only the other chunk (RingOwnedElements) ahead of the
// collective: every input is still tested once, by the node that holds it.
//
// Threads: the thread that calls gloo::allreduce (Gloo reduces on it).
#ifndef GRADSYNC_DAEMON_BACKENDS_RING_AVERAGE_H_
#define GRADSYNC_DAEMON_BACKENDS_RING_AVERAGE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "daemon/backends/wire_dtype.h"
#include "gloo/allreduce.h"

namespace gradsync {

// Whether an average of `count` elements can be a RingAverage: 2 nodes,
// float32 on the uncompressed wire or float64, in Gloo's ring (a small
// bucket is gathered instead, gather_sum.h).
bool CanAverageInRing(size_t count, DType dtype, WireDType wire, int num_nodes);

// The elements [begin, end) of a `count`-element piece of `element_size`
// bytes that Gloo's ring (the default segment size) reduces on node
// `node_rank` of 2: gloo/allreduce.cc splits the piece into an even
// number (at least 4) of equal segments, multiples of the element size,
// and node r reduces the r-th half of them.
struct ElementRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};
ElementRange RingOwnedElements(size_t count, size_t element_size, int node_rank);

class RingAverage {
 public:
  // The piece is the `count` elements of `dtype` (float32 or float64) at
  // `base`; `check` also tests each average it writes for NaN and Inf.
  RingAverage(char* base, size_t count, DType dtype, int divisor, bool check);
  RingAverage(const RingAverage&) = delete;
  RingAverage& operator=(const RingAverage&) = delete;

  // For gloo::AllreduceOptions::setReduceFunction; refers to *this.
  gloo::AllreduceOptions::Func ReduceFunction();

  // After the allreduce: INTERNAL when Gloo reduced an element twice on
  // this node or outside the piece (the averages would be wrong).
  absl::Status Verify() const;

  // The elements [averaged_begin, averaged_end) were averaged (and, with
  // `check`, tested) here; the others arrived averaged from the peer.
  size_t averaged_begin() const { return reduced_ == 0 ? 0 : begin_; }
  size_t averaged_end() const { return reduced_ == 0 ? 0 : end_; }
  // With `check`: whether an average written here is NaN or Inf.
  bool non_finite() const { return poison_ != 0; }
  // With `check`: whether this node's own input, in the elements averaged
  // here, holds a NaN or Inf; the first such element and its value.
  bool input_non_finite() const { return input_found_; }
  size_t input_element() const { return input_element_; }
  double input_value() const { return input_value_; }

 private:
  template <typename T, typename Bits, bool kByReciprocal>
  static void Reduce(RingAverage& self, void* out, const void* a, const void* b, size_t n);
  // Notes that `n` elements at `out` were averaged here.
  void Record(const void* out, size_t n, size_t element_size);
  // Of the `n` inputs `a` and `b` to the averages at `out`, this node's own
  // (the one Gloo reduces into); nullptr when neither is `out`.
  static const void* OwnInput(const void* out, const void* a, const void* b);
  // Notes the first NaN or Inf among the `n` own inputs at `own`.
  template <typename T>
  void NoteInput(const T* own, size_t n);

  char* const base_;
  const size_t count_;
  const bool check_;
  const double divisor_;
  void (*reduce_)(RingAverage&, void*, const void*, const void*, size_t) = nullptr;
  uint64_t poison_ = 0;
  size_t begin_ = 0;
  size_t end_ = 0;
  size_t reduced_ = 0;
  bool outside_ = false;
  bool own_unknown_ = false;
  bool input_found_ = false;
  size_t input_element_ = 0;
  double input_value_ = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_RING_AVERAGE_H_
