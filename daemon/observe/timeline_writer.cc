#include "daemon/observe/timeline_writer.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log_value.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

using json = nlohmann::json;

// How often the writer looks at the rings: often enough that a ring of
// kMinRingEvents does not wrap under it, rarely enough to cost nothing.
constexpr absl::Duration kPollInterval = absl::Milliseconds(2);

// Buckets whose completion was lost (the ring wrapped) would stay open for
// ever; past this many, the oldest are written as incomplete.
constexpr size_t kMaxOpenBuckets = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<TimelineWriter>> TimelineWriter::Open(const std::string& path,
                                                                     int node_rank) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat("--trace-file ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<TimelineWriter>(new TimelineWriter(path, file, node_rank));
}

TimelineWriter::TimelineWriter(std::string path, std::FILE* file, int node_rank)
    : path_(std::move(path)), node_rank_(node_rank), origin_ns_(MonotonicNowNs()), file_(file) {
  // Unbuffered: each pass's events go out in one write(2), whole lines
  // only, so a killed daemon leaves no half event behind.
  std::setvbuf(file_, nullptr, _IONBF, 0);
  MonotonicMutexLock lock(&mu_);
  std::fputs("[", file_);
  // pid 0 means "no process" to some viewers: number nodes from 1.
  TraceBuilder trace(node_rank_ + 1, origin_ns_);
  trace.NameProcess(absl::StrCat("gradsyncd node ", node_rank_));
  AppendLocked(trace.Take());
  thread_ = std::thread([this] { Run(); });
}

TimelineWriter::~TimelineWriter() {
  {
    MonotonicMutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  MonotonicMutexLock lock(&mu_);
  for (auto& f : followed_) DrainLocked(*f, /*final=*/true);
  followed_.clear();
  TraceBuilder trace(node_rank_ + 1, origin_ns_);
  trace.Instant(0, "timeline end", "timeline", MonotonicNowNs(), {{"events_lost", lost_}});
  AppendLocked(trace.Take());
  std::fputs("\n]\n", file_);
  if (std::fclose(file_) != 0 && !write_failed_) {
    spdlog::error("event=timeline_write_failed path={} error={}", LogToken(path_),
                  LogValue(std::strerror(errno)));
  }
}

void TimelineWriter::Follow(const FlightRecorder* recorder, TimelineSource source) {
  auto f = std::make_unique<Followed>();
  f->recorder = recorder;
  f->source = std::move(source);
  f->cursor = recorder->recorded();
  MonotonicMutexLock lock(&mu_);
  followed_.push_back(std::move(f));
}

void TimelineWriter::Unfollow(const FlightRecorder* recorder) {
  MonotonicMutexLock lock(&mu_);
  for (auto it = followed_.begin(); it != followed_.end(); ++it) {
    if ((*it)->recorder != recorder) continue;
    DrainLocked(**it, /*final=*/true);
    followed_.erase(it);
    return;
  }
}

void TimelineWriter::Run() {
  MonotonicMutexLock lock(&mu_);
  while (!stop_) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), kPollInterval);
    for (auto& f : followed_) DrainLocked(*f, /*final=*/false);
  }
}

void TimelineWriter::NameTrackOnceLocked(TraceBuilder& trace, int64_t tid,
                                         const std::string& name) {
  if (named_tracks_.insert(tid).second) trace.NameTrack(tid, name);
}

void TimelineWriter::DrainLocked(Followed& f, bool final) {
  f.batch.clear();
  const FlightRecorder::Tail tail = f.recorder->ReadFrom(f.cursor, &f.batch);
  f.cursor = tail.next;
  TraceBuilder trace(node_rank_ + 1, origin_ns_);
  if (tail.lost > 0) {
    lost_ += tail.lost;
    spdlog::warn("event=timeline_lost_events job={} lost={} path={}", LogToken(f.source.job_id),
                 tail.lost, LogToken(path_));
    trace.Instant(0, "timeline lost events", "timeline", MonotonicNowNs(), {{"lost", tail.lost}});
  }
  const bool multi_node = f.source.num_nodes > 1;
  for (const TraceEvent& e : f.batch) {
    if (IsBucketEvent(e.type)) {
      BucketTimes& times = f.open[{e.id, e.iteration}];
      times.Add(e);
      if (e.type != TraceEventType::kBucketComplete) continue;
      NameTrackOnceLocked(trace, BucketTid(e.id), absl::StrCat("bucket ", e.id));
      AddBucketSpans(trace, e.id, e.iteration, times, e.timestamp_ns, multi_node);
      f.open.erase({e.id, e.iteration});
    } else if (e.type == TraceEventType::kTrainerStraggler) {
      NameTrackOnceLocked(trace, TrainerTid(e.id), absl::StrCat("trainer ", e.id));
      AddStragglerMarker(trace, e);
    } else {
      NameTrackOnceLocked(trace, TrainerTid(e.id), absl::StrCat("trainer ", e.id));
      const char* verb = e.type == TraceEventType::kTrainerReady ? "ready " : "unused ";
      const std::string tensor = e.tensor < f.source.tensor_names.size()
                                     ? f.source.tensor_names[e.tensor]
                                     : absl::StrCat("#", e.tensor);
      trace.Instant(TrainerTid(e.id), absl::StrCat(verb, tensor), "trainer", e.timestamp_ns,
                    {{"iteration", e.iteration}, {"tensor", e.tensor}});
    }
  }
  // Buckets that will not complete: the job ended, or their end was lost.
  const int64_t now = MonotonicNowNs();
  while (!f.open.empty() && (final || f.open.size() > kMaxOpenBuckets)) {
    auto oldest = f.open.begin();
    for (auto it = f.open.begin(); it != f.open.end(); ++it) {
      if (it->first.second < oldest->first.second) oldest = it;
    }
    const auto [bucket, iteration] = oldest->first;
    NameTrackOnceLocked(trace, BucketTid(bucket), absl::StrCat("bucket ", bucket));
    AddBucketSpans(trace, bucket, iteration, oldest->second, now, multi_node);
    f.open.erase(oldest);
  }
  AppendLocked(trace.Take());
}

void TimelineWriter::AppendLocked(const json& events) {
  if (write_failed_) return;
  std::string text;
  for (const json& e : events) {
    text += first_event_ ? "\n" : ",\n";
    first_event_ = false;
    // Invalid UTF-8 in a job id or tensor name must not stop the timeline.
    text += e.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (text.empty()) return;
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size()) {
    write_failed_ = true;
    spdlog::error("event=timeline_write_failed path={} error={}", LogToken(path_),
                  LogValue(std::strerror(errno)));
  }
}

}  // namespace gradsync
