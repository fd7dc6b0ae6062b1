// Fuzzes the daemon's re-checks of the segment headers it shares with
// processes of its user, which may scribble on them at any time:
// TrainerSegment::ValidateHeader (header fields and both ring control
// blocks) and NodeSegment::Check, over real segments in /dev/shm. The input
// is XORed onto the headers as the daemon created them (empty input: intact
// headers, which must pass); every answer is OK or DATA_LOSS naming the
// segment, and the headers are restored after each input.
//
// Input, in order: the TrainerSegment header's plain fields, the readiness
// then the completion ring's control words (head, tail, capacity), then the
// NodeSegment header's plain fields; a short input leaves the rest intact.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "ipc/node_segment.h"
#include "ipc/random_segment_name.h"
#include "ipc/shared_segment.h"
#include "ipc/trainer_segment.h"
#include "tests/fuzz/fuzz_check.h"

namespace gradsync::ipc {
namespace {

// A region of shared memory the input may damage, with its intact bytes.
struct Region {
  uint8_t* at;
  size_t bytes;
  std::vector<uint8_t> intact;
};

struct Segments {
  TrainerSegment trainer;
  NodeSegment node;
  std::string node_name;
  std::vector<Region> regions;
};

void Protect(std::vector<Region>& regions, void* at, size_t bytes) {
  auto* p = static_cast<uint8_t*>(at);
  regions.push_back(Region{p, bytes, std::vector<uint8_t>(p, p + bytes)});
}

Segments& Get() {
  static Segments* s = [] {
    auto* s = new Segments;
    TrainerSegmentSpec spec;
    spec.arena_bytes = 4096;
    spec.ring_capacity = 16;
    spec.daemon_pid = getpid();
    const std::string trainer_name = RandomSegmentName("gradsync-fuzz-hdr", getpid(), "t");
    auto trainer = TrainerSegment::Create(trainer_name, spec);
    FUZZ_CHECK(trainer.ok(), trainer.status().ToString());
    (void)SharedSegment::Remove(trainer_name);  // the mapping outlives the name
    s->trainer = std::move(*trainer);

    // NodeSegment::Check also checks the name still refers to the mapping,
    // so it stays until exit.
    s->node_name = RandomSegmentName("gradsync-fuzz-hdr", getpid(), "n");
    auto node = NodeSegment::Create(s->node_name, getpid());
    FUZZ_CHECK(node.ok(), node.status().ToString());
    s->node = std::move(*node);
    std::atexit([] { (void)SharedSegment::Remove(Get().node_name); });

    TrainerSegmentHeader* h = s->trainer.header();
    auto* base = reinterpret_cast<uint8_t*>(h);
    Protect(s->regions, h, offsetof(TrainerSegmentHeader, daemon_heartbeat));
    Protect(s->regions, base + h->ready_offset, sizeof(RingControl));
    Protect(s->regions, base + h->completion_offset, sizeof(RingControl));
    Protect(s->regions, s->node.header(), offsetof(NodeSegmentHeader, heartbeat));
    return s;
  }();
  return *s;
}

void ExpectOkOrDataLoss(const absl::Status& st, const std::string& name) {
  if (st.ok()) return;
  FUZZ_CHECK(st.code() == absl::StatusCode::kDataLoss, st.ToString());
  FUZZ_CHECK(absl::StrContains(st.message(), name), st.ToString());
}

}  // namespace
}  // namespace gradsync::ipc

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync::ipc;
  Segments& s = Get();
  size_t used = 0;
  bool damaged = false;
  for (Region& r : s.regions) {
    for (size_t i = 0; i < r.bytes && used < size; i++, used++) {
      r.at[i] ^= data[used];
      damaged |= data[used] != 0;
    }
  }
  const absl::Status trainer = s.trainer.ValidateHeader();
  const absl::Status node = s.node.Check();
  for (Region& r : s.regions) std::memcpy(r.at, r.intact.data(), r.bytes);

  ExpectOkOrDataLoss(trainer, s.trainer.name());
  ExpectOkOrDataLoss(node, s.node.name());
  if (!damaged) {
    FUZZ_CHECK(trainer.ok() && node.ok(), trainer.ToString() + " / " + node.ToString());
  }
  return 0;
}
