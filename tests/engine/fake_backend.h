// FakeBackend: a Backend the test steers, standing in for the other nodes.
//
// kSum: the other nodes answer and each contributes `remote_per_node` to
// every element, so the result is checkable. kFail: every call fails with a
// given status (a real backend stays failed too). kStall: the other nodes
// never answer; a call blocks until Abort, Release, or the backend's own
// timeout (every real backend gets one: Gloo's per-allreduce timeout).
// kHang: the other nodes never answer and the backend ignores its own
// timeout (a backend bug the scheduler must survive): a call returns only
// on Abort; Release does not reach it.
// Every call is recorded, so tests can check order and sizes, and wait for
// a call to arrive without sleeping.
#ifndef GRADSYNC_TESTS_ENGINE_FAKE_BACKEND_H_
#define GRADSYNC_TESTS_ENGINE_FAKE_BACKEND_H_

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/backends/backend.h"
#include "tests/engine/patience.h"

namespace gradsync::testing {

class FakeBackend final : public Backend {
 public:
  enum class Mode { kSum, kFail, kStall, kHang };

  struct Call {
    size_t count;
    DType dtype;
    bool with_counts = false;  // carried AllreduceCountsWithNext's counts
  };

  // `num_nodes` > 1 makes the reducer take the cross-node path (staging,
  // widening halves); 1 is the single-node path, which never calls us.
  explicit FakeBackend(int num_nodes, double remote_per_node = 0)
      : num_nodes_(num_nodes), remote_per_node_(remote_per_node) {}

  std::string name() const override { return "fake"; }
  int num_nodes() const override { return num_nodes_; }

  // The other nodes are copies of this one: they report the same counts.
  // The scheduler's agreement is 4 job-wide counts (summed,
  // Scheduler::kAgreementHeader), then groups of one slot per node where
  // only this node's is filled: a copy fills its own slot with the same
  // value. Not recorded in calls(): those are the
  // buckets' collectives.
  absl::Status AllreduceCounts(double* counts, size_t n) override {
    SumCountsLikeCopies(counts, n);
    return absl::OkStatus();
  }

  // Like the daemon's Gloo worker: the counts ride with the next
  // collective and are summed when it is.
  absl::Status AllreduceCountsWithNext(double* counts, size_t n, size_t, DType,
                                       bool* deferred) override {
    absl::MutexLock lock(&mu_);
    if (pending_counts_ != nullptr) return absl::InternalError("fake: counts deferred twice");
    pending_counts_ = counts;
    pending_counts_n_ = n;
    *deferred = true;
    return absl::OkStatus();
  }

  void SumCountsLikeCopies(double* counts, size_t n) {
    for (size_t i = 0; i < n && i < 4; ++i) counts[i] *= num_nodes_;
    for (size_t group = 4; group + num_nodes_ <= n; group += num_nodes_) {
      double ours = 0;
      for (int k = 0; k < num_nodes_; ++k) ours = std::max(ours, counts[group + k]);
      for (int k = 0; k < num_nodes_; ++k) counts[group + k] = ours;
    }
  }

  absl::Status AllreduceSum(void* data, size_t count, DType dtype) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back({count, dtype, pending_counts_ != nullptr});
    if (pending_counts_ != nullptr) {
      if (count == 0) return absl::InternalError("fake: counts sent with 0 elements");
      // Summed before the elements, as the worker does (a failed call
      // below fails them both).
      SumCountsLikeCopies(pending_counts_, pending_counts_n_);
      pending_counts_ = nullptr;
    }
    if (!aborted_.empty()) return absl::AbortedError(absl::StrCat("fake: aborted: ", aborted_));
    if (mode_ == Mode::kFail) return failure_;
    if (mode_ == Mode::kHang && hang_after_ > 0) {
      --hang_after_;  // this one still answers
    } else if (mode_ == Mode::kHang) {
      ++stalled_;
      auto aborted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !aborted_.empty(); };
      // The backstop only keeps a broken scheduler from hanging the test
      // binary; a passing run is aborted long before.
      const bool woke = mu_.AwaitWithTimeout(absl::Condition(&aborted), kHangBackstop);
      --stalled_;
      if (!woke) {
        GaveUp();
        return absl::InternalError("fake: a hung call was never aborted");
      }
      return absl::AbortedError(absl::StrCat("fake: aborted: ", aborted_));
    }
    if (mode_ == Mode::kStall) {
      ++stalled_;
      const absl::Time deadline = absl::Now() + stall_timeout_;
      auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return mode_ != Mode::kStall || !aborted_.empty();
      };
      const bool woke = mu_.AwaitWithDeadline(absl::Condition(&answered), deadline);
      --stalled_;
      if (!aborted_.empty()) return absl::AbortedError(absl::StrCat("fake: aborted: ", aborted_));
      if (!woke) {
        return absl::DeadlineExceededError(absl::StrCat(
            "fake: the other nodes did not answer within ", absl::FormatDuration(stall_timeout_)));
      }
      if (mode_ == Mode::kFail) return failure_;
    }
    const double remote = remote_per_node_ * (num_nodes_ - 1);
    switch (dtype) {
      case DType::kFloat32:
        for (size_t i = 0; i < count; ++i) static_cast<float*>(data)[i] += float(remote);
        return absl::OkStatus();
      case DType::kFloat64:
        for (size_t i = 0; i < count; ++i) static_cast<double*>(data)[i] += remote;
        return absl::OkStatus();
      default:
        // The reducer must widen halves before the collective.
        return absl::InternalError(absl::StrCat("fake: asked to reduce ", DTypeName(dtype)));
    }
  }

  void Abort(const std::string& reason) override {
    absl::MutexLock lock(&mu_);
    if (aborted_.empty()) aborted_ = reason.empty() ? "(no reason)" : reason;
  }

  // Steering, from the test thread.
  void FailWith(absl::Status status) {
    absl::MutexLock lock(&mu_);
    failure_ = std::move(status);
    mode_ = Mode::kFail;
  }
  void Stall(absl::Duration own_timeout) {
    absl::MutexLock lock(&mu_);
    stall_timeout_ = own_timeout;
    mode_ = Mode::kStall;
  }
  // After `after` more calls that sum, calls hang until Abort.
  void Hang(int after = 0) {
    absl::MutexLock lock(&mu_);
    hang_after_ = after;
    mode_ = Mode::kHang;
  }
  // Lets stalled (not hung) and later calls sum normally.
  void Release() {
    absl::MutexLock lock(&mu_);
    mode_ = Mode::kSum;
  }

  // True once `n` calls are blocked in a stall (false if `timeout` passes).
  bool WaitUntilStalled(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stalled_ >= n; };
    if (mu_.AwaitWithTimeout(absl::Condition(&reached), Patience(timeout))) return true;
    GaveUp();
    return false;
  }
  // True once `n` calls have arrived (false if `timeout` passes).
  bool WaitForCalls(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.size() >= n; };
    if (mu_.AwaitWithTimeout(absl::Condition(&reached), Patience(timeout))) return true;
    GaveUp();
    return false;
  }

  std::vector<Call> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::string abort_reason() const {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }

 private:
  static constexpr absl::Duration kHangBackstop = absl::Seconds(20);

  const int num_nodes_;
  const double remote_per_node_;
  mutable absl::Mutex mu_;
  Mode mode_ ABSL_GUARDED_BY(mu_) = Mode::kSum;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  absl::Duration stall_timeout_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
  int stalled_ ABSL_GUARDED_BY(mu_) = 0;
  int hang_after_ ABSL_GUARDED_BY(mu_) = 0;
  std::string aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  double* pending_counts_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t pending_counts_n_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_ENGINE_FAKE_BACKEND_H_
