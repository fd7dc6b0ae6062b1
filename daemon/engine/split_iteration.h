// The exchange that settles an iteration a node's death split among an
// elastic job's survivors (docs/DESIGN.md, "Elastic jobs"): right after a
// re-formation every survivor says where it stopped, in one float64 sum
// (exact for these values), and all judge the same sum alike.
#ifndef GRADSYNC_DAEMON_ENGINE_SPLIT_ITERATION_H_
#define GRADSYNC_DAEMON_ENGINE_SPLIT_ITERATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync {

// One survivor's part.
struct StoppedAt {
  uint64_t iteration = 0;       // the iteration it stopped in
  bool holds_previous = false;  // it holds the whole result of the one before
  int divisor = 0;              // that result's divisor
  bool skipped = false;         // that iteration was skipped (--nonfinite=skip)
  uint64_t plan_version = 0;    // its plan decisions so far
  uint64_t kept_bytes = 0;      // its kept result's size (the broadcast's)
  int node_rank = 0;            // for the errors
  int first_nccl_rank = 0;      // GPU path: the NCCL rank of its first GPU
};

// The slots of `nodes` survivors, zero but for `me`'s at place `place`.
std::vector<double> StoppedAtSlots(const StoppedAt& me, int place, int nodes);

struct SplitVerdict {
  bool split = false;      // false: every survivor stopped in the same iteration
  uint64_t iteration = 0;  // the split one, I: some completed it, the others did not
  int root = -1;           // the place of the survivor that hands I's result over
  int root_node_rank = -1;
  int root_nccl_rank = 0;  // GPU path: the root's first GPU, the broadcast's root
  int divisor = 0;         // I's, as the ones that completed it used
  bool skipped = false;
  std::string completed_by;  // "node_rank=0,node_rank=2"
  std::string behind;
};

// The summed slots judged: no split, a split to commit, or why it cannot
// be (PEER_FAILED naming the survivors).
absl::StatusOr<SplitVerdict> JudgeSplit(const std::vector<double>& summed, int nodes);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_SPLIT_ITERATION_H_
