// TimelineWriter: the whole-run timeline (--trace-file PATH, like
// HOROVOD_TIMELINE). A background thread tails each running job's flight
// recorder (FlightRecorder::ReadFrom) and appends its events to PATH as
// Chrome trace events in the JSON Array Format: "[" then one event per
// line. The scheduler only ever writes the ring (no allocation, no disk);
// this thread does the JSON and the I/O.
//
// The file is valid JSON once the writer is destroyed (the "]" is written
// then); if the daemon is killed, the array simply lacks its "]", which
// chrome://tracing and Perfetto accept. Every line is written whole, so at
// most the last event of a killed daemon is cut.
//
// Per bucket and iteration the timeline holds the nested spans of
// chrome_trace_spans.h (written when the bucket completes); per trainer
// its ready / unused marks. If this thread falls a whole ring behind the
// scheduler, the events it missed are counted and the count written into
// the timeline ("timeline lost events") and the log.
#ifndef GRADSYNC_DAEMON_OBSERVE_TIMELINE_WRITER_H_
#define GRADSYNC_DAEMON_OBSERVE_TIMELINE_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/monotonic_mutex.h"
#include "daemon/observe/chrome_trace_spans.h"
#include "daemon/observe/flight_recorder.h"

namespace gradsync {

// What the timeline needs to know about a followed job.
struct TimelineSource {
  std::string job_id;
  int num_nodes = 1;
  std::vector<std::string> tensor_names;  // registration index -> name
};

class TimelineWriter {
 public:
  // A followed job's ring holds at least this many events (512 KiB), so the
  // writer may lag the scheduler by hundreds of iterations of a small model
  // without losing any. Not more: GetTrace sends the whole ring as JSON in
  // one gRPC message (4 MiB by default; 65536 events need ~7 MiB).
  static constexpr size_t kMinRingEvents = size_t{1} << 14;

  // Creates (truncates) `path` and starts the writer thread.
  static absl::StatusOr<std::unique_ptr<TimelineWriter>> Open(const std::string& path,
                                                              int node_rank);
  // Writes what every followed recorder still holds, closes the array.
  ~TimelineWriter();

  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  // Streams `recorder`'s events from now on. `recorder` must outlive the
  // matching Unfollow.
  void Follow(const FlightRecorder* recorder, TimelineSource source) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes what `recorder` still holds (buckets in flight as "incomplete"
  // spans) and stops following it.
  void Unfollow(const FlightRecorder* recorder) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }

 private:
  struct Followed {
    const FlightRecorder* recorder;
    TimelineSource source;
    uint64_t cursor = 0;
    // Buckets seen start but not complete: (bucket, iteration) -> times.
    std::map<std::pair<uint32_t, uint64_t>, BucketTimes> open;
    std::vector<TraceEvent> batch;  // reused between drains
  };

  TimelineWriter(std::string path, std::FILE* file, int node_rank);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads `f`'s new events and appends them; `final`: flush open buckets.
  void DrainLocked(Followed& f, bool final) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AppendLocked(const nlohmann::json& events) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NameTrackOnceLocked(TraceBuilder& trace, int64_t tid, const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int node_rank_;
  const int64_t origin_ns_;  // ts 0 of the timeline: when it was opened

  MonotonicMutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);
  bool first_event_ ABSL_GUARDED_BY(mu_) = true;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t lost_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int64_t> named_tracks_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Followed>> followed_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_TIMELINE_WRITER_H_
