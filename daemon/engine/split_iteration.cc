#include "daemon/engine/split_iteration.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_code.h"

namespace gradsync {
namespace {

enum Slot : int {
  kStoppedIn,
  kHoldsPrevious,
  kDivisor,
  kSkipped,
  kPlanVersion,
  kKeptBytes,
  kNodeRank,
  kFirstNcclRank,
  kSlotKinds,
};

class Slots {
 public:
  Slots(const std::vector<double>& summed, int nodes) : summed_(summed), nodes_(nodes) {}
  double at(Slot kind, int place) const {
    return summed_[static_cast<size_t>(kind) * nodes_ + place];
  }
  uint64_t iteration(int place) const { return static_cast<uint64_t>(at(kStoppedIn, place)); }
  std::string name(int place) const {
    return absl::StrCat("node_rank=", static_cast<int>(at(kNodeRank, place)));
  }

 private:
  const std::vector<double>& summed_;
  int nodes_;
};

}  // namespace

std::vector<double> StoppedAtSlots(const StoppedAt& me, int place, int nodes) {
  std::vector<double> slots(static_cast<size_t>(kSlotKinds) * nodes, 0.0);
  const auto at = [&](Slot kind) -> double& {
    return slots[static_cast<size_t>(kind) * nodes + place];
  };
  at(kStoppedIn) = static_cast<double>(me.iteration);
  at(kHoldsPrevious) = me.holds_previous ? 1 : 0;
  at(kDivisor) = me.holds_previous ? me.divisor : 0;
  at(kSkipped) = me.holds_previous && me.skipped ? 1 : 0;
  at(kPlanVersion) = static_cast<double>(me.plan_version);
  at(kKeptBytes) = static_cast<double>(me.kept_bytes);
  at(kNodeRank) = me.node_rank;
  at(kFirstNcclRank) = me.first_nccl_rank;
  return slots;
}

absl::StatusOr<SplitVerdict> JudgeSplit(const std::vector<double>& summed, int nodes) {
  const Slots slots(summed, nodes);
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int n = 0; n < nodes; ++n) {
    lo = std::min(lo, slots.iteration(n));
    hi = std::max(hi, slots.iteration(n));
  }
  SplitVerdict verdict;
  if (lo == hi) return verdict;  // nobody completed what the others did not
  std::vector<std::string> ahead, behind;
  for (int n = 0; n < nodes; ++n) {
    const bool completed = slots.iteration(n) == hi;
    (completed ? ahead : behind).push_back(slots.name(n));
    if (completed && verdict.root < 0 && slots.at(kHoldsPrevious, n) == 1) verdict.root = n;
  }
  if (hi - lo > 1) {
    return MakeError(v1::PEER_FAILED,
                     absl::StrCat("the survivors stopped in iterations ", lo, " (",
                                  absl::StrJoin(behind, ", "), ") and up to ", hi, " (",
                                  absl::StrJoin(ahead, ", "), "), more than one apart"));
  }
  const std::string split = absl::StrCat(
      "iteration ", lo, " was completed by ", absl::StrJoin(ahead, ", "), " but not by ",
      absl::StrJoin(behind, ", "), " when a node died in its last collective");
  if (verdict.root < 0) {
    return MakeError(v1::PEER_FAILED, absl::StrCat(split,
                                                   "; none of them still holds its result (their "
                                                   "trainers all joined), so the job ends"));
  }
  const int root = verdict.root;
  for (int n = 0; n < nodes; ++n) {
    if (slots.at(kKeptBytes, n) != slots.at(kKeptBytes, root)) {
      return MakeError(
          v1::INTERNAL,
          absl::StrCat(split, "; ", slots.name(n), " keeps ", slots.at(kKeptBytes, n),
                       " bytes of it, ", slots.name(root), " ", slots.at(kKeptBytes, root)));
    }
    if (slots.iteration(n) == lo && slots.at(kPlanVersion, n) != slots.at(kPlanVersion, root)) {
      return MakeError(
          v1::PEER_FAILED,
          absl::StrCat(
              split, "; ", slots.name(root), " decided a new plan at its end (plan version ",
              slots.at(kPlanVersion, root), ", ", slots.name(n), " has ", slots.at(kPlanVersion, n),
              "): committing an iteration across a plan change is not supported, so "
              "the job ends"));
    }
  }
  verdict.split = true;
  verdict.iteration = lo;
  verdict.root_node_rank = static_cast<int>(slots.at(kNodeRank, root));
  verdict.root_nccl_rank = static_cast<int>(slots.at(kFirstNcclRank, root));
  verdict.divisor = static_cast<int>(slots.at(kDivisor, root));
  verdict.skipped = slots.at(kSkipped, root) == 1;
  verdict.completed_by = absl::StrJoin(ahead, ",");
  verdict.behind = absl::StrJoin(behind, ",");
  return verdict;
}

}  // namespace gradsync
