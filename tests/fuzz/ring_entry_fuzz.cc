// Fuzzes readiness entries as the daemon reads them: the input is what a
// (buggy or hostile) trainer wrote into the readiness ring of a real
// TrainerSegment in /dev/shm; the daemon side pops it (SpscRing::TryPop) and
// checks every entry (ipc::ValidateReadyEvent) the way Scheduler::Drain does,
// advancing the expected sequence and iteration. Each entry is accepted or
// refused with DATA_LOSS / OUT_OF_RANGE naming the readiness entry.
//
// Input: byte 0 picks num_tensors (1..8); the rest are 32-byte ReadyEvents
// as they lie in the slots (at most the ring's capacity).
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "ipc/events.h"
#include "ipc/random_segment_name.h"
#include "ipc/shared_segment.h"
#include "ipc/trainer_segment.h"
#include "tests/fuzz/fuzz_check.h"

namespace gradsync::ipc {
namespace {

constexpr uint64_t kRingCapacity = 64;

TrainerSegment& Segment() {
  static TrainerSegment* segment = [] {
    const std::string name = RandomSegmentName("gradsync-fuzz-ring", getpid(), "t");
    TrainerSegmentSpec spec;
    spec.arena_bytes = 4096;
    spec.ring_capacity = kRingCapacity;
    spec.daemon_pid = getpid();
    auto created = TrainerSegment::Create(name, spec);
    FUZZ_CHECK(created.ok(), created.status().ToString());
    // The mapping outlives the name: nothing is left in /dev/shm.
    (void)SharedSegment::Remove(name);
    return new TrainerSegment(std::move(*created));
  }();
  return *segment;
}

void Drain(SpscRing<ReadyEvent>& ring) {
  ReadyEvent e;
  while (ring.TryPop(&e) == PopResult::kOk) {
  }
}

}  // namespace
}  // namespace gradsync::ipc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync::ipc;
  if (size == 0) return 0;
  TrainerSegment& segment = Segment();
  SpscRing<ReadyEvent>& ring = segment.ready_ring();
  Drain(ring);  // the previous input's leftovers

  const uint32_t num_tensors = 1 + data[0] % 8;
  data++, size--;
  for (size_t i = 0; i + sizeof(ReadyEvent) <= size && i / sizeof(ReadyEvent) < kRingCapacity;
       i += sizeof(ReadyEvent)) {
    ReadyEvent e;
    std::memcpy(&e, data + i, sizeof(e));
    FUZZ_CHECK(ring.TryPush(e), "the ring refused an entry below its capacity");
  }

  ReadyExpectation expect{num_tensors, 0, 0};
  std::vector<bool> seen(num_tensors, false);
  uint32_t seen_count = 0;
  ReadyEvent e;
  while (ring.TryPop(&e) == PopResult::kOk) {
    const absl::Status st = ValidateReadyEvent(e, expect);
    if (!st.ok()) {
      FUZZ_CHECK(
          st.code() == absl::StatusCode::kDataLoss || st.code() == absl::StatusCode::kOutOfRange,
          st.ToString());
      FUZZ_CHECK(absl::StrContains(st.message(), "readiness entry"), st.ToString());
      break;  // the daemon fails this trainer and reads no further
    }
    FUZZ_CHECK(e.sequence == expect.sequence && e.iteration == expect.iteration,
               "accepted an entry out of sequence");
    if (e.kind == static_cast<uint32_t>(ReadyKind::kJoin)) {
      // gs_join: only known flags; the scheduler checks it came between
      // iterations, and the trainer posts nothing after it.
      FUZZ_CHECK((e.tensor & ~kJoinDivideByInitialWorldSize) == 0, "accepted unknown join flags");
      break;
    }
    // Accepted: the tensor index is in range and the sequence is the next.
    FUZZ_CHECK(e.tensor < num_tensors, "accepted a bad entry");
    expect.sequence++;
    if (seen[e.tensor]) break;  // marked twice in one iteration: the scheduler refuses it
    seen[e.tensor] = true;
    seen_count++;
    if (seen_count == num_tensors) {  // the iteration is complete
      expect.iteration++;
      seen.assign(num_tensors, false);
      seen_count = 0;
    }
  }
  return 0;
}
