#include "daemon/engine/replica_checker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// How often a waiting call looks at its deadline.
constexpr absl::Duration kPoll = absl::Milliseconds(100);

}  // namespace

ReplicaChecker::ReplicaChecker(std::vector<Trainer*> trainers, const Layout& layout,
                               Backend* backend, FailFn fail, Options options)
    : trainers_(std::move(trainers)),
      layout_(layout),
      fail_(std::move(fail)),
      options_(options),
      backend_(backend),
      node_index_(options.node_rank) {
  hashes_.assign(trainers_.size(), {});
  arrived_.assign(trainers_.size(), 0);
}

absl::Status ReplicaChecker::FailJob(const absl::Status& error, int culprit) {
  spdlog::error("event=replica_check_failed code={} error={}", v1::Code_Name(CodeOf(error)),
                LogValue(error.message()));
  fail_(error, culprit);
  return error;
}

void ReplicaChecker::Abort(const absl::Status& error) {
  MonotonicMutexLock lock(&mu_);
  if (failed_.ok()) failed_ = error.ok() ? MakeError(v1::INTERNAL, "the job ended") : error;
  cv_.SignalAll();
}

void ReplicaChecker::ReplaceTrainer(Trainer* fresh) {
  MonotonicMutexLock lock(&mu_);
  const size_t local = static_cast<size_t>(fresh->local_rank);
  if (local < trainers_.size()) trainers_[local] = fresh;
}

void ReplicaChecker::SetWorld(Backend* backend, int node_index) {
  MonotonicMutexLock lock(&mu_);
  backend_ = backend;
  node_index_ = node_index;
}

absl::Status ReplicaChecker::Refusal(const Trainer& caller, uint64_t iteration,
                                     size_t hashes) const {
  if (options_.every <= 0) {
    return MakeError(v1::STATE, absl::StrCat(caller.Name(),
                                             " called gs_check_replicas, but gradsyncd runs "
                                             "without --check-replicas-every"));
  }
  if (AcrossNodes() && options_.uneven_inputs) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(),
                                  " called gs_check_replicas in a multi-node job with "
                                  "--uneven-inputs: not supported (a node whose trainers all "
                                  "joined would never compare); one node is"));
  }
  if (iteration == 0 || iteration % static_cast<uint64_t>(options_.every) != 0) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(), " called gs_check_replicas after iteration ",
                                  iteration, ", where no check is due (every ", options_.every,
                                  " iterations: see gs_job_info.check_replicas_due)"));
  }
  if (hashes != layout_.size()) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(), " passed ", hashes,
                                  " hashes to gs_check_replicas; its layout has ", layout_.size(),
                                  " tensors (one hash each, in registration order)"));
  }
  return absl::OkStatus();
}

std::vector<ReplicaFingerprint> ReplicaChecker::RoundLocked() const {
  std::vector<ReplicaFingerprint> round;
  for (size_t i = 0; i < trainers_.size(); ++i) {
    if (!arrived_[i]) continue;
    const Trainer& t = *trainers_[i];
    round.push_back({t.rank, t.local_rank, options_.node_rank, t.pid, hashes_[i]});
  }
  std::sort(
      round.begin(), round.end(),
      [](const ReplicaFingerprint& a, const ReplicaFingerprint& b) { return a.rank < b.rank; });
  return round;
}

absl::Status ReplicaChecker::CompareRound(int* culprit) {
  // Until the round ends, waiters keep waiting without a deadline: a
  // difference ends nothing, it fails the job (whose Abort wakes them)
  // before any waiting trainer hears of it, since one told first could
  // close, and its departure would fail the job in its own name instead of
  // the mismatch's; nor may one time out meanwhile.
  comparing_ = true;
  absl::Status verdict;
  if (!AcrossNodes()) {
    verdict = CompareReplicas(iteration_, layout_, RoundLocked());
  } else {
    NodeRound round{options_.node_rank, node_index_, options_.world_size,
                    options_.every,     iteration_,  RoundLocked()};
    Backend* backend = backend_;
    mu_.Unlock();
    bool collective = false;
    verdict = CompareAcrossNodes(*backend, layout_, round, &collective);
    mu_.Lock();
    // A collective's failure: the job asks the leader which node caused it.
    if (collective) *culprit = Scheduler::kCollectiveFailed;
    if (verdict.ok() && !failed_.ok()) return failed_;
  }
  if (!verdict.ok()) return verdict;
  comparing_ = false;
  spdlog::info("event=replicas_equal iteration={} trainers={} tensors={} nodes={}", iteration_,
               count_, layout_.size(), backend_ != nullptr ? backend_->num_nodes() : 1);
  std::fill(arrived_.begin(), arrived_.end(), 0);
  count_ = 0;
  last_result_ = absl::OkStatus();
  ++rounds_done_;
  cv_.SignalAll();
  return absl::OkStatus();
}

absl::Status ReplicaChecker::AwaitGrownWorldLocked(absl::Time deadline) {
  if (scheduler_ == nullptr || !scheduler_->growing()) return absl::OkStatus();
  comparing_ = true;  // the waiters' deadlines are this one's
  while (scheduler_->growing() && failed_.ok() && MonotonicNow() < deadline) {
    cv_.WaitWithTimeout(&mu_, kPoll);
  }
  comparing_ = false;
  if (!failed_.ok()) return failed_;
  if (!scheduler_->growing()) return absl::OkStatus();
  return MakeError(v1::TIMEOUT,
                   absl::StrCat("gs_check_replicas after iteration ", iteration_,
                                ": nodes join the running job at this iteration boundary, and the "
                                "grown world the check runs on was not formed within the timeout"));
}

absl::Status ReplicaChecker::WaitLocked(const Trainer& caller, uint64_t round,
                                        absl::Time deadline) {
  while (rounds_done_ == round && failed_.ok()) {
    const absl::Time now = MonotonicNow();
    if (!comparing_ && now >= deadline) {
      std::string missing;
      for (size_t i = 0; i < trainers_.size(); ++i) {
        if (arrived_[i] || trainers_[i]->joined.load(std::memory_order_relaxed)) continue;
        absl::StrAppend(&missing, missing.empty() ? "" : ", ", trainers_[i]->Name());
      }
      return MakeError(
          v1::TIMEOUT,
          absl::StrCat(missing, " did not call gs_check_replicas after iteration ", iteration_,
                       " within the timeout; ", caller.Name(), " waited for it"));
    }
    cv_.WaitWithTimeout(
        &mu_, comparing_ ? kPoll : std::clamp(deadline - now, absl::Milliseconds(1), kPoll));
  }
  return absl::OkStatus();
}

absl::Status ReplicaChecker::Check(const Trainer& caller, uint64_t iteration,
                                   const std::vector<uint64_t>& hashes, absl::Time deadline) {
  const size_t me = static_cast<size_t>(caller.local_rank);
  absl::Status refused;
  int culprit = -1;
  {
    MonotonicMutexLock lock(&mu_);
    RETURN_IF_ERROR(Refusal(caller, iteration, hashes.size()));
    if (!failed_.ok()) return failed_;
    if (arrived_[me]) {
      return MakeError(v1::STATE,
                       absl::StrCat(caller.Name(), " called gs_check_replicas twice for iteration ",
                                    iteration_));
    }
    if (count_ > 0 && iteration != iteration_) {
      const Trainer* other = nullptr;
      for (size_t i = 0; i < trainers_.size() && other == nullptr; ++i) {
        if (arrived_[i]) other = trainers_[i];
      }
      refused = MakeError(v1::MISMATCH,
                          absl::StrCat("trainers out of step in gs_check_replicas: ", caller.Name(),
                                       " checks after iteration ", iteration, " but ",
                                       other ? other->Name() : std::string("another trainer"),
                                       " after iteration ", iteration_));
    } else {
      iteration_ = iteration;
      hashes_[me] = hashes;
      arrived_[me] = 1;
      ++count_;
      const uint64_t round = rounds_done_;
      int expected = 0;
      for (const Trainer* t : trainers_) expected += !t->joined.load(std::memory_order_relaxed);
      if (count_ >= expected) {
        refused = AwaitGrownWorldLocked(deadline);
        if (refused.ok()) refused = CompareRound(&culprit);
        if (refused.ok()) return refused;
        if (!failed_.ok()) return failed_;
      } else {
        refused = WaitLocked(caller, round, deadline);
        // A round that completed is this caller's answer even when the job
        // failed since: a peer that closes right after its check ends the
        // job before a waiter woken by the round's end has returned.
        if (refused.ok()) return rounds_done_ > round ? last_result_ : failed_;
      }
    }
  }
  return FailJob(refused, culprit);
}

}  // namespace gradsync
