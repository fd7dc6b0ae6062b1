#include "daemon/observe/flight_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/observe/chrome_trace_spans.h"
#include "nlohmann/json.hpp"

namespace gradsync {
namespace {

using json = nlohmann::json;

size_t RoundUpToPowerOfTwo(size_t n) {
  size_t p = 2;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

size_t FlightRecorder::CapacityFor(size_t iterations, size_t buckets, size_t tensors,
                                   size_t local_trainers) {
  // Six bucket events, plus one mark per tensor per trainer, per iteration.
  return std::max<size_t>(iterations, 1) * (6 * buckets + tensors * local_trainers);
}

FlightRecorder::FlightRecorder(size_t capacity_events)
    : capacity_(RoundUpToPowerOfTwo(capacity_events)), slots_(new Slot[capacity_]) {}

void FlightRecorder::Record(const TraceEvent& event) {
  while (writer_lock_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
  const uint64_t ticket = head_.load(std::memory_order_relaxed);
  Slot& slot = slots_[ticket & (capacity_ - 1)];
  uint64_t words[kWords];
  std::memcpy(words, &event, sizeof(words));
  // Seqlock write: odd sequence, then the data, then the final sequence.
  slot.seq.store(2 * ticket + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  for (size_t i = 0; i < kWords; ++i) slot.words[i].store(words[i], std::memory_order_relaxed);
  slot.seq.store(2 * ticket + 2, std::memory_order_release);
  head_.store(ticket + 1, std::memory_order_release);
  writer_lock_.clear(std::memory_order_release);
}

bool FlightRecorder::ReadSlot(uint64_t ticket, TraceEvent* e) const {
  // Seqlock read: the slot holds `ticket` (2 * ticket + 2) before and after
  // the copy, else the writer lapped this reader here.
  const Slot& slot = slots_[ticket & (capacity_ - 1)];
  const uint64_t expected = 2 * ticket + 2;
  if (slot.seq.load(std::memory_order_acquire) != expected) return false;
  uint64_t words[kWords];
  for (size_t i = 0; i < kWords; ++i) words[i] = slot.words[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (slot.seq.load(std::memory_order_relaxed) != expected) return false;
  std::memcpy(e, words, sizeof(*e));
  return true;
}

TraceSnapshot FlightRecorder::Snapshot() const {
  TraceSnapshot snap;
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t first = head > capacity_ ? head - capacity_ : 0;
  snap.events.reserve(static_cast<size_t>(head - first));
  for (uint64_t ticket = first; ticket < head; ++ticket) {
    TraceEvent e;
    const bool intact = ReadSlot(ticket, &e);
    if (!intact) {
      // The writer lapped us here: this and everything older is being
      // overwritten. Keep only what follows, so the snapshot stays a
      // contiguous run of the most recent events.
      snap.events.clear();
      continue;
    }
    snap.events.push_back(e);
  }
  snap.recorded = head;
  snap.overwritten = head - snap.events.size();
  return snap;
}

FlightRecorder::Tail FlightRecorder::ReadFrom(uint64_t from, std::vector<TraceEvent>* out) const {
  Tail tail;
  const uint64_t head = head_.load(std::memory_order_acquire);
  const uint64_t oldest = head > capacity_ ? head - capacity_ : 0;
  if (from < oldest) {
    tail.lost = oldest - from;
    from = oldest;
  }
  for (uint64_t ticket = from; ticket < head; ++ticket) {
    TraceEvent e;
    const bool intact = ReadSlot(ticket, &e);
    // Lapped while we read: this event is gone (what was copied before it
    // was intact when copied, so it stays).
    if (!intact) {
      ++tail.lost;
      continue;
    }
    out->push_back(e);
  }
  tail.next = std::max(head, from);
  return tail;
}

absl::Status FlightRecorder::WriteTraceFile(const std::string& path,
                                            const TraceMetadata& metadata) const {
  return WriteFileAtomically(path, ToChromeTraceJson(Snapshot(), metadata));
}

std::string ToChromeTraceJson(const TraceSnapshot& snapshot, const TraceMetadata& metadata) {
  int64_t origin_ns = 0;
  int64_t latest_ns = 0;
  if (!snapshot.events.empty()) {
    auto [lo, hi] = std::minmax_element(
        snapshot.events.begin(), snapshot.events.end(),
        [](const TraceEvent& a, const TraceEvent& b) { return a.timestamp_ns < b.timestamp_ns; });
    origin_ns = lo->timestamp_ns;
    latest_ns = hi->timestamp_ns;
  }
  const int64_t end_ns = metadata.end_ns != 0 ? std::max(metadata.end_ns, origin_ns) : latest_ns;

  // pid 0 means "no process" to some viewers: number nodes from 1.
  TraceBuilder trace(metadata.node_rank + 1, origin_ns);
  trace.NameProcess(absl::StrCat("gradsyncd node ", metadata.node_rank));

  std::set<uint32_t> trainers;
  std::map<std::pair<uint32_t, uint64_t>, BucketTimes> buckets;  // (bucket, iteration)
  for (const TraceEvent& e : snapshot.events) {
    if (IsBucketEvent(e.type)) {
      buckets[{e.id, e.iteration}].Add(e);
    } else if (e.type == TraceEventType::kTrainerReady ||
               e.type == TraceEventType::kTrainerUnused ||
               e.type == TraceEventType::kTrainerStraggler) {
      trainers.insert(e.id);
    }
  }
  for (uint32_t rank : trainers) trace.NameTrack(TrainerTid(rank), absl::StrCat("trainer ", rank));
  std::set<uint32_t> bucket_ids;
  for (const auto& [key, times] : buckets) bucket_ids.insert(key.first);
  for (uint32_t id : bucket_ids) trace.NameTrack(BucketTid(id), absl::StrCat("bucket ", id));

  for (const TraceEvent& e : snapshot.events) {
    if (e.type == TraceEventType::kTrainerStraggler) {
      AddStragglerMarker(trace, e);
      continue;
    }
    if (e.type != TraceEventType::kTrainerReady && e.type != TraceEventType::kTrainerUnused) {
      continue;
    }
    const char* verb = e.type == TraceEventType::kTrainerReady ? "ready " : "unused ";
    const std::string tensor = e.tensor < metadata.tensor_names.size()
                                   ? metadata.tensor_names[e.tensor]
                                   : absl::StrCat("#", e.tensor);
    trace.Instant(TrainerTid(e.id), absl::StrCat(verb, tensor), "trainer", e.timestamp_ns,
                  {{"iteration", e.iteration}, {"tensor", e.tensor}});
  }
  for (const auto& [key, times] : buckets) {
    AddBucketSpans(trace, key.first, key.second, times, end_ns, metadata.num_nodes > 1);
  }

  json doc = {{"traceEvents", trace.Take()},
              {"otherData",
               {{"generator", "gradsyncd"},
                {"node_rank", metadata.node_rank},
                {"job_id", metadata.job_id},
                {"reason", metadata.reason},
                {"events_recorded", snapshot.recorded},
                {"events_overwritten", snapshot.overwritten},
                {"steady_clock_origin_ns", origin_ns}}}};
  // Invalid UTF-8 in a job id or tensor name must not abort the export.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  // Captures errno first: the clean-up calls may overwrite it.
  auto fail = [&tmp](const std::string& what) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat(what, ": ", std::strerror(err)));
  };
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return fail(absl::StrCat("cannot create ", tmp));
  const bool written = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size() &&
                       std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  if (!written) {
    const int err = errno;
    std::fclose(f);
    errno = err;
    return fail(absl::StrCat("cannot write ", tmp));
  }
  if (std::fclose(f) != 0) return fail(absl::StrCat("cannot write ", tmp));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return fail(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
