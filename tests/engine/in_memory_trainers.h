// Trainers as in-memory segments: the test process plays both sides.
//
// InMemoryTrainer is the trainer's end of a real TrainerSegment (and the
// node segment), opened by name as client/client.cc opens it: the test
// writes gradients into its arena, posts ReadyEvents to its readiness ring
// and rings the node doorbell exactly as the client does, and reads
// completions (and the daemon's error message) the same way.
//
// InMemoryNode is the daemon's end for tests that drive a Scheduler
// directly: it plans the buckets and the arena as Job does, creates the node
// segment and one TrainerSegment per local trainer (real Boost shared
// memory under /dev/shm, short unique names), the Trainer objects the
// scheduler drains, and an InMemoryTrainer on each. Everything it created is
// removed when it is destroyed.
#ifndef GRADSYNC_TESTS_ENGINE_IN_MEMORY_TRAINERS_H_
#define GRADSYNC_TESTS_ENGINE_IN_MEMORY_TRAINERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/layout.h"
#include "daemon/engine/bucket_planner.h"
#include "daemon/engine/trainer.h"
#include "ipc/arena.h"
#include "ipc/events.h"
#include "ipc/node_segment.h"
#include "ipc/trainer_segment.h"

namespace gradsync::testing {

class InMemoryTrainer {
 public:
  // What registration told the trainer (Job's RegisterResult, or InMemoryNode).
  struct Attachment {
    std::string segment_name;
    std::string node_segment_name;
    uint64_t layout_hash = 0;
    uint64_t arena_bytes = 0;
    std::vector<uint64_t> tensor_offsets;
  };

  static absl::StatusOr<std::unique_ptr<InMemoryTrainer>> Open(const Attachment& at,
                                                               const Layout& layout);

  // Element `e` of tensor `i`, as a double; Set rounds to the tensor's dtype.
  double Get(size_t i, size_t e) const;
  void Set(size_t i, size_t e, double value);
  // Set, then read back: the value the daemon will actually see.
  double SetRounded(size_t i, size_t e, double value);

  // As the client: one entry per mark, then the node doorbell. With sync
  // off nothing is posted and the marks only count locally.
  absl::Status MarkReady(size_t i);
  // Zeroes the gradient first, unless earlier no_sync iterations
  // accumulated into it (then it is posted as ready, like the client).
  absl::Status MarkUnused(size_t i);
  // Sets accumulation (no_sync) between iterations.
  void SetSync(bool enabled) { sync_ = enabled; }
  // As GRADSYNC_DEBUG=detail: each entry carries the gradient's MarkChecksum.
  void SetChecksumMarks(bool enabled) { checksum_marks_ = enabled; }
  // gs_join's entry (uneven inputs), between iterations; Wait then returns
  // once every trainer joined.
  absl::Status PostJoin(bool divide_by_initial_world_size);
  // Posts an arbitrary entry (for bad-input tests); rings the doorbell.
  // Advances nothing: the test decides what the entry says.
  absl::Status PostRaw(const ipc::ReadyEvent& e);
  // Wakes the daemon's loop as a post would.
  void RingNodeBell() { node_.ready_bell().Ring(); }

  // Waits for "iteration done" (or, once joined, "all joined") or an
  // error, like gs_wait. The daemon's
  // error comes back with its gradsync code; if `timeout` (see patience.h)
  // passes first the result is UNKNOWN (INTERNAL), never a TIMEOUT the test
  // could mistake for the daemon's.
  absl::Status Wait(absl::Duration timeout);

  uint64_t iteration() const { return iteration_; }
  uint64_t next_sequence() const { return ready_sequence_; }
  const Layout& layout() const { return layout_; }
  uint8_t* arena() const { return segment_.arena(); }
  ipc::TrainerSegment& segment() { return segment_; }

 private:
  InMemoryTrainer() = default;
  absl::Status Post(size_t i, ipc::ReadyKind kind);
  uint8_t* buffer(size_t i) const { return segment_.arena() + offsets_[i]; }

  Layout layout_;
  ipc::NodeSegment node_;
  ipc::TrainerSegment segment_;
  std::vector<uint64_t> offsets_;
  std::vector<uint8_t> marked_, accumulated_;
  bool sync_ = true;
  bool checksum_marks_ = false;
  uint32_t no_sync_iterations_ = 0;  // since the last synced iteration
  uint64_t iteration_ = 0;
  uint64_t ready_sequence_ = 0;
  uint64_t completion_sequence_ = 0;
};

class InMemoryNode {
 public:
  struct Options {
    int local_size = 1;
    int rank_offset = 0;  // global rank of local rank 0 (this node's place)
    BucketCaps caps;
    uint32_t ring_capacity = 64;
  };

  // `tag` names the segments: "gse<pid>_<tag>_<n>.*" under /dev/shm.
  static absl::StatusOr<std::unique_ptr<InMemoryNode>> Create(const std::string& tag,
                                                              const Layout& layout,
                                                              const Options& options);
  ~InMemoryNode();

  const Layout& layout() const { return layout_; }
  const BucketPlan& plan() const { return plan_; }
  const ipc::ArenaLayout& arena() const { return arena_; }
  ipc::Doorbell* ready_bell() { return &node_.ready_bell(); }
  // Daemon side, by local rank, for the Scheduler.
  std::vector<Trainer*> trainers();
  Trainer& daemon_side(int local_rank) { return *trainers_[local_rank]; }
  // Trainer side, by local rank.
  InMemoryTrainer& trainer(int local_rank) { return *ends_[local_rank]; }
  int local_size() const { return static_cast<int>(trainers_.size()); }

 private:
  InMemoryNode() = default;

  Layout layout_;
  BucketPlan plan_;
  ipc::ArenaLayout arena_;
  ipc::NodeSegment node_;
  std::vector<std::unique_ptr<Trainer>> trainers_;
  std::vector<std::unique_ptr<InMemoryTrainer>> ends_;
  std::vector<std::string> names_;
};

// A prefix for segment names unique to this process and call ("gse<pid>_<tag>_<n>").
std::string UniqueShmPrefix(const std::string& tag);
// Names under /dev/shm of the form "<prefix>.*" (what a test left behind).
std::vector<std::string> SegmentsWithPrefix(const std::string& prefix);
// Removes them; returns how many there were.
size_t RemoveSegmentsWithPrefix(const std::string& prefix);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_ENGINE_IN_MEMORY_TRAINERS_H_
