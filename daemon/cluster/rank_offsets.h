// The global ranks of a generation's trainers, alike on the embedded leader
// and on etcd (docs/DESIGN.md, "Joining a running job"). A node's trainers
// hold ranks [rank_offset, rank_offset + local_size). Trainers keep their
// ranks across re-formations, so a generation that lost a node has a gap
// where its ranks were; a node joining later must not take ranks a member
// still holds, and every node must compute the same answer.
//
// The rule: a member of the previous generation that goes on in this one
// keeps its offset; every other node (a fresh job's, a joiner), in node-rank
// order, takes the lowest range of its local size that no node holds. A
// fresh job's nodes therefore get the usual prefix sums, and a replacement
// for the one dead node gets that node's ranks back.
#ifndef GRADSYNC_DAEMON_CLUSTER_RANK_OFFSETS_H_
#define GRADSYNC_DAEMON_CLUSTER_RANK_OFFSETS_H_

#include <vector>

namespace gradsync {

struct RankClaim {
  int node_rank = 0;
  int local_size = 0;
  // >= 0: the offset this node held in the previous generation, which it
  // keeps; -1: it takes the lowest free range.
  int kept_offset = -1;
};

// Each claim's rank offset, in the order of `claims`. Ranges never overlap:
// a kept range that would (it cannot when the previous generation's did
// not) is reassigned like a newcomer's.
std::vector<int> AssignRankOffsets(const std::vector<RankClaim>& claims);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_RANK_OFFSETS_H_
