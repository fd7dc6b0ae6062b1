// Doorbell across real processes: a ring wakes a sleeper in another
// process, every waiter, and never gets lost over many ping-pong rounds; a
// wait with nobody ringing returns kTimeout.
#include "ipc/doorbell.h"

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <new>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "ipc/shared_segment.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/process.h"

namespace gradsync::ipc {

// Readable failure messages (found by gtest through ADL).
void PrintTo(Doorbell::WaitResult r, std::ostream* os) {
  *os << (r == Doorbell::WaitResult::kRung ? "kRung" : "kTimeout");
}

namespace {

using gradsync::testing::Process;
using gradsync::testing::SegmentCleanup;
using gradsync::testing::UniqueSegmentName;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr auto kChildTimeout = seconds(60);
// A sleeper that is never woken still sees the new sequence when its
// timeout expires, so a lost wake-up shows as a wait that lasted its whole
// timeout. A delivered one takes microseconds; 5 s leaves room for a noisy
// machine without making a failing run slow.
constexpr auto kWakeLimit = seconds(5);

// True when Wait returned kRung before its timeout expired: woken by Ring().
bool WokenInTime(Doorbell& bell, uint32_t seen, nanoseconds spin) {
  const auto start = Clock::now();
  const Doorbell::WaitResult r = bell.Wait(seen, kWakeLimit, spin);
  return r == Doorbell::WaitResult::kRung && Clock::now() - start < kWakeLimit;
}

// What the tests share through the segment: two bells, one per direction,
// and the work each side publishes before ringing.
struct Shared {
  Doorbell bell[2];
  alignas(64) std::atomic<uint64_t> counter[2];
};

class DoorbellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = cleanup_.Add(UniqueSegmentName("bell"));
    auto seg = SharedSegment::Create(name_, sizeof(Shared));
    ASSERT_TRUE(seg.ok()) << seg.status();
    segment_ = std::move(*seg);
    shared_ = new (segment_.data()) Shared();
    for (Doorbell& b : shared_->bell) b.Init();
  }

  // What a child process sees: the segment opened by name, not inherited.
  static Shared* OpenShared(const std::string& name, SharedSegment* keep) {
    auto seg = SharedSegment::Open(name);
    if (!seg.ok()) {
      fprintf(stderr, "child: %s\n", seg.status().ToString().c_str());
      return nullptr;
    }
    *keep = std::move(*seg);
    return static_cast<Shared*>(keep->data());
  }

  // Polls until `n` processes sleep on `bell` (so the next Ring must take
  // the FUTEX_WAKE path). False after 10 s.
  static bool AwaitSleepers(const Doorbell& bell, uint32_t n) {
    const auto deadline = Clock::now() + seconds(10);
    while (bell.sleepers.load() < n) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return true;
  }

  // A child that sleeps on bell 0 until the first ring: exits 0 if woken
  // in time, 2 if not.
  absl::StatusOr<Process> StartWaiter() const {
    return Process::Fork([name = name_]() -> int {
      SharedSegment keep;
      Shared* shared = OpenShared(name, &keep);
      if (shared == nullptr) return 1;
      return WokenInTime(shared->bell[0], 0, nanoseconds(0)) ? 0 : 2;
    });
  }

  SegmentCleanup cleanup_;
  std::string name_;
  SharedSegment segment_;
  Shared* shared_ = nullptr;
};

TEST_F(DoorbellTest, RingBeforeWaitIsNotLost) {
  Doorbell& bell = shared_->bell[0];
  const uint32_t seen = bell.Sequence();
  bell.Ring();
  EXPECT_NE(bell.Sequence(), seen);
  EXPECT_TRUE(WokenInTime(bell, seen, nanoseconds(0)));
  EXPECT_EQ(bell.sleepers.load(), 0u);
}

TEST_F(DoorbellTest, TimeoutReturnsKTimeout) {
  Doorbell& bell = shared_->bell[0];
  struct Case {
    nanoseconds timeout, spin;
  };
  for (const Case c : {Case{milliseconds(30), nanoseconds(0)},
                       Case{milliseconds(30), std::chrono::microseconds(20)},
                       Case{milliseconds(30), seconds(5)},  // spin longer than timeout
                       Case{nanoseconds(0), std::chrono::microseconds(20)},
                       Case{nanoseconds(-5), nanoseconds(0)}}) {
    const auto start = Clock::now();
    EXPECT_EQ(bell.Wait(bell.Sequence(), c.timeout, c.spin), Doorbell::WaitResult::kTimeout)
        << c.timeout.count() << " ns";
    // A lower bound only: never earlier than asked (the machine is noisy).
    EXPECT_GE(Clock::now() - start, c.timeout);
    EXPECT_EQ(bell.sleepers.load(), 0u);
  }
}

TEST_F(DoorbellTest, WakesASleeperInAnotherProcess) {
  auto child = Process::Fork([name = name_]() -> int {
    SharedSegment keep;
    Shared* shared = OpenShared(name, &keep);
    if (shared == nullptr) return 1;
    Doorbell& bell = shared->bell[0];
    const uint32_t seen = bell.Sequence();
    if (shared->counter[0].load() != 0) return 0;  // rung already
    return WokenInTime(bell, seen, nanoseconds(0)) ? 0 : 2;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(AwaitSleepers(shared_->bell[0], 1)) << "the child never went to sleep";
  shared_->counter[0].store(1);
  shared_->bell[0].Ring();
  auto code = child->Wait(kChildTimeout).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << "2: the child timed out instead of being woken";
  EXPECT_EQ(shared_->bell[0].sleepers.load(), 0u);
}

TEST_F(DoorbellTest, AnotherProcessWakesUs) {
  auto child = Process::Fork([name = name_]() -> int {
    SharedSegment keep;
    Shared* shared = OpenShared(name, &keep);
    if (shared == nullptr) return 1;
    AwaitSleepers(shared->bell[0], 1);  // ring even if we never saw it sleep
    shared->bell[0].Ring();
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_TRUE(WokenInTime(shared_->bell[0], 0, nanoseconds(0)));
  auto code = child->Wait(kChildTimeout).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// nanoseconds::max() must mean "no limit", not overflow into the past.
// The unbounded wait runs in the child, so a broken bell cannot hang us.
TEST_F(DoorbellTest, UnboundedTimeoutWaitsForTheRing) {
  auto child = Process::Fork([name = name_]() -> int {
    SharedSegment keep;
    Shared* shared = OpenShared(name, &keep);
    if (shared == nullptr) return 1;
    if (shared->bell[0].Wait(0, nanoseconds::max(), nanoseconds(0)) !=
        Doorbell::WaitResult::kRung) {
      return 2;
    }
    return shared->counter[0].load() == 1 ? 0 : 3;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  const bool slept = AwaitSleepers(shared_->bell[0], 1);
  shared_->counter[0].store(1);
  shared_->bell[0].Ring();
  auto code = child->Wait(kWakeLimit + seconds(5)).ExitCode();  // an error if never woken
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << "2: kTimeout; 3: returned before the ring";
  EXPECT_TRUE(slept) << "the unbounded wait never went to sleep";
}

TEST_F(DoorbellTest, OneRingWakesEveryWaiter) {
  constexpr int kWaiters = 3;
  std::vector<Process> children;
  for (int i = 0; i < kWaiters; ++i) {
    auto child = StartWaiter();
    ASSERT_TRUE(child.ok()) << child.status();
    children.push_back(std::move(*child));
  }
  ASSERT_TRUE(AwaitSleepers(shared_->bell[0], kWaiters));
  shared_->bell[0].Ring();
  for (Process& child : children) {
    auto code = child.Wait(kChildTimeout).ExitCode();
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << "a waiter was not woken";
  }
}

// A waiter killed in FUTEX_WAIT leaves `sleepers` raised; the bell must
// keep working for the next waiter (it only costs a syscall per ring).
TEST_F(DoorbellTest, WaiterKilledWhileSleepingBlocksNobody) {
  auto doomed = Process::Fork([name = name_]() -> int {
    SharedSegment keep;
    Shared* shared = OpenShared(name, &keep);
    if (shared == nullptr) return 1;
    shared->bell[0].Wait(0, seconds(30), nanoseconds(0));
    return 0;
  });
  ASSERT_TRUE(doomed.ok()) << doomed.status();
  ASSERT_TRUE(AwaitSleepers(shared_->bell[0], 1));
  ASSERT_TRUE(doomed->Kill().ok());

  auto child = StartWaiter();
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE(AwaitSleepers(shared_->bell[0], 2));  // the dead one still counts
  shared_->bell[0].Ring();
  auto code = child->Wait(kChildTimeout).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// Waits until `counter` reaches `target`, with the protocol from
// doorbell.h: read the sequence, check for work, then wait. False when a
// wait was not woken in time, i.e. a wake-up was lost.
bool AwaitCounter(Doorbell& bell, const std::atomic<uint64_t>& counter, uint64_t target,
                  nanoseconds spin) {
  while (true) {
    const uint32_t seen = bell.Sequence();
    if (counter.load(std::memory_order_acquire) >= target) return true;
    if (!WokenInTime(bell, seen, spin)) return false;
  }
}

// Spins until someone sleeps on `bell`, so that the next Ring() has to
// wake it through the futex. False after 10 s.
bool SpinUntilSleeper(const Doorbell& bell) {
  const auto deadline = Clock::now() + seconds(10);
  while (bell.sleepers.load() == 0) {
    if (Clock::now() > deadline) return false;
    sched_yield();
  }
  return true;
}

// Every third round the ringer waits for its peer to be asleep (the wake
// path); the other rounds ring at once and race the peer's spin-to-sleep
// transition.
bool PublishAndRing(Doorbell& bell, std::atomic<uint64_t>& counter, uint64_t round) {
  if (round % 3 == 0 && !SpinUntilSleeper(bell)) return false;
  counter.store(round, std::memory_order_release);
  bell.Ring();
  return true;
}

class DoorbellPingPongTest : public DoorbellTest,
                             public ::testing::WithParamInterface<nanoseconds> {};

// Each round is one ring in each direction between two processes; with
// spin 0 every wait that finds no work goes through FUTEX_WAIT, so a race
// between "announce sleeper" and "ring" would surface as a timeout here.
TEST_P(DoorbellPingPongTest, NoLostWakeUps) {
  constexpr uint64_t kRounds = 20000;
  const nanoseconds spin = GetParam();
  auto child = Process::Fork([name = name_, spin]() -> int {
    SharedSegment keep;
    Shared* shared = OpenShared(name, &keep);
    if (shared == nullptr) return 1;
    for (uint64_t i = 1; i <= kRounds; ++i) {
      if (!AwaitCounter(shared->bell[0], shared->counter[0], i, spin)) {
        fprintf(stderr, "child: lost wake-up in round %llu\n", static_cast<unsigned long long>(i));
        return 2;
      }
      if (!PublishAndRing(shared->bell[1], shared->counter[1], i)) return 3;
    }
    return 0;
  });
  ASSERT_TRUE(child.ok()) << child.status();
  uint64_t lost_at = 0;
  for (uint64_t i = 1; i <= kRounds; ++i) {
    ASSERT_TRUE(PublishAndRing(shared_->bell[0], shared_->counter[0], i))
        << "the child never slept in round " << i;
    if (!AwaitCounter(shared_->bell[1], shared_->counter[1], i, spin)) {
      lost_at = i;
      break;
    }
  }
  EXPECT_EQ(lost_at, 0u) << "the parent's wake-up was lost in this round";
  auto code = child->Wait(kChildTimeout).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << "2: the child's wake-up was lost; 3: the parent never slept";
  EXPECT_EQ(shared_->counter[1].load(), kRounds);
}

INSTANTIATE_TEST_SUITE_P(Spin, DoorbellPingPongTest,
                         ::testing::Values(nanoseconds(0),
                                           nanoseconds(std::chrono::microseconds(20))),
                         [](const ::testing::TestParamInfo<nanoseconds>& info) {
                           return info.param.count() == 0 ? "AlwaysSleep" : "SpinThenSleep";
                         });

}  // namespace
}  // namespace gradsync::ipc
