#include "daemon/engine/replica_checker.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// How often a waiting call looks at its deadline.
constexpr absl::Duration kPoll = absl::Milliseconds(100);

std::string Hex(uint64_t v) { return absl::StrFormat("0x%016x", v); }

}  // namespace

ReplicaChecker::ReplicaChecker(std::vector<Trainer*> trainers, const Layout& layout, FailFn fail,
                               Options options)
    : trainers_(std::move(trainers)), layout_(layout), fail_(std::move(fail)), options_(options) {
  hashes_.assign(trainers_.size(), {});
  arrived_.assign(trainers_.size(), 0);
}

std::string ReplicaChecker::Where(const Trainer& t) const {
  return absl::StrCat(t.Name(), " on node ", options_.node_rank);
}

absl::Status ReplicaChecker::FailJob(const absl::Status& error) {
  spdlog::error("event=replica_check_failed code={} error={}", v1::Code_Name(CodeOf(error)),
                LogValue(error.message()));
  fail_(error, -1);
  return error;
}

void ReplicaChecker::Abort(const absl::Status& error) {
  MonotonicMutexLock lock(&mu_);
  if (failed_.ok()) failed_ = error.ok() ? MakeError(v1::INTERNAL, "the job ended") : error;
  cv_.SignalAll();
}

absl::Status ReplicaChecker::CompareLocked() const {
  int reference = -1;
  for (size_t i = 0; i < trainers_.size(); ++i) {
    if (arrived_[i]) {
      reference = static_cast<int>(i);
      break;
    }
  }
  if (reference < 0) return absl::OkStatus();
  const std::vector<uint64_t>& ref = hashes_[reference];
  for (size_t tensor = 0; tensor < layout_.size(); ++tensor) {
    for (size_t i = 0; i < trainers_.size(); ++i) {
      if (!arrived_[i] || hashes_[i][tensor] == ref[tensor]) continue;
      return MakeError(
          v1::MISMATCH,
          absl::StrCat("replicas differ after iteration ", iteration_, ": tensor '",
                       layout_[tensor].name, "' (index ", tensor, ") has fingerprint ",
                       Hex(ref[tensor]), " on ", Where(*trainers_[reference]), " but ",
                       Hex(hashes_[i][tensor]), " on ", Where(*trainers_[i]),
                       "; the parameters of data-parallel replicas must stay equal (a "
                       "nondeterministic kernel, a skipped or extra step, or corrupted memory)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReplicaChecker::Check(const Trainer& caller, uint64_t iteration,
                                   const std::vector<uint64_t>& hashes, absl::Time deadline) {
  if (options_.every <= 0) {
    return MakeError(v1::STATE, absl::StrCat(caller.Name(),
                                             " called gs_check_replicas, but gradsyncd runs "
                                             "without --check-replicas-every"));
  }
  if (iteration == 0 || iteration % static_cast<uint64_t>(options_.every) != 0) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(), " called gs_check_replicas after iteration ",
                                  iteration, ", where no check is due (every ", options_.every,
                                  " iterations: see gs_job_info.check_replicas_due)"));
  }
  if (hashes.size() != layout_.size()) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(), " passed ", hashes.size(),
                                  " hashes to gs_check_replicas; its layout has ", layout_.size(),
                                  " tensors (one hash each, in registration order)"));
  }
  const size_t me = static_cast<size_t>(caller.local_rank);
  absl::Status refused;
  {
    MonotonicMutexLock lock(&mu_);
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
      const uint64_t mine = rounds_done_;
      int expected = 0;
      for (const Trainer* t : trainers_) expected += !t->joined.load(std::memory_order_relaxed);
      if (count_ >= expected) {
        refused = CompareLocked();
        if (refused.ok()) {
          spdlog::info("event=replicas_equal iteration={} trainers={} tensors={}", iteration_,
                       count_, layout_.size());
          std::fill(arrived_.begin(), arrived_.end(), 0);
          count_ = 0;
          last_result_ = refused;
          ++rounds_done_;
          cv_.SignalAll();
          return absl::OkStatus();
        }
        // A difference fails the job before any waiting trainer hears of
        // it (the job's failure reaches them through Abort): one told
        // first could close, and its departure would fail the job in its
        // own name instead of the mismatch's.
      } else {
        while (rounds_done_ == mine && failed_.ok()) {
          const absl::Time now = MonotonicNow();
          if (now >= deadline) {
            std::string missing;
            for (size_t i = 0; i < trainers_.size(); ++i) {
              if (arrived_[i] || trainers_[i]->joined.load(std::memory_order_relaxed)) continue;
              absl::StrAppend(&missing, missing.empty() ? "" : ", ", trainers_[i]->Name());
            }
            refused = MakeError(
                v1::TIMEOUT,
                absl::StrCat(missing, " did not call gs_check_replicas after iteration ",
                             iteration_, " within the timeout; ", caller.Name(), " waited for it"));
            break;
          }
          cv_.WaitWithTimeout(&mu_, std::clamp(deadline - now, absl::Milliseconds(1), kPoll));
        }
        if (refused.ok()) return failed_.ok() ? last_result_ : failed_;
      }
    }
  }
  return FailJob(refused);
}

}  // namespace gradsync
