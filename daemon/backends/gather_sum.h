// GatherSum: how GlooBackend sums a small collective across nodes. Gloo's
// ring allreduce takes 2(n-1) steps, each one network latency; for a
// small buffer the latencies are the whole cost. Instead every node
// gathers every node's buffer (gloo::allgather: n-1 steps, one on 2
// nodes) and adds the copies itself, in node order: every node adds the
// same values in the same order, so every node holds the same result.
// On 2 nodes the bytes each node receives are the ring's (the other
// node's buffer); on n nodes they are n/2 times the ring's, hence the cap.
//
// Whether a collective gathers depends only on what every node shares
// (element count, dtype, wire dtype, node count), so every node issues the
// same collective. Gloo tells an allgather's messages from an allreduce's
// (different slots), so where two nodes disagree anyway (a node
// mid-iteration while another broadcasts) a gather on one node and a ring
// on the other is caught only by the timeout, not by a length mismatch;
// both sides of that misuse are small (the broadcast's agreement and a
// small bucket) in practice, and two gathers of different lengths still
// fail at once.
#ifndef GRADSYNC_DAEMON_BACKENDS_GATHER_SUM_H_
#define GRADSYNC_DAEMON_BACKENDS_GATHER_SUM_H_

#include <cstddef>

#include "common/dtype.h"
#include "daemon/backends/wire_dtype.h"

namespace gradsync {

// The gathered copies (node count x the buffer) stay within this.
inline constexpr size_t kGatherSumMaxBytes = size_t{1} << 20;

// float32 (uncompressed wire) and float64 only: the dtypes a cross-node
// bucket is staged in, and the counts.
inline bool UseGatherSum(size_t count, DType dtype, WireDType wire, int num_nodes) {
  if (num_nodes < 2 || count == 0) return false;
  if (dtype == DType::kFloat32) {
    if (wire != WireDType::kOff) return false;
  } else if (dtype != DType::kFloat64) {
    return false;
  }
  return count * DTypeSize(dtype) * static_cast<size_t>(num_nodes) <= kGatherSumMaxBytes;
}

// out[i] = gathered[0][i] + gathered[1][i] + ... in node order; `gathered`
// holds num_nodes rows of `count` elements, node 0's first.
template <typename T>
void SumGathered(const T* gathered, size_t count, int num_nodes, T* out) {
  for (size_t i = 0; i < count; ++i) out[i] = gathered[i];
  for (int node = 1; node < num_nodes; ++node) {
    const T* row = gathered + static_cast<size_t>(node) * count;
    for (size_t i = 0; i < count; ++i) out[i] += row[i];
  }
}

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GATHER_SUM_H_
