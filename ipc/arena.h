// Arena planning: where each gradient lives in a trainer's shared-memory
// arena. Tensors are packed in bucket order at 64-byte aligned offsets and
// every bucket starts on a page, so each bucket is one contiguous range that
// the daemon reduces in place (DDP's gradient_as_bucket_view, across processes).
#ifndef GRADSYNC_IPC_ARENA_H_
#define GRADSYNC_IPC_ARENA_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync::ipc {

inline constexpr uint64_t kTensorAlignment = 64;
inline constexpr uint64_t kBucketAlignment = 4096;
// Far above any real arena, far below 2^64: sizes and offsets up to it can
// be added and aligned without overflow.
inline constexpr uint64_t kMaxArenaBytes = uint64_t{1} << 48;

struct ArenaLayout {
  std::vector<uint64_t> tensor_offsets;  // by registration index
  std::vector<uint64_t> bucket_offsets;  // first byte of each bucket
  std::vector<uint64_t> bucket_bytes;    // contiguous span, alignment padding included
  uint64_t total_bytes = 0;              // a multiple of kBucketAlignment
};

// `tensor_bytes[i]`: size of tensor i. `buckets`: tensor indices per bucket,
// in bucket order; every tensor must appear exactly once.
absl::StatusOr<ArenaLayout> PlanArena(const std::vector<uint64_t>& tensor_bytes,
                                      const std::vector<std::vector<uint32_t>>& buckets);

inline uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_ARENA_H_
