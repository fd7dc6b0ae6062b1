// The comparison behind gradsyncd --check-replicas-every: the trainers'
// parameter fingerprints (one 64-bit hash per registered tensor), on one
// node or across the nodes of a job.
//
// Across nodes the daemons compare through the job's backend (the Gloo
// worker), with the float64 count allreduce the scheduler's and
// gs_broadcast's agreements use: a per-node slot that the others leave 0,
// so the sum is an allgather, exact for values below 2^53 (hashes travel
// as two 32-bit limbs). Step 1, every check: each node's iteration, flag
// value, a digest of its reference trainer's hashes and whether its own
// trainers agree; equal everywhere means equal replicas. Only when step 1
// saw a difference: node 0 broadcasts rank 0's hashes, the nodes find the
// first tensor where any trainer differs from them (one value per node),
// then exchange every trainer's hash of that tensor, so that every node
// names the same tensor and the same trainers on each side. Every node
// sees the same sums, so every node issues the same collectives and
// reaches the same verdict.
#ifndef GRADSYNC_DAEMON_ENGINE_REPLICA_EXCHANGE_H_
#define GRADSYNC_DAEMON_ENGINE_REPLICA_EXCHANGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/layout.h"
#include "daemon/backends/backend.h"

namespace gradsync {

// One trainer's fingerprint after an iteration.
struct ReplicaFingerprint {
  int rank = 0;  // global
  int local_rank = 0;
  int node_rank = 0;
  int64_t pid = 0;
  std::vector<uint64_t> hashes;  // one per tensor, in registration order
};

// "rank 2 (local 0, pid 7) on node 1".
std::string ReplicaName(const ReplicaFingerprint& r);

// MISMATCH naming the first tensor (registration order) where some replica
// differs from the lowest rank's, that rank and the lowest rank that
// differs there; OK when every replica is equal. `replicas` is sorted by
// rank, each with layout.size() hashes.
absl::Status CompareReplicas(uint64_t iteration, const Layout& layout,
                             const std::vector<ReplicaFingerprint>& replicas);

// This node's round, compared across the job.
struct NodeRound {
  int node_rank = 0;
  // This node's place among the generation's members (its Gloo rank):
  // node_rank until an elastic job re-formed without some node.
  int node_index = 0;
  int world_size = 1;  // ranks are below it (the first world's size)
  int64_t every = 0;   // --check-replicas-every
  uint64_t iteration = 0;
  std::vector<ReplicaFingerprint> local;  // the node's trainers that sent, by rank
};

// OK when every trainer of every node sent equal hashes for the same
// iteration; MISMATCH naming the first differing tensor, the trainers and
// nodes on each side (or the nodes out of step). A failed collective
// returns its error with *collective set (the job then asks the leader
// which node caused it). Runs between iterations, when the scheduler
// issues nothing on `backend`.
absl::Status CompareAcrossNodes(Backend& backend, const Layout& layout, const NodeRound& round,
                                bool* collective);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_REPLICA_EXCHANGE_H_
