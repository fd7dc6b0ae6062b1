// MonotonicMutex: absl::Mutex's Await semantics (no signalling: a release
// of the lock wakes the waiters whose condition holds), and timed waits
// that keep their length when the wall clock is offset (libfaketime).
#include "common/monotonic_mutex.h"

#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync {
namespace {

using Clock = std::chrono::steady_clock;

// Long enough never to expire in a passing run: these tests wait on state.
constexpr absl::Duration kLong = absl::Seconds(60);

TEST(MonotonicMutexTest, AwaitReturnsOnceAnotherThreadMakesTheConditionTrueWithoutSignalling) {
  MonotonicMutex mu;
  bool ready = false;
  std::thread setter([&] {
    MonotonicMutexLock lock(&mu);
    ready = true;
  });
  {
    MonotonicMutexLock lock(&mu);
    mu.Await(absl::Condition(&ready));
    EXPECT_TRUE(ready);
  }
  setter.join();
}

TEST(MonotonicMutexTest, AwaitWithTimeoutReturnsTrueWhenTheConditionBecomesTrue) {
  MonotonicMutex mu;
  bool ready = false;
  std::thread setter([&] {
    MonotonicMutexLock lock(&mu);
    ready = true;
  });
  bool held;
  {
    MonotonicMutexLock lock(&mu);
    held = mu.AwaitWithTimeout(absl::Condition(&ready), kLong);
  }
  setter.join();
  EXPECT_TRUE(held);
}

TEST(MonotonicMutexTest, AwaitWithTimeoutReturnsFalseOnlyAfterTheTimeoutPassedOnTheMonotonicClock) {
  MonotonicMutex mu;
  bool never = false;
  MonotonicMutexLock lock(&mu);
  const Clock::time_point start = Clock::now();
  EXPECT_FALSE(mu.AwaitWithTimeout(absl::Condition(&never), absl::Milliseconds(50)));
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(50));
}

TEST(MonotonicMutexTest, ANonPositiveTimeoutEvaluatesTheConditionWithoutWaiting) {
  MonotonicMutex mu;
  bool value = false;
  MonotonicMutexLock lock(&mu);
  EXPECT_FALSE(mu.AwaitWithTimeout(absl::Condition(&value), absl::ZeroDuration()));
  value = true;
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&value), -absl::Seconds(1)));
}

// A thread that changes the state and then waits itself releases the lock
// by waiting: that release must wake the thread waiting for the change.
TEST(MonotonicMutexTest, AWaiterReleasingTheLockWakesAnotherWhoseConditionItMadeTrue) {
  MonotonicMutex mu;
  bool first = false, second = false;
  bool waiting = false;
  std::thread waiter([&] {
    MonotonicMutexLock lock(&mu);
    waiting = true;
    mu.Await(absl::Condition(&first));
    second = true;
  });
  MonotonicMutexLock lock(&mu);
  mu.Await(absl::Condition(&waiting));
  first = true;
  // Only `waiter` sets `second`, after `first` woke it.
  EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&second), kLong));
  mu.Unlock();
  waiter.join();
  mu.Lock();
}

TEST(MonotonicMutexTest, ACondVarWaitReleasingTheLockWakesAnAwaitWhoseConditionItMadeTrue) {
  MonotonicMutex mu;
  MonotonicCondVar cv;
  bool waiting = false, changed = false, woke = false;
  std::thread waiter([&] {
    MonotonicMutexLock lock(&mu);
    waiting = true;
    mu.Await(absl::Condition(&changed));
    woke = true;
    cv.Signal();
  });
  MonotonicMutexLock lock(&mu);
  mu.Await(absl::Condition(&waiting));
  changed = true;
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(60);
  while (!woke && Clock::now() < give_up) cv.WaitWithTimeout(&mu, absl::Seconds(1));
  EXPECT_TRUE(woke);
  mu.Unlock();
  waiter.join();
  mu.Lock();
}

TEST(MonotonicCondVarTest, SignalWakesAWaitBeforeItsTimeout) {
  MonotonicMutex mu;
  MonotonicCondVar cv;
  bool waiting = false, done = false;
  std::thread signaller([&] {
    MonotonicMutexLock lock(&mu);
    mu.Await(absl::Condition(&waiting));
    done = true;
    cv.SignalAll();
  });
  MonotonicMutexLock lock(&mu);
  waiting = true;
  bool timed_out = false;
  while (!done && !timed_out) timed_out = cv.WaitWithTimeout(&mu, kLong);
  EXPECT_FALSE(timed_out);
  mu.Unlock();
  signaller.join();
  mu.Lock();
}

TEST(MonotonicCondVarTest, WaitWithTimeoutReportsTheTimeoutAfterItPassed) {
  MonotonicMutex mu;
  MonotonicCondVar cv;
  MonotonicMutexLock lock(&mu);
  const Clock::time_point start = Clock::now();
  bool timed_out = false;
  // A spurious wake-up returns false early: loop as callers do.
  while (!timed_out && Clock::now() - start < std::chrono::milliseconds(50)) {
    timed_out = cv.WaitWithTimeout(&mu, absl::Milliseconds(50));
  }
  EXPECT_TRUE(timed_out);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(50));
}

// Under libfaketime (wall clock an hour ahead or behind, CLOCK_MONOTONIC
// real) each 300 ms wait of the probe lasts at least 300 ms and returns. A
// wait with a CLOCK_REALTIME deadline (absl's) would last an hour and 300 ms
// ahead (the probe is then killed at the deadline below) or return at once
// behind.
constexpr char kLibFaketime[] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

class FakedWallClockTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FakedWallClockTest, TimedWaitsLastTheirTimeoutOnTheMonotonicClock) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "libfaketime's LD_PRELOAD cannot come before the sanitizer runtime, which must "
                  "be first; the plain build runs this case";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "libfaketime's LD_PRELOAD cannot come before the sanitizer runtime, which must "
                  "be first; the plain build runs this case";
#endif
#endif
  ASSERT_EQ(access(kLibFaketime, R_OK), 0)
      << kLibFaketime << " is missing: scripts/setup installs libfaketime";
  testing::ScratchDir dir;
  testing::SpawnOptions options;
  options.env = {{"LD_PRELOAD", kLibFaketime},
                 {"FAKETIME", GetParam()},
                 {"FAKETIME_DONT_FAKE_MONOTONIC", "1"}};
  const int64_t real_before = absl::ToUnixSeconds(absl::Now());
  testing::Process probe = testing::Process::Spawn(
      {testing::Runfile("tests/daemon/monotonic_wait_probe")}, dir.File("probe.log"), options);
  const testing::ExitStatus st = probe.Wait(std::chrono::seconds(30));
  ASSERT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << probe.Log();

  std::map<std::string, int64_t> fields;
  for (absl::string_view field : absl::StrSplit(probe.Log(), absl::ByAnyChar(" \n"))) {
    std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
    int64_t v;
    if (absl::SimpleAtoi(kv.second, &v)) fields[kv.first] = v;
  }
  ASSERT_EQ(fields.size(), 3u) << probe.Log();
  // The probe saw the faked wall clock: at least 50 min off.
  EXPECT_GE(std::abs(fields["wall_s"] - real_before), 50 * 60) << probe.Log();
  EXPECT_GE(fields["await_ms"], 300) << probe.Log();
  EXPECT_GE(fields["condvar_ms"], 300) << probe.Log();
}

INSTANTIATE_TEST_SUITE_P(Offset, FakedWallClockTest, ::testing::Values("+1h", "-1h"));

}  // namespace
}  // namespace gradsync
