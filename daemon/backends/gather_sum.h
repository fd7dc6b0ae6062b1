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
// same collective. Where nodes disagree anyway (a node mid-iteration while
// another broadcasts: gathers of different lengths), a longer message than
// expected fails in Gloo, and a shorter one, which Gloo accepts, is caught
// here: each node's row ends with its element count, and every row's end
// is poisoned before the gather, so a row that arrived short still holds
// the poison (CheckGatheredRows). Gloo tells an allgather's messages from
// an allreduce's (different slots): a gather on one node and a ring on the
// other is caught only by the timeout; both sides of that misuse are small
// in practice (the broadcast's agreement, a small bucket), so both gather.
#ifndef GRADSYNC_DAEMON_BACKENDS_GATHER_SUM_H_
#define GRADSYNC_DAEMON_BACKENDS_GATHER_SUM_H_

#include <cstddef>
#include <cstring>

#include "common/dtype.h"
#include "daemon/backends/wire_dtype.h"

namespace gradsync {

// The gathered copies (node count x the buffer) stay within this. Measured
// on loopback, 2 nodes (docs/PERFORMANCE.md): gathering wins at 4 KB (ring
// 176 -> 104 µs) and 64 KB, loses at 256 KB (627 vs 514 µs) and 1 MB: there
// the bytes, not the latencies, set the time.
inline constexpr size_t kGatherSumMaxBytes = size_t{256} << 10;

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

// A row: the node's `count` elements, then `count` itself (exact: count
// stays below 2^24 under kGatherSumMaxBytes).
inline size_t GatherRowElements(size_t count) { return count + 1; }

// Fills this node's row (`send`) and poisons every row's end in `gathered`
// (num_nodes rows), which the gather overwrites only where a whole row came.
template <typename T>
void PrepareGather(const T* data, size_t count, int num_nodes, T* send, T* gathered) {
  std::memcpy(send, data, count * sizeof(T));
  send[count] = static_cast<T>(count);
  for (int node = 0; node < num_nodes; ++node) {
    gathered[static_cast<size_t>(node) * GatherRowElements(count) + count] = static_cast<T>(-1);
  }
}

// The first node whose row did not end with `count` (it sent a gather of
// another length), or -1 when every row is whole.
template <typename T>
int CheckGatheredRows(const T* gathered, size_t count, int num_nodes) {
  for (int node = 0; node < num_nodes; ++node) {
    if (gathered[static_cast<size_t>(node) * GatherRowElements(count) + count] !=
        static_cast<T>(count)) {
      return node;
    }
  }
  return -1;
}

// out[i] = row 0's [i] + row 1's [i] + ... in node order.
template <typename T>
void SumGathered(const T* gathered, size_t count, int num_nodes, T* out) {
  for (size_t i = 0; i < count; ++i) out[i] = gathered[i];
  for (int node = 1; node < num_nodes; ++node) {
    const T* row = gathered + static_cast<size_t>(node) * GatherRowElements(count);
    for (size_t i = 0; i < count; ++i) out[i] += row[i];
  }
}

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GATHER_SUM_H_
