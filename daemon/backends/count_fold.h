// CountFold: the scheduler's per-iteration counts (Backend::
// AllreduceCountsWithNext) carried inside a small bucket's own collective,
// so an iteration of small buckets pays one cross-node latency, not two.
//
// The counts are whole numbers (trainer counts, no_sync counts, config
// versions) but the bucket's collective sums float32 or float64: each count
// crosses as kCountLimbs limbs of 16 bits, one element each, appended to the
// bucket. A limb summed over fewer than 256 nodes stays below 2^24, exact in
// float32, so the counts come back exact whatever the bucket's dtype.
//
// Whether a collective folds depends only on what every node shares (the
// bucket's element count and dtype, the job's wire dtype and node count),
// so every node issues the same collectives. A folded collective is always
// longer than gs_broadcast's agreement (Broadcaster), so a node
// mid-iteration while another broadcasts still fails on the length.
#ifndef GRADSYNC_DAEMON_BACKENDS_COUNT_FOLD_H_
#define GRADSYNC_DAEMON_BACKENDS_COUNT_FOLD_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "daemon/backends/wire_dtype.h"

namespace gradsync {

inline constexpr size_t kCountLimbs = 4;  // 64 bits; counts stay below 2^53
// Larger buckets keep a collective of their own for the counts: the copy
// into the folded buffer would cost more than the latency it saves.
inline constexpr uint64_t kCountFoldMaxBytes = 256 << 10;

// True when `count` elements of `dtype` (as the collective sums them) may
// carry `n` counts on this job's wire: float64, or float32 on an
// uncompressed wire (a 16-bit wire rounds), fewer than 256 nodes.
bool CanFoldCounts(size_t count, DType dtype, WireDType wire, int num_nodes, size_t n);

// Writes the n * kCountLimbs limbs of `counts` at `out` (elements of
// `dtype`). INVALID_ARGUMENT for a count that is not a whole number in
// [0, 2^53).
absl::Status EncodeCounts(const double* counts, size_t n, DType dtype, void* out);

// Reads the summed limbs at `in` back into `counts`.
void DecodeCounts(const void* in, size_t n, DType dtype, double* counts);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_COUNT_FOLD_H_
