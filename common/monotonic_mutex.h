// MonotonicMutex: a mutex whose timed waits run on the monotonic clock.
//
// Why not absl::Mutex: the absl this project builds against (Debian's
// 20220623) turns every timed wait (AwaitWithTimeout, CondVar::
// WaitWithTimeout, ...) into an absolute CLOCK_REALTIME futex deadline,
// now() + timeout. A backward step of the wall clock (NTP, an operator)
// stretches every wait in progress by the step, and under a faked wall
// clock (libfaketime) every wait is off by the offset: a heartbeat loop
// waiting 500 ms slept 30 s and the leader declared its node dead. Slicing
// the wait does not help: each slice is stretched. Here a timed wait is a
// std::condition_variable::wait_until on std::chrono::steady_clock, which
// libstdc++ (glibc >= 2.30) hands to pthread_cond_clockwait(CLOCK_MONOTONIC).
//
// Contract (the subset of absl::Mutex the daemon and the client use, with
// the same meaning, so a class switches by changing its mutex's type):
// - Lock/Unlock, exclusive only; AssertHeld/AssertReaderHeld are
//   annotations for clang's thread-safety analysis and check nothing.
// - Await(cond) blocks until cond holds; AwaitWithTimeout(cond, timeout)
//   also returns after `timeout` has passed on the monotonic clock, and
//   returns cond's value then. As with absl, the caller never signals:
//   every release of the lock (Unlock, or a wait that releases it)
//   evaluates the conditions of the threads waiting, under the lock, and
//   wakes those whose condition became true. A condition must therefore
//   depend only on state guarded by the mutex (or be re-evaluated by a
//   release of it, e.g. an atomic set before locking it), and be cheap.
// - MonotonicCondVar is absl::CondVar on this mutex: Signal/SignalAll
//   wake waiters, WaitWithTimeout returns true when the timeout passed.
// - Timeouts <= 0 do not wait; absl::InfiniteDuration() waits forever.
//
// Not for hot paths that lock millions of times a second: an unlock with
// waiters evaluates each waiter's condition, as absl does.
#ifndef GRADSYNC_COMMON_MONOTONIC_MUTEX_H_
#define GRADSYNC_COMMON_MONOTONIC_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

class ABSL_LOCKABLE MonotonicMutex {
 public:
  MonotonicMutex() = default;
  MonotonicMutex(const MonotonicMutex&) = delete;
  MonotonicMutex& operator=(const MonotonicMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Wakes the waiters whose condition now holds, then releases the lock.
  void Unlock() ABSL_UNLOCK_FUNCTION();

  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

  // Releases the lock until `cond` holds; holds it again on return.
  void Await(const absl::Condition& cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);
  // As Await, for at most `timeout` of monotonic time: returns whether
  // `cond` holds (evaluated under the lock on return).
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);

 private:
  friend class MonotonicCondVar;
  struct Waiter;

  // Wakes every waiter but `self` whose condition holds. Called with mu_
  // held, right before it is released.
  void WakeReadyLocked(const Waiter* self);
  bool AwaitUntil(const absl::Condition& cond, bool timed,
                  std::chrono::steady_clock::time_point deadline);

  std::mutex mu_;
  Waiter* waiters_ = nullptr;  // Await callers, each on its own stack; under mu_
};

class ABSL_SCOPED_LOCKABLE MonotonicMutexLock {
 public:
  explicit MonotonicMutexLock(MonotonicMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MonotonicMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MonotonicMutexLock(const MonotonicMutexLock&) = delete;
  MonotonicMutexLock& operator=(const MonotonicMutexLock&) = delete;

 private:
  MonotonicMutex* const mu_;
};

// absl::CondVar for MonotonicMutex: woken by Signal/SignalAll (or
// spuriously: callers re-check their state in a loop).
class MonotonicCondVar {
 public:
  void Wait(MonotonicMutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // True when `timeout` (monotonic) passed without a wake-up.
  bool WaitWithTimeout(MonotonicMutex* mu, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_MONOTONIC_MUTEX_H_
