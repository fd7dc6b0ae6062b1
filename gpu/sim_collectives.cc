#include "gpu/sim_collectives.h"

namespace gradsync::gpu::sim {

absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateSimCollectives(
    const CollectiveOptions& options, const std::vector<int>& device_indices,
    const std::string& prefix) {
  return absl::UnimplementedError("simulated collectives: not yet");
}

}  // namespace gradsync::gpu::sim
