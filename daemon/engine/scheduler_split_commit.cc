// Scheduler: committing an iteration that a node's death split among the
// survivors (docs/DESIGN.md, "Elastic jobs"). A node dying inside an
// iteration's last collective (a ring's final chunk) can let some survivors
// complete iteration I while others still wait in it. I was reduced over
// the old membership, the dead node included, and some trainers already
// hold that result: it is the one consistent outcome. So the survivors,
// right after forming the next generation, compare where they stopped (one
// small exchange on every re-formation); where they are one iteration
// apart, the first survivor that completed I broadcasts I's result
// (KeptResult) over the new generation's backend, the ones still in I
// write it into their trainers' arenas (an overwrite: nothing is summed
// twice) and complete I with I's divisor, and everyone resumes at I+1 over
// the survivors. A collective of this exchange failing (another death)
// re-forms again from wherever each node is then: a node that committed is
// past I, one that did not is still in it.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/engine/bucket_pieces.h"
#include "daemon/engine/scheduler.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// The exchange after a re-formation: per survivor (its place among the
// members) one slot of each kind, in a float64 sum (exact for these).
enum SplitSlot : int {
  kStoppedIn,      // the iteration it stopped in
  kHoldsPrevious,  // 1: it holds the whole result of the iteration before
  kDivisor,        // that result's divisor
  kSkipped,        // 1: that iteration was skipped (--nonfinite=skip)
  kPlanVersion,    // its plan decisions so far
  kKeptBytes,      // the size of its kept result (the broadcast's)
  kNodeRank,       // for the errors
  kSplitSlots,
};

// Test-only (inert unless set): on the node given it, the last bucket of
// that iteration loses its result after the collective, as if the dead
// node had starved this node of the final chunk, and the node waits for
// the file named by the second variable (at most the timeout) before its
// collective fails: a test kills a node meanwhile.
constexpr char kWithholdAt[] = "GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_AT";
constexpr char kWithholdUntil[] = "GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_UNTIL";

}  // namespace

void Scheduler::InitSplitCommit() {
  // Any node of an elastic CPU job across nodes may be the one that
  // completed an iteration the others did not.
  if (options_.reform && !options_.gpu && backend_ != nullptr && backend_->num_nodes() > 1) {
    kept_result_.Resize(arena_.total_bytes);
  }
  const char* at = std::getenv(kWithholdAt);
  uint64_t iteration = 0;
  if (at == nullptr || *at == '\0' || !absl::SimpleAtoi(at, &iteration)) return;
  withhold_at_plus_one_ = iteration + 1;
  const char* until = std::getenv(kWithholdUntil);
  withhold_until_file_ = until != nullptr ? until : "";
  spdlog::warn("event=test_hook_armed hook={} iteration={} until_file={}", kWithholdAt, iteration,
               LogValue(withhold_until_file_));
}

bool Scheduler::KeepResult(uint32_t bucket) {
  if (withhold_at_plus_one_ != 0) {
    const absl::Status withheld = WithheldForTest(bucket);
    if (!withheld.ok()) {
      CollectiveFailed(withheld);
      return false;
    }
  }
  // No active arena: this node's trainers all joined and hold no result.
  if (kept_result_.enabled() && !active_arenas_.empty()) {
    kept_result_.Keep(iteration(), bucket, active_arenas_[0], spans_[bucket]);
  }
  return true;
}

absl::Status Scheduler::WithheldForTest(uint32_t bucket) {
  const uint64_t it = iteration();
  if (it + 1 != withhold_at_plus_one_ || bucket + 1 != plan_.buckets.size()) {
    return absl::OkStatus();
  }
  withhold_at_plus_one_ = 0;  // once: a redo of the iteration runs untouched
  // The arenas must not hold the result: all-ones bytes are a NaN in every
  // floating-point dtype, so a commit that failed to overwrite them shows.
  for (uint8_t* arena : active_arenas_) {
    for (const ReduceSpan& span : spans_[bucket])
      std::memset(arena + span.offset, 0xFF, span.bytes);
  }
  spdlog::warn("event=test_final_result_withheld iteration={} bucket={} until_file={}", it, bucket,
               LogValue(withhold_until_file_));
  const int64_t until = MonotonicNowNs() + options_.timeout_ms * 1000000;
  while (!withhold_until_file_.empty() && access(withhold_until_file_.c_str(), F_OK) != 0 &&
         MonotonicNowNs() < until && !stop_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return MakeError(
      v1::PEER_FAILED,
      absl::StrCat("bucket ", bucket, " of iteration ", it,
                   ": its final result withheld on this node by the test hook ", kWithholdAt));
}

absl::Status Scheduler::SettleSplitIteration(bool* collective_failed) {
  *collective_failed = false;
  const int nodes = backend_->num_nodes();
  if (nodes <= 1) return absl::OkStatus();
  std::vector<double> slots(static_cast<size_t>(kSplitSlots) * nodes, 0.0);
  const auto slot = [&](int kind, int node) -> double& {
    return slots[static_cast<size_t>(kind) * nodes + node];
  };
  const uint64_t it = iteration();
  const int me = options_.node_index;
  const bool holds = it > 0 && kept_result_.Holds(it - 1);
  slot(kStoppedIn, me) = static_cast<double>(it);
  slot(kHoldsPrevious, me) = holds ? 1 : 0;
  slot(kDivisor, me) = holds ? kept_result_.divisor() : 0;
  slot(kSkipped, me) = holds && kept_result_.skipped() ? 1 : 0;
  slot(kPlanVersion, me) = static_cast<double>(plan_version());
  slot(kKeptBytes, me) = static_cast<double>(kept_result_.bytes());
  slot(kNodeRank, me) = options_.node_rank;
  // The new generation's collectives, bounded like a bucket's (watchdog).
  const auto collective = [&](const char* what, const std::function<absl::Status()>& run) {
    if (!BeginReduction(0, MonotonicNowNs())) {
      EndReduction();
      return MakeError(v1::STATE, "the job stopped");
    }
    const absl::Status st = run();
    const int64_t state = EndReduction();
    if (st.ok() && state != kTimedOut) return absl::OkStatus();
    *collective_failed = state != kStopped;
    return MakeError(
        st.ok() || CodeOf(st) == v1::INTERNAL ? v1::PEER_FAILED : CodeOf(st),
        absl::StrCat("iteration ", it, ": ", what, " after the re-formation: ", backend_->name(),
                     " failed: ", st.ok() ? "past the timeout" : st.message()));
  };
  RETURN_IF_ERROR(collective("comparing where the survivors stopped", [&] {
    return backend_->AllreduceCounts(slots.data(), slots.size());
  }));
  uint64_t lo = UINT64_MAX, hi = 0;
  for (int n = 0; n < nodes; ++n) {
    lo = std::min(lo, static_cast<uint64_t>(slot(kStoppedIn, n)));
    hi = std::max(hi, static_cast<uint64_t>(slot(kStoppedIn, n)));
  }
  if (lo == hi) return absl::OkStatus();  // nobody completed what others did not
  std::vector<std::string> behind, ahead;
  int root = -1;
  for (int n = 0; n < nodes; ++n) {
    const std::string name = absl::StrCat("node_rank=", static_cast<int>(slot(kNodeRank, n)));
    const bool completed = static_cast<uint64_t>(slot(kStoppedIn, n)) == hi;
    (completed ? ahead : behind).push_back(name);
    if (completed && root < 0 && slot(kHoldsPrevious, n) == 1) root = n;
  }
  const std::string split = absl::StrCat(
      "iteration ", lo, " was completed by ", absl::StrJoin(ahead, ", "), " but not by ",
      absl::StrJoin(behind, ", "), " when a node died in its last collective");
  if (hi - lo > 1) {
    return MakeError(v1::PEER_FAILED, absl::StrCat("the survivors stopped in iterations ", lo,
                                                   " and ", hi, ", more than one apart"));
  }
  if (options_.gpu) {
    return MakeError(v1::PEER_FAILED,
                     absl::StrCat(split,
                                  "; committing it from the survivors that completed it "
                                  "is built for CPU gradients only, so the job ends"));
  }
  if (root < 0) {
    return MakeError(v1::PEER_FAILED,
                     absl::StrCat(split,
                                  "; none of them still holds its result (their trainers "
                                  "all joined), so the job ends"));
  }
  for (int n = 0; n < nodes; ++n) {
    if (slot(kKeptBytes, n) != slot(kKeptBytes, root)) {
      return MakeError(
          v1::INTERNAL,
          absl::StrCat(split, "; node_rank=", static_cast<int>(slot(kNodeRank, n)), " keeps ",
                       slot(kKeptBytes, n), " bytes of it, node_rank=",
                       static_cast<int>(slot(kNodeRank, root)), " ", slot(kKeptBytes, root)));
    }
    if (static_cast<uint64_t>(slot(kStoppedIn, n)) == lo &&
        slot(kPlanVersion, n) != slot(kPlanVersion, root)) {
      return MakeError(
          v1::PEER_FAILED,
          absl::StrCat(
              split, "; node_rank=", static_cast<int>(slot(kNodeRank, root)),
              " decided a new plan at the end of it (plan version ", slot(kPlanVersion, root),
              ", node_rank=", static_cast<int>(slot(kNodeRank, n)), " has ", slot(kPlanVersion, n),
              "): committing an iteration across a plan change is not supported, so "
              "the job ends"));
    }
  }
  const int divisor = static_cast<int>(slot(kDivisor, root));
  const bool skipped = slot(kSkipped, root) == 1;
  spdlog::warn(
      "event=split_iteration_commit iteration={} from_node_rank={} completed_by={} behind={} "
      "divisor={} skipped={} bytes={}",
      lo, static_cast<int>(slot(kNodeRank, root)), LogValue(absl::StrJoin(ahead, ",")),
      LogValue(absl::StrJoin(behind, ",")), divisor, skipped, kept_result_.bytes());
  for (uint64_t offset = 0; offset < kept_result_.bytes(); offset += kPieceBytes) {
    const uint64_t len = std::min<uint64_t>(kPieceBytes, kept_result_.bytes() - offset);
    RETURN_IF_ERROR(collective("broadcasting the split iteration's result", [&] {
      return backend_->Broadcast(kept_result_.data() + offset, len, root);
    }));
  }
  if (me == root) return absl::OkStatus();
  kept_result_.Received(lo, divisor, skipped);
  if (it == lo) CommitReceivedIteration(divisor, skipped);
  return absl::OkStatus();
}

void Scheduler::CommitReceivedIteration(int divisor, bool skipped) {
  const uint64_t it = iteration();
  // Overwrites whatever the interrupted write-back left (the old average
  // of some buckets, nothing of the last): no sum is redone.
  for (const std::vector<ReduceSpan>& spans : spans_) {
    for (uint8_t* arena : active_arenas_) kept_result_.WriteBack(arena, spans);
  }
  skip_step_ = skipped;
  skip_culprit_.clear();
  skip_trainer_.clear();
  // The iteration's own divisor, not the survivors' world (Divisor()).
  divide_by_active_ = true;
  active_in_iteration_ = divisor;
  committing_split_ = true;
  FinishIteration();
  committing_split_ = false;
  spdlog::warn("event=split_iteration_committed iteration={} divisor={} skipped={}", it, divisor,
               skipped);
}

}  // namespace gradsync
