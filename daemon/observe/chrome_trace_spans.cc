#include "daemon/observe/chrome_trace_spans.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync {

using json = nlohmann::json;

namespace {

// The format's unit is the microsecond; fractions keep nanoseconds.
double Us(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

// A span clamped into [lo, hi], so children nest even for odd timestamps.
std::pair<int64_t, int64_t> Clamp(int64_t start, int64_t end, int64_t lo, int64_t hi) {
  start = std::clamp(start, lo, hi);
  end = std::clamp(end, start, hi);
  return {start, end};
}

}  // namespace

void BucketTimes::Add(const TraceEvent& e) {
  std::optional<int64_t>* slot = nullptr;
  switch (e.type) {
    case TraceEventType::kBucketFirstReady:
      slot = &first_ready;
      break;
    case TraceEventType::kBucketLastReady:
      slot = &last_ready;
      break;
    case TraceEventType::kBucketLaunch:
      slot = &launch;
      break;
    case TraceEventType::kBucketLocalReduceDone:
      slot = &local_done;
      break;
    case TraceEventType::kBucketCollectiveDone:
      slot = &collective_done;
      break;
    case TraceEventType::kBucketComplete:
      slot = &complete;
      break;
    default:
      return;
  }
  if (!slot->has_value()) *slot = e.timestamp_ns;
  earliest = any ? std::min(earliest, e.timestamp_ns) : e.timestamp_ns;
  latest = any ? std::max(latest, e.timestamp_ns) : e.timestamp_ns;
  any = true;
}

void TraceBuilder::NameProcess(const std::string& name) {
  events_.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", pid_}, {"args", {{"name", name}}}});
}

void TraceBuilder::NameTrack(int64_t tid, const std::string& name) {
  events_.push_back({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", pid_},
                     {"tid", tid},
                     {"args", {{"name", name}}}});
  events_.push_back({{"name", "thread_sort_index"},
                     {"ph", "M"},
                     {"pid", pid_},
                     {"tid", tid},
                     {"args", {{"sort_index", tid}}}});
}

void TraceBuilder::Complete(int64_t tid, const std::string& name, const char* category,
                            int64_t start_ns, int64_t end_ns, json args) {
  events_.push_back({{"name", name},
                     {"cat", category},
                     {"ph", "X"},
                     {"pid", pid_},
                     {"tid", tid},
                     {"ts", Us(start_ns - origin_ns_)},
                     {"dur", Us(end_ns - start_ns)},
                     {"args", std::move(args)}});
}

void TraceBuilder::Instant(int64_t tid, const std::string& name, const char* category,
                           int64_t at_ns, json args) {
  events_.push_back({{"name", name},
                     {"cat", category},
                     {"ph", "i"},
                     {"s", "t"},
                     {"pid", pid_},
                     {"tid", tid},
                     {"ts", Us(at_ns - origin_ns_)},
                     {"args", std::move(args)}});
}

json TraceBuilder::Take() {
  json taken = std::move(events_);
  events_ = json::array();
  return taken;
}

void AddStragglerMarker(TraceBuilder& trace, const TraceEvent& e) {
  trace.Instant(TrainerTid(e.id), "straggler", "straggler", e.timestamp_ns,
                {{"iteration", e.iteration},
                 {"rank", e.id},
                 {"see", "gradsyncctl stragglers (last of the job most of the window)"}});
}

void AddBucketSpans(TraceBuilder& trace, uint32_t bucket, uint64_t iteration, const BucketTimes& t,
                    int64_t trace_end_ns, bool multi_node) {
  // The parent: first ready -> completion. If the ring lost the start, the
  // earliest surviving event stands in; if the bucket never finished (a
  // stall, or still in flight), the span runs to the end of the trace.
  const bool truncated = !t.first_ready.has_value();
  const bool incomplete = !t.complete.has_value();
  const int64_t start = t.first_ready.value_or(t.earliest);
  const int64_t end = std::max(start, incomplete ? std::max(trace_end_ns, t.latest) : *t.complete);

  auto args = [&](bool open) {
    json a = {{"bucket", bucket}, {"iteration", iteration}};
    if (open) a["incomplete"] = true;
    return a;
  };
  json parent_args = args(incomplete);
  if (truncated) parent_args["truncated"] = true;
  trace.Complete(BucketTid(bucket), absl::StrCat("bucket ", bucket), "bucket", start, end,
                 std::move(parent_args));

  // Siblings follow each other: each starts no earlier than the previous ends.
  int64_t cursor = start;
  if (t.first_ready) {
    auto [s, e] = Clamp(*t.first_ready, t.last_ready.value_or(end), cursor, end);
    trace.Complete(BucketTid(bucket), "wait for ready", "bucket", s, e, args(!t.last_ready));
    cursor = e;
  }
  if (!t.launch) return;
  auto [reduce_start, reduce_end] = Clamp(*t.launch, end, cursor, end);
  trace.Complete(BucketTid(bucket), "reduce", "bucket", reduce_start, reduce_end, args(incomplete));

  auto [local_start, local_end] =
      Clamp(reduce_start, t.local_done.value_or(reduce_end), reduce_start, reduce_end);
  trace.Complete(BucketTid(bucket), "local reduce", "bucket", local_start, local_end,
                 args(!t.local_done));
  // The cross-node step: recorded when it finished, or in flight on a
  // multi-node job whose bucket is stuck after the local reduction.
  const bool collective_open = multi_node && t.local_done && !t.collective_done && incomplete;
  if (t.collective_done || collective_open) {
    auto [s, e] = Clamp(local_end, t.collective_done.value_or(reduce_end), local_end, reduce_end);
    trace.Complete(BucketTid(bucket), "collective", "bucket", s, e, args(collective_open));
  }
}

}  // namespace gradsync
