// The pieces of a Chrome trace-event export that both the on-demand trace
// (flight_recorder.h: ToChromeTraceJson) and the streamed whole-run
// timeline (timeline_writer.h) build: track ids, one bucket's timestamps in
// one iteration, and the nested spans drawn from them.
#ifndef GRADSYNC_DAEMON_OBSERVE_CHROME_TRACE_SPANS_H_
#define GRADSYNC_DAEMON_OBSERVE_CHROME_TRACE_SPANS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "daemon/observe/flight_recorder.h"
#include "nlohmann/json.hpp"

namespace gradsync {

// Track ids inside a trace's one process. Trainers come first (tid 1 +
// rank), buckets after (kBucketTidBase + id), both in numeric order.
inline constexpr int64_t kBucketTidBase = int64_t{1} << 24;
inline int64_t TrainerTid(uint32_t rank) { return 1 + static_cast<int64_t>(rank); }
inline int64_t BucketTid(uint32_t bucket) { return kBucketTidBase + static_cast<int64_t>(bucket); }

inline bool IsBucketEvent(TraceEventType t) {
  return t >= TraceEventType::kBucketFirstReady && t <= TraceEventType::kBucketComplete;
}

// The timestamps one bucket saw in one iteration; the first of each type wins.
struct BucketTimes {
  std::optional<int64_t> first_ready, last_ready, launch, local_done, collective_done, complete;
  int64_t earliest = 0;
  int64_t latest = 0;
  bool any = false;

  void Add(const TraceEvent& e);
};

// Builds trace events (nlohmann::json objects) with every time relative to
// `origin_ns`, in microseconds as the format wants.
class TraceBuilder {
 public:
  TraceBuilder(int64_t pid, int64_t origin_ns) : pid_(pid), origin_ns_(origin_ns) {}

  void NameProcess(const std::string& name);
  void NameTrack(int64_t tid, const std::string& name);
  void Complete(int64_t tid, const std::string& name, const char* category, int64_t start_ns,
                int64_t end_ns, nlohmann::json args);
  void Instant(int64_t tid, const std::string& name, const char* category, int64_t at_ns,
               nlohmann::json args);
  // The events built so far (a JSON array); the builder is left empty.
  nlohmann::json Take();

 private:
  const int64_t pid_;
  const int64_t origin_ns_;
  nlohmann::json events_ = nlohmann::json::array();
};

// A kTrainerStraggler event as an instant on the trainer's track.
void AddStragglerMarker(TraceBuilder& trace, const TraceEvent& e);

// Per bucket and iteration, complete events nested in time:
//   bucket <id>                first ready -> completion
//     wait for ready           first ready -> last ready
//     reduce                   launch -> completion
//       local reduce           launch -> local reduce done
//       collective             local reduce done -> collective done
// each with {"bucket", "iteration"} in args. A bucket that never finished
// runs to `trace_end_ns`, marked "incomplete"; one whose start was lost is
// marked "truncated".
void AddBucketSpans(TraceBuilder& trace, uint32_t bucket, uint64_t iteration, const BucketTimes& t,
                    int64_t trace_end_ns, bool multi_node);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_CHROME_TRACE_SPANS_H_
