// Simulated collectives: CollectiveGroup over simulated GPUs.
//
// One process (one daemon) owns the ranks of its local GPUs and sums their
// buffers itself. Ranks in other processes (other simulated nodes) meet in
// a shared-memory rendezvous: the node holding rank 0 creates a group
// segment and publishes its name through CollectiveOptions.publish (key
// "sim_collective/<generation>"); the others fetch it. Per collective,
// every node writes its ranks' inputs into a segment of its own, marks its
// ranks arrived, waits for all, sums every rank's input in rank order (so
// every rank gets bit-identical results), marks its ranks done and waits
// for all again before removing its segment. Waits end at the deadline
// (DEADLINE_EXCEEDED naming the missing ranks), on a dead or failed peer
// (UNAVAILABLE) or on Abort (ABORTED). Simple and correct, not fast.
#ifndef GRADSYNC_GPU_SIM_SIM_COLLECTIVES_H_
#define GRADSYNC_GPU_SIM_SIM_COLLECTIVES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace gradsync::gpu::sim {

// `device_indices`: the sim GPU index of each of options.devices; `host`:
// this node's host as NCCL would see it (two ranks on one GPU of one host
// are refused, as NCCL refuses them). Runs the one-element warm-up
// collective before returning. `allreduce_ignores_timeout`: AllreduceSum
// waits until its peers arrive, one fails or the group is aborted, never
// past options.timeout alone (SimOptions::stall_at "collective").
absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateSimCollectives(
    const CollectiveOptions& options, const std::vector<int>& device_indices,
    const std::string& prefix, const std::string& host, bool allreduce_ignores_timeout = false);

}  // namespace gradsync::gpu::sim

#endif  // GRADSYNC_GPU_SIM_SIM_COLLECTIVES_H_
