// Scheduler: committing an iteration that a node's death split among the
// survivors (docs/DESIGN.md, "Elastic jobs"). A node dying inside an
// iteration's last collective (a ring's final chunk) can let some survivors
// complete iteration I while others still wait in it. I was reduced over
// the old membership, the dead node included, and some trainers already
// hold that result: it is the one consistent outcome. So the survivors,
// right after forming the next generation, compare where they stopped (one
// small exchange on every re-formation); where they are one iteration
// apart, the first survivor that completed I broadcasts I's result
// (KeptResult) over the new generation's backend (CUDA gradients: from its
// device copy over the new NCCL communicators), the ones still in I write
// it into their trainers' arenas or device gradients (an overwrite:
// nothing is summed twice) and complete I with I's divisor, and everyone
// resumes at I+1 over the survivors. A collective of this exchange failing
// (another death) re-forms again from wherever each node is then: a node
// that committed is past I, one that did not is still in it.
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
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/engine/bucket_pieces.h"
#include "daemon/engine/scheduler.h"
#include "daemon/engine/split_iteration.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Test-only (inert unless set): on the node given it, the last bucket of
// that iteration loses its result after the collective, as if the dead
// node had starved this node of the final chunk, and the node waits for
// the file named by the second variable (at most the timeout) before its
// collective fails: a test kills a node meanwhile.
constexpr char kWithholdAt[] = "GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_AT";
constexpr char kWithholdUntil[] = "GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_UNTIL";

}  // namespace

void Scheduler::InitSplitCommit() {
  // Any node of an elastic job across nodes may be the one that completed
  // an iteration the others did not. On the GPU path `arena_` is the flat
  // gradient's plan, and the result is kept on every GPU.
  if (options_.reform && backend_ != nullptr && backend_->num_nodes() > 1) {
    if (!options_.gpu) {
      kept_result_.Resize(arena_.total_bytes);
    } else if (absl::Status st =
                   options_.gpu->KeepResults(arena_.tensor_offsets, arena_.total_bytes);
               st.ok()) {
      kept_result_.KeepOnDevice(arena_.total_bytes);
    } else {
      bad_plan_ = std::string(st.message());  // the job fails before its first bucket
    }
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

bool Scheduler::KeepResult(uint32_t bucket, const KeptResultSink* sink,
                           absl::ReleasableMutexLock* launch_lock) {
  if (withhold_at_plus_one_ != 0 && WithholdNow(bucket)) {
    // Re-forming waits on other nodes: a detaching trainer's WaitIdle need
    // not wait for it (nothing touches trainers' memory meanwhile).
    if (launch_lock != nullptr) launch_lock->Release();
    const absl::Status withheld = AwaitWithheldRelease(bucket);
    if (!withheld.ok()) {
      CollectiveFailed(withheld);
      return false;
    }
  }
  if (sink != nullptr) kept_result_.Kept(iteration(), bucket);
  return true;
}

KeptResultSink* Scheduler::KeptResultSinkFor() {
  // No active arena: this node's trainers all joined and hold no result.
  if (!kept_result_.enabled() || active_arenas_.empty()) return nullptr;
  return kept_result_.sink();
}

bool Scheduler::WithholdNow(uint32_t bucket) {
  const uint64_t it = iteration();
  if (it + 1 != withhold_at_plus_one_ || bucket + 1 != plan_.buckets.size()) return false;
  withhold_at_plus_one_ = 0;  // once: a redo of the iteration runs untouched
  // The trainers' gradients must not hold the result: all-ones bytes are a
  // NaN in every floating-point dtype, so a commit that failed to
  // overwrite them shows.
  if (options_.gpu) {
    const absl::Time deadline = MonotonicNow() + absl::Milliseconds(options_.timeout_ms);
    absl::Status st = options_.gpu->OverwriteWithOnes(plan_.buckets[bucket], spans_[bucket]);
    if (st.ok()) st = options_.gpu->WaitWrites(deadline);
    if (!st.ok()) {
      spdlog::error("event=test_hook_failed hook={} error={}", kWithholdAt, LogValue(st.message()));
    }
  } else {
    for (uint8_t* arena : active_arenas_) {
      for (const ReduceSpan& span : spans_[bucket])
        std::memset(arena + span.offset, 0xFF, span.bytes);
    }
  }
  spdlog::warn("event=test_final_result_withheld iteration={} bucket={} until_file={}", it, bucket,
               LogValue(withhold_until_file_));
  return true;
}

absl::Status Scheduler::AwaitWithheldRelease(uint32_t bucket) {
  const int64_t until = MonotonicNowNs() + options_.timeout_ms * 1000000;
  while (!withhold_until_file_.empty() && access(withhold_until_file_.c_str(), F_OK) != 0 &&
         MonotonicNowNs() < until && !stop_.load(std::memory_order_acquire)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return MakeError(
      v1::PEER_FAILED,
      absl::StrCat("bucket ", bucket, " of iteration ", iteration(),
                   ": its final result withheld on this node by the test hook ", kWithholdAt));
}

absl::Status Scheduler::SettleSplitIteration(bool* collective_failed) {
  *collective_failed = false;
  const int nodes = backend_->num_nodes();
  if (nodes <= 1) return absl::OkStatus();
  const uint64_t it = iteration();
  StoppedAt me;
  me.iteration = it;
  me.holds_previous = it > 0 && kept_result_.Holds(it - 1);
  me.divisor = kept_result_.divisor();
  me.skipped = kept_result_.skipped();
  me.plan_version = plan_version();
  me.kept_bytes = kept_result_.bytes();
  me.node_rank = options_.node_rank;
  if (options_.gpu) me.first_nccl_rank = options_.gpu->first_nccl_rank();
  std::vector<double> slots = StoppedAtSlots(me, options_.node_index, nodes);
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
  ASSIGN_OR_RETURN(const SplitVerdict verdict, JudgeSplit(slots, nodes));
  if (!verdict.split) return absl::OkStatus();
  spdlog::warn(
      "event=split_iteration_commit iteration={} from_node_rank={} completed_by={} behind={} "
      "divisor={} skipped={} bytes={}",
      verdict.iteration, verdict.root_node_rank, LogValue(verdict.completed_by),
      LogValue(verdict.behind), verdict.divisor, verdict.skipped, kept_result_.bytes());
  // A node still in I holds at most I-1's result, which a broadcast cut
  // short would leave half overwritten; the others' get I's bytes again.
  if (it == verdict.iteration) kept_result_.Drop();
  if (options_.gpu) {
    // One ncclBroadcast over the new communicators, from the root's first
    // GPU into every GPU's kept result (the root's other GPUs hold it too).
    RETURN_IF_ERROR(collective("broadcasting the split iteration's result on the GPUs", [&] {
      return options_.gpu->BroadcastKeptResult(verdict.root_nccl_rank);
    }));
  } else {
    for (uint64_t offset = 0; offset < kept_result_.bytes(); offset += kPieceBytes) {
      const uint64_t len = std::min<uint64_t>(kPieceBytes, kept_result_.bytes() - offset);
      RETURN_IF_ERROR(collective("broadcasting the split iteration's result", [&] {
        return backend_->Broadcast(kept_result_.data() + offset, len, verdict.root);
      }));
    }
  }
  if (options_.node_index == verdict.root) return absl::OkStatus();
  kept_result_.Received(verdict.iteration, verdict.divisor, verdict.skipped);
  if (it == verdict.iteration) return CommitReceivedIteration(verdict.divisor, verdict.skipped);
  return absl::OkStatus();
}

absl::Status Scheduler::WriteReceivedResult() {
  // Overwrites whatever the interrupted write-back left (the old average
  // of some buckets, nothing of the last): no sum is redone.
  if (!options_.gpu) {
    for (const std::vector<ReduceSpan>& spans : spans_) {
      for (uint8_t* arena : active_arenas_) kept_result_.WriteBack(arena, spans);
    }
    return absl::OkStatus();
  }
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(options_.timeout_ms);
  absl::Status st;
  for (size_t b = 0; b < spans_.size() && st.ok(); ++b) {
    st = options_.gpu->WriteKeptResult(plan_.buckets[b], spans_[b]);
  }
  if (st.ok()) st = options_.gpu->WaitWrites(deadline);
  if (st.ok()) return st;
  // A sticky CUDA error ends the process (the trainers get the job's error).
  ExitIfDeviceLost(options_.is_context_lost, options_.gpu->last_device_error(),
                   "the split iteration's write-back");
  return MakeError(CodeOf(st), absl::StrCat("iteration ", iteration(),
                                            ": writing the split iteration's result received "
                                            "from another survivor into this node's trainers' "
                                            "gradients failed: ",
                                            st.message()));
}

absl::Status Scheduler::CommitReceivedIteration(int divisor, bool skipped) {
  const uint64_t it = iteration();
  RETURN_IF_ERROR(WriteReceivedResult());
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
  return absl::OkStatus();
}

}  // namespace gradsync
