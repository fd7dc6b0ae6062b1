// FlightRecorder: a fixed-size in-memory ring of the daemon's most recent
// scheduling events, exported as Chrome trace-event JSON (Perfetto,
// chrome://tracing) on demand (Control.GetTrace) and written to a file when
// an iteration times out or stalls.
//
// Per bucket and iteration the scheduler records first ready, last ready,
// launch, local reduce done, collective done and completion; per trainer,
// every ready (or unused) mark. The ring is allocated once: Record() is a
// handful of relaxed atomic stores, never allocates and never waits for a
// reader, so it may sit on the hot path. When full it overwrites the oldest
// events, keeping roughly the last N iterations (see CapacityFor).
//
// Thread safety: Record() may be called from any thread (writers serialize
// on a tiny spinlock; the scheduler is normally the only one). Snapshot() may
// be called from any thread at any time and never blocks writers: each slot
// carries a sequence number (a seqlock); a slot rewritten while it is being
// copied is left out (with everything older) rather than returned torn, so
// a snapshot is always an intact, contiguous run of the newest events.
#ifndef GRADSYNC_DAEMON_OBSERVE_FLIGHT_RECORDER_H_
#define GRADSYNC_DAEMON_OBSERVE_FLIGHT_RECORDER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "common/monotonic.h"

namespace gradsync {

enum class TraceEventType : uint8_t {
  // Bucket events: `id` is the bucket id, `tensor` is kNoTensor.
  kBucketFirstReady = 1,  // the first gradient of the bucket marked (any local trainer)
  kBucketLastReady = 2,   // every gradient marked on every local trainer
  kBucketLaunch = 3,      // the local reduction starts (plan order allows it)
  kBucketLocalReduceDone = 4,
  kBucketCollectiveDone = 5,  // the cross-node step finished (multi-node only)
  kBucketComplete = 6,        // written back; completion posted to trainers
  // Trainer events: `id` is the trainer's global rank, `tensor` its index.
  kTrainerReady = 7,
  kTrainerUnused = 8,
  // A trainer named a straggler (StragglerTracker, with its log line):
  // `id` is its global rank, `tensor` kNoTensor.
  kTrainerStraggler = 9,
};

inline constexpr uint32_t kNoTensor = 0xffffffffu;

// One event. A POD copied into the ring as four 64-bit words.
struct TraceEvent {
  int64_t timestamp_ns;  // MonotonicNowNs() (common/monotonic.h), the only clock allowed here
  uint64_t iteration;    // the daemon's synced-iteration counter
  uint32_t id;           // bucket id or trainer rank, per `type`
  uint32_t tensor;       // trainer events: registration index; else kNoTensor
  TraceEventType type;
};
static_assert(std::is_trivially_copyable_v<TraceEvent>);
static_assert(sizeof(TraceEvent) == 32, "four words per ring slot");

// What a snapshot holds: events oldest first.
struct TraceSnapshot {
  std::vector<TraceEvent> events;
  uint64_t recorded = 0;     // events ever recorded
  uint64_t overwritten = 0;  // of those, not in `events`: lost to the ring wrapping
};

// Context printed into the trace (Perfetto shows it under "metadata").
struct TraceMetadata {
  int node_rank = 0;
  int num_nodes = 1;  // > 1: a bucket stuck after its local reduce is in its collective
  std::string job_id;
  std::string reason;  // e.g. "GetTrace", "stall: bucket 3 of iteration 17"
  // Where spans of unfinished buckets end; 0: the latest event's timestamp.
  int64_t end_ns = 0;
  // Optional: registration index -> tensor name, for the ready marks.
  std::vector<std::string> tensor_names;
};

class FlightRecorder {
 public:
  // Ring size for `iterations` iterations of a plan with `buckets` buckets
  // and `tensors` tensors on `local_trainers` trainers.
  static size_t CapacityFor(size_t iterations, size_t buckets, size_t tensors,
                            size_t local_trainers);

  // Allocates the ring: `capacity_events` rounded up to a power of two (>= 2).
  explicit FlightRecorder(size_t capacity_events);

  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Appends one event, overwriting the oldest when full. Never allocates.
  void Record(const TraceEvent& event);
  void Record(TraceEventType type, uint64_t iteration, uint32_t id, uint32_t tensor = kNoTensor) {
    Record(TraceEvent{MonotonicNowNs(), iteration, id, tensor, type});
  }

  // Copies out the events currently in the ring, oldest first.
  TraceSnapshot Snapshot() const;

  // Tails the ring: appends to `out` the events recorded since ticket
  // `from` (an earlier call's `next`; 0 at the start), oldest first. Events
  // the ring overwrote before they were read are counted in `lost`. Never
  // blocks writers; allocates only when `out` grows.
  struct Tail {
    uint64_t next = 0;  // pass as `from` next time
    uint64_t lost = 0;
  };
  Tail ReadFrom(uint64_t from, std::vector<TraceEvent>* out) const;

  // Snapshot -> ToChromeTraceJson -> `path` (written to a temporary file
  // beside it, then renamed, so readers never see half a trace).
  absl::Status WriteTraceFile(const std::string& path, const TraceMetadata& metadata) const;

  size_t capacity() const { return capacity_; }
  uint64_t recorded() const { return head_.load(std::memory_order_acquire); }

 private:
  // Copies slot `ticket` into *e; false if the writer lapped it meanwhile.
  bool ReadSlot(uint64_t ticket, TraceEvent* e) const;
  static constexpr size_t kWords = sizeof(TraceEvent) / sizeof(uint64_t);

  // seq == 2 * ticket + 2 once event `ticket` is fully written; odd while a
  // write is in progress.
  struct Slot {
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> words[kWords];
  };

  const size_t capacity_;  // a power of two
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> head_{0};  // events recorded = next ticket
  std::atomic_flag writer_lock_ = ATOMIC_FLAG_INIT;
};

// Chrome trace-event JSON ("JSON object format") for a snapshot, built with
// nlohmann::json. Layout: one process (the node); per trainer a track
// "trainer <rank>" of instant events (its ready / unused marks); per bucket
// a track "bucket <id>" with, per iteration, complete events nested in time:
//   bucket <id>                first ready -> completion (stats' "total")
//     wait for ready           first ready -> last ready
//     reduce                   launch -> completion
//       local reduce           launch -> local reduce done
//       collective             local reduce done -> collective done
// Buckets get a track each because their spans overlap in time (bucket b+1
// fills while b reduces), which one shared track could not show nested.
// A bucket the snapshot saw start but not finish (a stall) gets spans up to
// metadata.end_ns, marked "incomplete"; child spans are clamped into their
// parent so the nesting holds even for odd timestamps.
std::string ToChromeTraceJson(const TraceSnapshot& snapshot, const TraceMetadata& metadata);

// Writes `contents` to `path` via a temporary file and rename(2).
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_FLIGHT_RECORDER_H_
