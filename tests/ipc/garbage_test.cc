// Garbage written into shared memory by another process (a buggy or
// hostile peer): the victim detects it, reports it as an error, and never
// crashes, reads out of bounds or consumes a corrupt ring.
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ipc/events.h"
#include "ipc/spsc_ring.h"
#include "ipc/trainer_segment.h"
#include "tests/ipc/segment_names.h"
#include "tests/testing/process.h"

namespace gradsync::ipc {
namespace {

using gradsync::testing::Process;
using gradsync::testing::SegmentCleanup;
using gradsync::testing::UniqueSegmentName;
using ::testing::HasSubstr;

constexpr uint64_t kHash = 0xfeed'f00dull;
constexpr uint64_t kArenaBytes = 4096;
constexpr uint64_t kCapacity = 16;
constexpr uint32_t kTensors = 100;

ReadyEvent Ready(uint64_t sequence) {
  ReadyEvent e{};
  e.tensor = static_cast<uint32_t>(sequence % kTensors);
  e.kind = static_cast<uint32_t>(ReadyKind::kReady);
  e.iteration = 0;
  e.sequence = sequence;
  return e;
}

class GarbageTest : public ::testing::Test {
 protected:
  void SetUp() override { Recreate(); }

  // A fresh daemon-side segment under a new name.
  void Recreate() {
    name_ = cleanup_.Add(UniqueSegmentName("garbage"));
    TrainerSegmentSpec spec;
    spec.layout_hash = kHash;
    spec.arena_bytes = kArenaBytes;
    spec.ring_capacity = kCapacity;
    auto seg = TrainerSegment::Create(name_, spec);
    ASSERT_TRUE(seg.ok()) << seg.status();
    daemon_ = std::move(*seg);
  }

  // Runs `scribble` in a separate process that opened the segment by name
  // (as a trainer would) and waits for it.
  void ScribbleFromAnotherProcess(std::function<void(TrainerSegment&)> scribble) {
    auto child = Process::Fork([name = name_, scribble]() -> int {
      auto seg = TrainerSegment::Open(name, kHash, kArenaBytes);
      if (!seg.ok()) {
        fprintf(stderr, "child: %s\n", seg.status().ToString().c_str());
        return 1;
      }
      scribble(*seg);
      return 0;
    });
    ASSERT_TRUE(child.ok()) << child.status();
    auto code = child->Wait(std::chrono::seconds(30)).ExitCode();
    ASSERT_TRUE(code.ok()) << code.status();
    ASSERT_EQ(*code, 0);
  }

  static RingControl* ReadyControl(TrainerSegment& seg) {
    return reinterpret_cast<RingControl*>(reinterpret_cast<uint8_t*>(seg.header()) +
                                          seg.header()->ready_offset);
  }
  static ReadyEvent* ReadySlots(TrainerSegment& seg) {
    return reinterpret_cast<ReadyEvent*>(ReadyControl(seg) + 1);
  }
  static RingControl* CompletionControl(TrainerSegment& seg) {
    return reinterpret_cast<RingControl*>(reinterpret_cast<uint8_t*>(seg.header()) +
                                          seg.header()->completion_offset);
  }

  // Pops like the daemon: validates every entry and stops at the first
  // bad one (that trainer is failed). Returns the index of the first bad
  // entry, or -1 if all `n` expected entries were good.
  int64_t ConsumeExpecting(uint64_t n, absl::Status* error) {
    ReadyExpectation expect{kTensors, 0, 0};
    for (uint64_t i = 0; i < n; ++i) {
      ReadyEvent e;
      const PopResult r = daemon_.ready_ring().TryPop(&e);
      if (r != PopResult::kOk) {
        *error = absl::DataLossError(r == PopResult::kEmpty ? "empty" : "corrupt");
        return static_cast<int64_t>(i);
      }
      *error = ValidateReadyEvent(e, expect);
      if (!error->ok()) return static_cast<int64_t>(i);
      ++expect.sequence;
    }
    return -1;
  }

  SegmentCleanup cleanup_;
  std::string name_;
  TrainerSegment daemon_;
};

struct CounterCase {
  const char* what;
  uint64_t head, tail;  // written over the real counters (tail 1, head 3)
};

TEST_F(GarbageTest, CorruptRingCountersAreDetected) {
  for (const CounterCase c :
       {CounterCase{"head behind tail", 0, 1},
        CounterCase{"head past capacity", 1 + kCapacity + 1, 1},
        CounterCase{"head far away", uint64_t{1} << 40, 1}, CounterCase{"tail past head", 3, 8},
        CounterCase{"both garbage", 0x8badf00d, 0xdeadbeefcafe}}) {
    SCOPED_TRACE(c.what);
    Recreate();
    for (uint64_t i = 0; i < 3; ++i) ASSERT_TRUE(daemon_.ready_ring().TryPush(Ready(i)));
    ReadyEvent first;
    ASSERT_EQ(daemon_.ready_ring().TryPop(&first), PopResult::kOk);  // tail = 1, head = 3
    ScribbleFromAnotherProcess([c](TrainerSegment& seg) {
      RingControl* control = ReadyControl(seg);
      control->head.store(c.head);
      control->tail.store(c.tail);
    });
    const absl::Status st = daemon_.ValidateHeader();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_THAT(st.message(), HasSubstr("readiness ring counters are inconsistent"));
    const uint64_t tail_before = ReadyControl(daemon_)->tail.load();
    ReadyEvent e;
    EXPECT_EQ(daemon_.ready_ring().TryPop(&e), PopResult::kCorrupt);
    EXPECT_EQ(ReadyControl(daemon_)->tail.load(), tail_before) << "a corrupt ring was consumed";
    // The producer side refuses to write into a corrupt ring as well.
    EXPECT_FALSE(daemon_.ready_ring().TryPush(Ready(3)));
    // A trainer that attaches now is told, not handed a broken ring.
    EXPECT_EQ(TrainerSegment::Open(name_, kHash, kArenaBytes).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST_F(GarbageTest, CorruptRingCapacityIsDetectedAndNotUsed) {
  ScribbleFromAnotherProcess(
      [](TrainerSegment& seg) { CompletionControl(seg)->capacity = uint64_t{1} << 40; });
  const absl::Status st = daemon_.ValidateHeader();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_THAT(st.message(), HasSubstr("completion ring capacity"));
  // Our own capacity still bounds every index: fill the ring completely.
  for (uint64_t i = 0; i < kCapacity; ++i) {
    CompletionEvent e{};
    e.sequence = i;
    ASSERT_TRUE(daemon_.completion_ring().TryPush(e));
  }
  EXPECT_FALSE(daemon_.completion_ring().TryPush(CompletionEvent{}));
}

struct SlotCase {
  const char* what;
  std::function<void(ReadyEvent*)> corrupt;  // applied to entry 3 of 8
  absl::StatusCode code;
};

TEST_F(GarbageTest, CorruptEntriesAreRejectedInOrder) {
  const std::vector<SlotCase> cases = {
      {"random bytes",
       [](ReadyEvent* e) {
         std::mt19937_64 rng(42);
         for (auto* p = reinterpret_cast<uint8_t*>(e); p < reinterpret_cast<uint8_t*>(e + 1); ++p) {
           *p = static_cast<uint8_t>(rng());
         }
       },
       absl::StatusCode::kDataLoss},
      {"tensor out of range", [](ReadyEvent* e) { e->tensor = kTensors; },
       absl::StatusCode::kOutOfRange},
      {"unknown kind", [](ReadyEvent* e) { e->kind = 0; }, absl::StatusCode::kDataLoss},
      {"wrong iteration", [](ReadyEvent* e) { e->iteration = 1; }, absl::StatusCode::kDataLoss},
      {"duplicate", [](ReadyEvent* e) { *e = e[-1]; }, absl::StatusCode::kDataLoss},
      {"reordered", [](ReadyEvent* e) { std::swap(e[0], e[1]); }, absl::StatusCode::kDataLoss},
      {"zeroed", [](ReadyEvent* e) { std::memset(e, 0, sizeof(*e)); }, absl::StatusCode::kDataLoss},
  };
  for (const SlotCase& c : cases) {
    SCOPED_TRACE(c.what);
    Recreate();
    ScribbleFromAnotherProcess([&c](TrainerSegment& seg) {
      for (uint64_t i = 0; i < 8; ++i) seg.ready_ring().TryPush(Ready(i));
      c.corrupt(&ReadySlots(seg)[3]);
    });
    EXPECT_TRUE(daemon_.ValidateHeader().ok()) << "the header itself is fine";
    absl::Status error;
    EXPECT_EQ(ConsumeExpecting(8, &error), 3) << error;
    EXPECT_EQ(error.code(), c.code) << error;
  }
}

struct HeaderCase {
  const char* what;
  std::function<void(TrainerSegmentHeader*)> corrupt;
  bool mapped_side_detects;  // ValidateHeader re-checks this field
};

TEST_F(GarbageTest, CorruptHeaderFieldsAreDetected) {
  const std::vector<HeaderCase> cases = {
      {"magic", [](TrainerSegmentHeader* h) { h->magic = ~h->magic; }, true},
      {"version", [](TrainerSegmentHeader* h) { h->layout_version = 0; }, true},
      {"ready capacity", [](TrainerSegmentHeader* h) { h->ready_capacity *= 2; }, true},
      {"completion capacity", [](TrainerSegmentHeader* h) { h->completion_capacity = 3; }, true},
      {"arena bytes", [](TrainerSegmentHeader* h) { h->arena_bytes = ~uint64_t{0}; }, true},
      // Offsets are used once, at Open: the mapped side never re-reads them.
      {"ready offset", [](TrainerSegmentHeader* h) { h->ready_offset += 64; }, false},
      {"arena offset", [](TrainerSegmentHeader* h) { h->arena_offset = 1 << 30; }, false},
      {"segment bytes", [](TrainerSegmentHeader* h) { h->segment_bytes = 1; }, false},
      {"header bytes", [](TrainerSegmentHeader* h) { h->header_bytes = 0; }, false},
      {"layout hash", [](TrainerSegmentHeader* h) { h->layout_hash ^= 1; }, false},
  };
  for (const HeaderCase& c : cases) {
    SCOPED_TRACE(c.what);
    Recreate();
    ScribbleFromAnotherProcess([&c](TrainerSegment& seg) { c.corrupt(seg.header()); });
    const absl::Status validated = daemon_.ValidateHeader();
    if (c.mapped_side_detects) {
      EXPECT_EQ(validated.code(), absl::StatusCode::kDataLoss) << validated;
      EXPECT_THAT(validated.message(), HasSubstr(name_));
    } else {
      EXPECT_TRUE(validated.ok()) << validated;
    }
    const absl::Status opened = TrainerSegment::Open(name_, kHash, kArenaBytes).status();
    EXPECT_FALSE(opened.ok()) << "a corrupt header was accepted";
    EXPECT_THAT(opened.message(), HasSubstr(name_));
    // The daemon side keeps working on its own geometry.
    ASSERT_TRUE(daemon_.ready_ring().TryPush(Ready(0)));
    ReadyEvent e;
    EXPECT_EQ(daemon_.ready_ring().TryPop(&e), PopResult::kOk);
  }
}

TEST_F(GarbageTest, UnterminatedErrorMessageIsBounded) {
  daemon_.SetError(1, "first");
  ScribbleFromAnotherProcess([](TrainerSegment& seg) {
    std::memset(seg.header()->error_message, 'z', kErrorMessageBytes);  // no '\0'
  });
  const std::string message = daemon_.ErrorMessage();
  EXPECT_EQ(message, std::string(kErrorMessageBytes - 1, 'z'));
}

// Random bytes over random parts of the header and both rings, many times:
// whatever is hit, nothing crashes, a changed checked field is always
// reported, and the consumer never pops more than the ring can hold.
TEST_F(GarbageTest, RandomGarbageNeverCrashes) {
  constexpr int kRounds = 150;
  std::mt19937_64 rng(20261122);
  int detected = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    Recreate();
    for (uint64_t i = 0; i < 5; ++i) ASSERT_TRUE(daemon_.ready_ring().TryPush(Ready(i)));
    // The fields ValidateHeader re-checks, before the garbage.
    const auto checked = [](const TrainerSegmentHeader* h) {
      return std::make_tuple(h->magic, h->layout_version, h->ready_capacity, h->completion_capacity,
                             h->arena_bytes);
    };
    const auto before = checked(daemon_.header());
    const uint64_t seed = rng();
    const uint64_t region = daemon_.header()->arena_offset;  // header + both rings
    ScribbleFromAnotherProcess([seed, region](TrainerSegment& seg) {
      std::mt19937_64 r(seed);
      auto* base = reinterpret_cast<uint8_t*>(seg.header());
      const int writes = 1 + static_cast<int>(r() % 8);
      for (int w = 0; w < writes; ++w) {
        // Bias towards the header and ring control blocks, where it matters.
        const uint64_t span = (r() % 2 == 0) ? 512 : region;
        const uint64_t offset = r() % span;
        const uint64_t length = 1 + r() % 16;
        for (uint64_t i = offset; i < offset + length && i < region; ++i) {
          base[i] = static_cast<uint8_t>(r());
        }
      }
    });

    const absl::Status validated = daemon_.ValidateHeader();
    if (checked(daemon_.header()) != before) {
      EXPECT_FALSE(validated.ok()) << "a changed header field went unnoticed";
    }
    if (!validated.ok()) ++detected;
    (void)TrainerSegment::Open(name_, kHash, kArenaBytes);  // any answer, no crash

    // Drain like the daemon; a valid-looking ring holds at most kCapacity.
    ReadyExpectation expect{kTensors, 0, 0};
    int popped = 0;
    ReadyEvent e;
    while (daemon_.ready_ring().TryPop(&e) == PopResult::kOk) {
      ASSERT_LE(++popped, static_cast<int>(kCapacity));
      if (!ValidateReadyEvent(e, expect).ok()) break;
      ++expect.sequence;
    }
    EXPECT_LT(daemon_.ErrorMessage().size(), kErrorMessageBytes);
    ASSERT_TRUE(SharedSegment::Remove(name_).ok());
  }
  EXPECT_GT(detected, 0) << "no round hit anything ValidateHeader checks";
}

}  // namespace
}  // namespace gradsync::ipc
