// 10 million readiness entries from a trainer process to a daemon process
// through one SpscRing in real shared memory: none lost, duplicated,
// reordered or altered, while the consumer keeps going to sleep on the
// node doorbell and being woken, and the producer blocks on a full ring.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ipc/events.h"
#include "ipc/node_segment.h"
#include "ipc/trainer_segment.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/process.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::Process;
using gradsync::testing::SegmentCleanup;
using gradsync::testing::UniqueSegmentName;
using std::chrono::microseconds;
using std::chrono::nanoseconds;
using std::chrono::seconds;

constexpr uint64_t kEvents = 10'000'000;
constexpr uint32_t kTensors = 1000;   // entries per iteration
constexpr uint64_t kCapacity = 1024;  // small: the ring wraps ~10^4 times
constexpr uint64_t kHash = 0x5eed;
constexpr uint64_t kArenaBytes = 4096;             // holds the producer's statistics
constexpr auto kStall = seconds(20);               // no progress for this long: failed
constexpr uint64_t kProducerPauseEvery = 250'000;  // the consumer runs dry
constexpr uint64_t kConsumerNapEvery = 700'000;    // the ring fills up
constexpr uint64_t kPhase = 1'000'000;             // consumer spin off / on

// Everything in an entry is a function of its sequence number, so the
// consumer can check each field, not only the order.
ReadyEvent Expected(uint64_t i) {
  ReadyEvent e{};
  e.tensor = static_cast<uint32_t>(i % kTensors);
  e.kind = static_cast<uint32_t>(i % 7 == 0 ? ReadyKind::kUnused : ReadyKind::kReady);
  e.iteration = i / kTensors;
  e.sequence = i;
  const uint64_t mixed = i * 0x9e37'79b9'7f4a'7c15ull;
  e.no_sync_iterations = static_cast<uint32_t>(mixed);
  e.checksum = static_cast<uint32_t>(mixed >> 32);
  return e;
}

bool SameEvent(const ReadyEvent& a, const ReadyEvent& b) {
  return a.tensor == b.tensor && a.kind == b.kind && a.iteration == b.iteration &&
         a.sequence == b.sequence && a.no_sync_iterations == b.no_sync_iterations &&
         a.checksum == b.checksum;
}

// Written by the producer into the arena when it is done.
struct ProducerStats {
  std::atomic<uint64_t> pushed;
  std::atomic<uint64_t> full_waits;  // times it slept on a full ring
};

// The trainer: pushes every entry, rings the node doorbell after each one,
// and sleeps on the completion doorbell (used here as "space available")
// when the ring is full.
int Produce(const std::string& node_name, const std::string& trainer_name) {
  auto node = NodeSegment::Open(node_name);
  auto trainer = TrainerSegment::Open(trainer_name, kHash, kArenaBytes);
  if (!node.ok() || !trainer.ok()) {
    fprintf(stderr, "producer: %s / %s\n", node.status().ToString().c_str(),
            trainer.status().ToString().c_str());
    return 1;
  }
  SpscRing<ReadyEvent>& ring = trainer->ready_ring();
  Doorbell& space = trainer->header()->completion_bell;
  auto* stats = reinterpret_cast<ProducerStats*>(trainer->arena());
  uint64_t full_waits = 0;
  for (uint64_t i = 0; i < kEvents; ++i) {
    const ReadyEvent e = Expected(i);
    while (!ring.TryPush(e)) {
      const uint32_t seen = space.Sequence();
      if (ring.TryPush(e)) break;
      ++full_waits;
      if (space.Wait(seen, kStall) == Doorbell::WaitResult::kTimeout) {
        fprintf(stderr, "producer: ring full for %llds at entry %llu\n",
                static_cast<long long>(kStall.count()), static_cast<unsigned long long>(i));
        return 2;
      }
    }
    node->ready_bell().Ring();
    if (i % kProducerPauseEvery == kProducerPauseEvery - 1) usleep(300);
  }
  stats->full_waits.store(full_waits);
  stats->pushed.store(kEvents, std::memory_order_release);
  return 0;
}

TEST(RingStressTest, TenMillionEventsBetweenProcesses) {
  SegmentCleanup cleanup;
  const std::string node_name = cleanup.Add(UniqueSegmentName("stress_node"));
  const std::string trainer_name = cleanup.Add(UniqueSegmentName("stress_trainer"));
  auto node = NodeSegment::Create(node_name, getpid());
  ASSERT_TRUE(node.ok()) << node.status();
  TrainerSegmentSpec spec;
  spec.layout_hash = kHash;
  spec.arena_bytes = kArenaBytes;
  spec.ring_capacity = kCapacity;
  spec.daemon_pid = getpid();
  auto trainer = TrainerSegment::Create(trainer_name, spec);
  ASSERT_TRUE(trainer.ok()) << trainer.status();

  auto child = Process::Fork([&] { return Produce(node_name, trainer_name); },
                             /*limit=*/seconds(240));
  ASSERT_TRUE(child.ok()) << child.status();

  SpscRing<ReadyEvent>& ring = trainer->ready_ring();
  Doorbell& ready = node->ready_bell();
  Doorbell& space = trainer->header()->completion_bell;
  uint64_t received = 0, since_space_ring = 0, sleeps = 0;
  std::string failure;
  auto last_progress = std::chrono::steady_clock::now();
  while (received < kEvents && failure.empty()) {
    ReadyEvent e;
    const PopResult r = ring.TryPop(&e);
    if (r == PopResult::kOk) {
      const ReadyEvent want = Expected(received);
      const absl::Status st = ValidateReadyEvent(e, {kTensors, want.iteration, want.sequence});
      if (!st.ok() || !SameEvent(e, want)) {
        failure = absl::StrCat("entry ", received, ": ", st.ToString(), " (got sequence ",
                               e.sequence, ", tensor ", e.tensor, ", checksum ", e.checksum, ")");
        break;
      }
      ++received;
      if (++since_space_ring == 64) {  // let a blocked producer go on
        space.Ring();
        since_space_ring = 0;
      }
      if (received % kConsumerNapEvery == 0) usleep(2000);
      continue;
    }
    if (r == PopResult::kCorrupt) {
      failure = absl::StrCat("ring reported corrupt after ", received, " entries");
      break;
    }
    // Empty: release the producer, then sleep on the node doorbell.
    if (since_space_ring > 0) {
      space.Ring();
      since_space_ring = 0;
    }
    const uint32_t seen = ready.Sequence();
    if (ring.Size() > 0) continue;
    // Some phases sleep at once when empty (every wait is a futex sleep),
    // the others spin first as the daemon does.
    const nanoseconds spin = (received / kPhase) % 4 == 0 ? nanoseconds(0) : microseconds(20);
    if (ready.Wait(seen, seconds(1), spin) == Doorbell::WaitResult::kRung) {
      ++sleeps;
      last_progress = std::chrono::steady_clock::now();
    } else if (!child->Running()) {
      failure = absl::StrCat("producer exited after ", received, " entries were received");
    } else if (std::chrono::steady_clock::now() - last_progress > kStall) {
      failure = absl::StrCat("no entry for ", kStall.count(), " s after ", received);
    }
  }
  if (!failure.empty()) {
    ASSERT_TRUE(child->Kill().ok());
  }
  ASSERT_EQ(failure, "");
  EXPECT_EQ(received, kEvents);

  auto code = child->Wait(std::chrono::seconds(60)).ExitCode();
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0);
  // Nothing beyond the last entry: no duplicates at the end.
  ReadyEvent extra;
  EXPECT_EQ(ring.TryPop(&extra), PopResult::kEmpty);
  EXPECT_TRUE(trainer->ValidateHeader().ok());
  const auto* stats = reinterpret_cast<const ProducerStats*>(trainer->arena());
  EXPECT_EQ(stats->pushed.load(), kEvents);
  // The point of the pauses: the consumer really slept and was woken.
  EXPECT_GT(sleeps, 0u);
  ::testing::Test::RecordProperty("consumer_wakeups", static_cast<int>(sleeps));
  ::testing::Test::RecordProperty("producer_full_waits",
                                  static_cast<int>(stats->full_waits.load()));
  printf("consumer woke %llu times; producer waited on a full ring %llu times\n",
         static_cast<unsigned long long>(sleeps),
         static_cast<unsigned long long>(stats->full_waits.load()));
}

}  // namespace
}  // namespace gradsync::ipc
