#include "common/monotonic_mutex.h"

#include <algorithm>

namespace gradsync {
namespace {

using Clock = std::chrono::steady_clock;

// A timeout as a point on the steady clock, capped so that now() + timeout
// cannot overflow.
Clock::time_point DeadlineIn(absl::Duration timeout) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(
                            std::min(timeout, absl::Hours(24 * 365 * 100))));
}

}  // namespace

struct MonotonicMutex::Waiter {
  explicit Waiter(const absl::Condition* c) : cond(c) {}
  const absl::Condition* const cond;
  std::condition_variable cv;
  bool notified = false;  // woken and not yet running: skip re-evaluating
  Waiter* next = nullptr;
};

void MonotonicMutex::WakeReadyLocked(const Waiter* self) {
  for (Waiter* w = waiters_; w != nullptr; w = w->next) {
    if (w == self || w->notified || !w->cond->Eval()) continue;
    w->notified = true;
    // Under the lock: once it is released the waiter may time out, return
    // and take its condition variable with it.
    w->cv.notify_one();
  }
}

void MonotonicMutex::Unlock() {
  if (waiters_ != nullptr) WakeReadyLocked(nullptr);
  mu_.unlock();
}

void MonotonicMutex::Await(const absl::Condition& cond) {
  AwaitUntil(cond, /*timed=*/false, Clock::time_point());
}

bool MonotonicMutex::AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    AwaitUntil(cond, /*timed=*/false, Clock::time_point());
    return true;
  }
  if (timeout <= absl::ZeroDuration()) return cond.Eval();
  return AwaitUntil(cond, /*timed=*/true, DeadlineIn(timeout));
}

bool MonotonicMutex::AwaitUntil(const absl::Condition& cond, bool timed,
                                Clock::time_point deadline) {
  if (cond.Eval()) return true;
  Waiter self(&cond);
  self.next = waiters_;
  waiters_ = &self;
  // What this thread changed before waiting may be what another waits for:
  // releasing the lock here is a release like Unlock.
  WakeReadyLocked(&self);
  std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
  bool holds = false;
  while (true) {
    self.notified = false;
    if (!timed) {
      self.cv.wait(lock);
    } else if (self.cv.wait_until(lock, deadline) == std::cv_status::timeout) {
      holds = cond.Eval();
      break;
    }
    // Woken because the condition held at some release, or spuriously:
    // it may have changed again since.
    if (cond.Eval()) {
      holds = true;
      break;
    }
  }
  for (Waiter** w = &waiters_; *w != nullptr; w = &(*w)->next) {
    if (*w == &self) {
      *w = self.next;
      break;
    }
  }
  lock.release();  // still held, by the caller's scope
  return holds;
}

void MonotonicCondVar::Wait(MonotonicMutex* mu) {
  mu->WakeReadyLocked(nullptr);
  std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
  cv_.wait(lock);
  lock.release();
}

bool MonotonicCondVar::WaitWithTimeout(MonotonicMutex* mu, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) {
    Wait(mu);
    return false;
  }
  if (timeout <= absl::ZeroDuration()) return true;
  const Clock::time_point deadline = DeadlineIn(timeout);
  mu->WakeReadyLocked(nullptr);
  std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
  const bool timed_out = cv_.wait_until(lock, deadline) == std::cv_status::timeout;
  lock.release();
  return timed_out;
}

}  // namespace gradsync
