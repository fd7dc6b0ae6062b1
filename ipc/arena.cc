#include "ipc/arena.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace gradsync::ipc {

absl::StatusOr<ArenaLayout> PlanArena(const std::vector<uint64_t>& tensor_bytes,
                                      const std::vector<std::vector<uint32_t>>& buckets) {
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  ArenaLayout layout;
  layout.tensor_offsets.assign(tensor_bytes.size(), kNone);
  uint64_t offset = 0;
  for (const auto& bucket : buckets) {
    if (bucket.empty()) return absl::InvalidArgumentError("empty bucket");
    offset = AlignUp(offset, kBucketAlignment);
    const uint64_t start = offset;
    for (uint32_t t : bucket) {
      if (t >= tensor_bytes.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("bucket names tensor ", t, " of ", tensor_bytes.size()));
      }
      if (layout.tensor_offsets[t] != kNone) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t, " is in two buckets"));
      }
      offset = AlignUp(offset, kTensorAlignment);
      layout.tensor_offsets[t] = offset;
      if (tensor_bytes[t] > kMaxArenaBytes) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t, " is too large"));
      }
      offset += tensor_bytes[t];
      // Checked per tensor so the sum can never wrap around 64 bits.
      if (offset > kMaxArenaBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("arena would exceed ", kMaxArenaBytes, " bytes at tensor ", t));
      }
    }
    layout.bucket_offsets.push_back(start);
    layout.bucket_bytes.push_back(AlignUp(offset, kTensorAlignment) - start);
  }
  for (size_t t = 0; t < layout.tensor_offsets.size(); ++t) {
    if (layout.tensor_offsets[t] == kNone) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t, " is in no bucket"));
    }
  }
  layout.total_bytes = AlignUp(offset, kBucketAlignment);
  return layout;
}

}  // namespace gradsync::ipc
