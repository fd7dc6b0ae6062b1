// FailedGrow: what a node does when the grown generation g+1 (nodes joining
// the running job, daemon/engine/job_grow.cc) formed at the rendezvous but
// could not be connected because of a joiner: its daemon died (SIGKILL
// before its Gloo mesh connected), it left the job, or its records
// disagree with the members' (a layout or shared flag of its own). The
// members drop it: one `event=joiner_dropped` line each, g+1 aborted, and
// they re-form among themselves (g+2, the re-formation a death starts:
// resume_generation g+1 at the grow boundary), so the job trains on. The
// joiner leaves the job for good (Depart), so the members count it out at
// once instead of after its silence, and its trainers get the cause's
// code. A failure that is no joiner's fault ends the job as before.
#ifndef GRADSYNC_DAEMON_CLUSTER_FAILED_GROW_H_
#define GRADSYNC_DAEMON_CLUSTER_FAILED_GROW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/cluster/job_rendezvous.h"

namespace gradsync {

// What a formation got as far as, for the judgement of its failure.
struct GrowAttempt {
  uint64_t generation = 0;              // the one the rendezvous formed; 0: the Join failed
  std::vector<RendezvousPeer> joiners;  // its peers that join the running job
  bool joins_running = false;           // this node is one of them
};

// The peers of `joined` that join the running job, and whether `node_rank` does.
GrowAttempt AttemptOf(const JoinResult& joined, int node_rank);

// `error` (the members' agreement failed) marked as the fault of the
// joiners `culprits`: the members agree among themselves.
absl::Status BlameJoiners(absl::Status error, const std::vector<int>& culprits);

struct DroppedJoiner {
  int node_rank = 0;
  std::string host;
  std::string cause;
};

// The joiners a member's failed formation of attempt.generation is the
// fault of: those `error` blames, those whose daemon refuses connections
// (dead), those the rendezvous names departed. Empty: nobody's the members
// can drop, the job ends.
std::vector<DroppedJoiner> CulpritJoiners(JobRendezvous& client, int node_rank,
                                          const GrowAttempt& attempt, const absl::Status& error);

// A member drops `dropped`: logs each, and aborts the generation at the
// rendezvous (the re-formation resumes an aborted one).
void DropJoiners(JobRendezvous& client, int node_rank, uint64_t generation,
                 const std::vector<DroppedJoiner>& dropped);

// The joiner's side: it leaves the job for good with `error` as the reason
// and returns `error` (its code is the cause's, for its trainers).
absl::Status DepartFailedJoiner(JobRendezvous& client, int node_rank, uint64_t generation,
                                const absl::Status& error);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_FAILED_GROW_H_
