// FlightRecorder: the ring (order, overwrite, concurrent snapshots) and its
// Chrome trace-event export (parses, one span per bucket and iteration,
// spans nest, tracks are named, stalls and truncation are shown).
#include "daemon/observe/flight_recorder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/observe/chrome_trace_spans.h"
#include "nlohmann/json.hpp"

namespace gradsync {
namespace {

using json = nlohmann::json;
using T = TraceEventType;

// One bucket's phases, as offsets (ns) from its first ready mark.
constexpr int64_t kLastReady = 80, kLaunch = 90, kLocalDone = 120, kCollDone = 150, kComplete = 160;
constexpr int64_t kBucketStride = 100;  // bucket b+1 fills while b reduces
constexpr int64_t kIterationStride = 10'000;

// Events of `iterations` synthetic iterations, in time order, the way the
// scheduler would record them: every trainer marks every tensor of a
// bucket between its first and last ready, buckets overlap in time.
std::vector<TraceEvent> MakeIterations(uint64_t first_iteration, int iterations, int buckets,
                                       int trainers, int tensors_per_bucket, bool multi_node) {
  std::vector<TraceEvent> events;
  for (int i = 0; i < iterations; ++i) {
    const uint64_t it = first_iteration + i;
    const int64_t base = 1'000'000 + static_cast<int64_t>(it) * kIterationStride;
    for (int b = 0; b < buckets; ++b) {
      const int64_t t0 = base + b * kBucketStride;
      const uint32_t id = static_cast<uint32_t>(b);
      events.push_back({t0, it, id, kNoTensor, T::kBucketFirstReady});
      for (int r = 0; r < trainers; ++r) {
        for (int k = 0; k < tensors_per_bucket; ++k) {
          const uint32_t tensor = static_cast<uint32_t>(b * tensors_per_bucket + k);
          events.push_back({t0 + 1 + r * 10 + k, it, static_cast<uint32_t>(r), tensor,
                            k == 0 && r == 1 ? T::kTrainerUnused : T::kTrainerReady});
        }
      }
      events.push_back({t0 + kLastReady, it, id, kNoTensor, T::kBucketLastReady});
      events.push_back({t0 + kLaunch, it, id, kNoTensor, T::kBucketLaunch});
      events.push_back({t0 + kLocalDone, it, id, kNoTensor, T::kBucketLocalReduceDone});
      if (multi_node)
        events.push_back({t0 + kCollDone, it, id, kNoTensor, T::kBucketCollectiveDone});
      events.push_back({t0 + kComplete, it, id, kNoTensor, T::kBucketComplete});
    }
  }
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.timestamp_ns < b.timestamp_ns;
  });
  return events;
}

json Export(const FlightRecorder& r, TraceMetadata meta = {}) {
  const std::string text = ToChromeTraceJson(r.Snapshot(), meta);
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(doc.is_discarded()) << text.substr(0, 500);
  return doc;
}

int64_t Ns(const json& us) { return std::llround(us.get<double>() * 1000); }

struct Span {
  std::string name;
  int64_t tid, start, end;
  json args;
};

std::vector<Span> Spans(const json& doc) {
  std::vector<Span> spans;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<double>(), 0) << e.dump();
    spans.push_back({e["name"], e["tid"], Ns(e["ts"]), Ns(e["ts"]) + Ns(e["dur"]), e["args"]});
  }
  return spans;
}

// Every track's complete events form a proper tree: two spans on one track
// are either disjoint or one contains the other (what Perfetto needs).
void ExpectProperlyNested(const std::vector<Span>& spans) {
  std::map<int64_t, std::vector<const Span*>> by_tid;
  for (const Span& s : spans) by_tid[s.tid].push_back(&s);
  for (auto& [tid, list] : by_tid) {
    std::stable_sort(list.begin(), list.end(), [](const Span* a, const Span* b) {
      return std::tie(a->start, b->end) < std::tie(b->start, a->end);  // parents first
    });
    std::vector<const Span*> open;
    for (const Span* s : list) {
      while (!open.empty() && open.back()->end <= s->start && open.back()->end < s->end) {
        open.pop_back();
      }
      if (!open.empty()) {
        EXPECT_GE(s->start, open.back()->start) << s->name << " in " << open.back()->name;
        EXPECT_LE(s->end, open.back()->end)
            << "track " << tid << ": " << s->name << " " << s->args.dump()
            << " overlaps its parent " << open.back()->name << " " << open.back()->args.dump();
      }
      open.push_back(s);
    }
  }
}

std::map<int64_t, std::string> TrackNames(const json& doc) {
  std::map<int64_t, std::string> names;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
  }
  return names;
}

// (bucket, iteration) -> the spans of that bucket instance, by name.
std::map<std::pair<uint32_t, uint64_t>, std::map<std::string, Span>> ByBucket(
    const std::vector<Span>& spans) {
  std::map<std::pair<uint32_t, uint64_t>, std::map<std::string, Span>> out;
  for (const Span& s : spans) {
    out[{s.args["bucket"].get<uint32_t>(), s.args["iteration"].get<uint64_t>()}][s.name] = s;
  }
  return out;
}

void ExpectInside(const Span& child, const Span& parent) {
  EXPECT_GE(child.start, parent.start) << child.name << " starts before " << parent.name;
  EXPECT_LE(child.end, parent.end) << child.name << " ends after " << parent.name;
  EXPECT_EQ(child.tid, parent.tid);
}

TEST(FlightRecorder, AStragglerIsAnInstantOnItsTrainersTrack) {
  FlightRecorder r(64);
  for (const TraceEvent& e : MakeIterations(0, 1, 1, 2, 1, false)) r.Record(e);
  r.Record({2'000'000, 7, 1, kNoTensor, T::kTrainerStraggler});
  const json doc = Export(r);
  int markers = 0;
  for (const json& e : doc["traceEvents"]) {
    if (e.value("name", "") != "straggler") continue;
    ++markers;
    EXPECT_EQ(e["ph"], "i");
    EXPECT_EQ(e["tid"], TrainerTid(1));
    EXPECT_EQ(e["args"]["iteration"], 7);
    EXPECT_EQ(e["args"]["rank"], 1);
  }
  EXPECT_EQ(markers, 1) << doc.dump(1);
}

TEST(FlightRecorder, CapacityRoundsUpToPowerOfTwo) {
  EXPECT_EQ(FlightRecorder(5).capacity(), 8u);
  EXPECT_EQ(FlightRecorder(1024).capacity(), 1024u);
  EXPECT_EQ(FlightRecorder(0).capacity(), 2u);
  EXPECT_EQ(FlightRecorder::CapacityFor(10, 4, 100, 2), 10u * (6 * 4 + 100 * 2));
}

TEST(FlightRecorder, SnapshotKeepsRecordOrder) {
  FlightRecorder r(64);
  for (uint32_t i = 0; i < 10; ++i) r.Record({100 + i, i, i, kNoTensor, T::kBucketLaunch});
  const TraceSnapshot snap = r.Snapshot();
  ASSERT_EQ(snap.events.size(), 10u);
  EXPECT_EQ(snap.recorded, 10u);
  EXPECT_EQ(snap.overwritten, 0u);
  for (uint32_t i = 0; i < 10; ++i) {
    EXPECT_EQ(snap.events[i].iteration, i);
    EXPECT_EQ(snap.events[i].timestamp_ns, 100 + i);
    EXPECT_EQ(snap.events[i].type, T::kBucketLaunch);
  }
}

TEST(FlightRecorder, RingOverwritesOldestWhenFull) {
  FlightRecorder r(8);
  for (uint32_t i = 0; i < 20; ++i) r.Record({i, i, 0, kNoTensor, T::kBucketLaunch});
  const TraceSnapshot snap = r.Snapshot();
  ASSERT_EQ(snap.events.size(), 8u);
  EXPECT_EQ(snap.recorded, 20u);
  EXPECT_EQ(snap.overwritten, 12u);
  for (size_t k = 0; k < 8; ++k) EXPECT_EQ(snap.events[k].iteration, 12 + k);
}

TEST(FlightRecorder, ReadFromTailsNewEventsAndCountsWhatTheRingLost) {
  FlightRecorder recorder(8);
  auto record = [&](uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; ++i) {
      recorder.Record({static_cast<int64_t>(i), i, 0, kNoTensor, T::kBucketLaunch});
    }
  };
  auto iterations = [](const std::vector<TraceEvent>& events) {
    std::vector<uint64_t> out;
    for (const TraceEvent& e : events) out.push_back(e.iteration);
    return out;
  };
  record(0, 5);
  std::vector<TraceEvent> got;
  FlightRecorder::Tail tail = recorder.ReadFrom(0, &got);
  EXPECT_EQ(iterations(got), (std::vector<uint64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(tail.next, 5u);
  EXPECT_EQ(tail.lost, 0u);

  got.clear();
  tail = recorder.ReadFrom(tail.next, &got);
  EXPECT_TRUE(got.empty()) << "nothing new";
  EXPECT_EQ(tail.next, 5u);

  record(5, 28);  // the reader falls behind: 5..19 are overwritten
  tail = recorder.ReadFrom(tail.next, &got);
  EXPECT_EQ(iterations(got), (std::vector<uint64_t>{20, 21, 22, 23, 24, 25, 26, 27}));
  EXPECT_EQ(tail.lost, 15u);
  EXPECT_EQ(tail.next, 28u);
}

TEST(FlightRecorder, RecordNowUsesTheSteadyClock) {
  FlightRecorder r(4);
  const int64_t before = MonotonicNowNs();
  r.Record(T::kTrainerReady, 3, 1, 7);
  const TraceEvent e = r.Snapshot().events.at(0);
  EXPECT_GE(e.timestamp_ns, before);
  EXPECT_LE(e.timestamp_ns, MonotonicNowNs());
  EXPECT_EQ(e.iteration, 3u);
  EXPECT_EQ(e.id, 1u);
  EXPECT_EQ(e.tensor, 7u);
}

TEST(FlightRecorder, EmptyExportsAValidTrace) {
  FlightRecorder r(16);
  const json doc = Export(r);
  ASSERT_TRUE(doc.contains("traceEvents"));
  for (const json& e : doc["traceEvents"]) EXPECT_EQ(e["ph"], "M");
  EXPECT_EQ(doc["otherData"]["events_recorded"], 0);
  // An empty snapshot built by hand too.
  const json empty = json::parse(ToChromeTraceJson(TraceSnapshot{}, TraceMetadata{}));
  EXPECT_TRUE(empty["traceEvents"].is_array());
}

TEST(FlightRecorder, EveryBucketOfEveryIterationHasNestedSpans) {
  constexpr int kIterations = 5, kBuckets = 4, kTrainers = 2, kTensors = 3;
  FlightRecorder r(4096);
  for (const TraceEvent& e : MakeIterations(0, kIterations, kBuckets, kTrainers, kTensors, true)) {
    r.Record(e);
  }
  TraceMetadata meta;
  meta.node_rank = 1;
  meta.num_nodes = 2;
  meta.job_id = "job-\"7\"";
  meta.reason = "test";
  const json doc = Export(r, meta);
  EXPECT_EQ(doc["otherData"]["job_id"], "job-\"7\"");
  EXPECT_EQ(doc["otherData"]["node_rank"], 1);

  const std::vector<Span> spans = Spans(doc);
  ExpectProperlyNested(spans);
  const auto buckets = ByBucket(spans);
  ASSERT_EQ(buckets.size(), static_cast<size_t>(kIterations * kBuckets));
  for (uint64_t it = 0; it < kIterations; ++it) {
    for (uint32_t b = 0; b < kBuckets; ++b) {
      SCOPED_TRACE(absl::StrCat("bucket ", b, " iteration ", it));
      const auto found = buckets.find({b, it});
      ASSERT_NE(found, buckets.end());
      const auto& s = found->second;
      for (const char* name : {"wait for ready", "reduce", "local reduce", "collective"}) {
        ASSERT_EQ(s.count(name), 1u) << name;
      }
      const Span& parent = s.at(absl::StrCat("bucket ", b));
      EXPECT_EQ(parent.end - parent.start, kComplete);
      EXPECT_FALSE(parent.args.contains("incomplete"));
      ExpectInside(s.at("wait for ready"), parent);
      ExpectInside(s.at("reduce"), parent);
      ExpectInside(s.at("local reduce"), s.at("reduce"));
      ExpectInside(s.at("collective"), s.at("reduce"));
      EXPECT_EQ(s.at("wait for ready").end - s.at("wait for ready").start, kLastReady);
      EXPECT_EQ(s.at("reduce").end - s.at("reduce").start, kComplete - kLaunch);
      EXPECT_EQ(s.at("local reduce").end - s.at("local reduce").start, kLocalDone - kLaunch);
      EXPECT_EQ(s.at("collective").end - s.at("collective").start, kCollDone - kLocalDone);
    }
  }
}

TEST(FlightRecorder, TracksAreNamedAndTrainerMarksAreInstants) {
  constexpr int kBuckets = 3, kTrainers = 2, kTensors = 2;
  FlightRecorder r(1024);
  for (const TraceEvent& e : MakeIterations(0, 2, kBuckets, kTrainers, kTensors, false)) {
    r.Record(e);
  }
  TraceMetadata meta;
  meta.tensor_names = {"fc0.weight", "fc0.bias"};
  const json doc = Export(r, meta);
  const auto names = TrackNames(doc);
  std::set<std::string> expected = {"trainer 0", "trainer 1", "bucket 0", "bucket 1", "bucket 2"};
  std::set<std::string> got;
  for (const auto& [tid, name] : names) got.insert(name);
  EXPECT_EQ(got, expected);

  std::map<std::string, int> instants_per_track;
  std::set<std::string> instant_names;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] != "i") continue;
    EXPECT_EQ(e["s"], "t");
    ++instants_per_track[names.at(e["tid"])];
    instant_names.insert(e["name"]);
  }
  EXPECT_EQ(instants_per_track["trainer 0"], 2 * kBuckets * kTensors);
  EXPECT_EQ(instants_per_track["trainer 1"], 2 * kBuckets * kTensors);
  EXPECT_EQ(instants_per_track.size(), 2u) << "marks only on trainer tracks";
  EXPECT_TRUE(instant_names.count("ready fc0.weight"));
  EXPECT_TRUE(instant_names.count("unused fc0.weight"));  // trainer 1 skips tensor 0
  EXPECT_TRUE(instant_names.count("ready #5"));           // no name given for index 5

  // One node: no collective span.
  for (const Span& s : Spans(doc)) EXPECT_NE(s.name, "collective");
}

TEST(FlightRecorder, StalledBucketSpansRunToTheEndAndAreMarked) {
  FlightRecorder r(64);
  r.Record({1000, 4, 2, kNoTensor, T::kBucketFirstReady});
  r.Record({1010, 4, 0, 5, T::kTrainerReady});  // trainer 1 never marks
  TraceMetadata meta;
  meta.end_ns = 5000;
  meta.reason = "stall: bucket 2 of iteration 4";
  const json doc = Export(r, meta);
  const auto buckets = ByBucket(Spans(doc));
  const auto& s = buckets.at({2u, 4u});
  const Span& parent = s.at("bucket 2");
  EXPECT_EQ(parent.end - parent.start, 4000);
  EXPECT_TRUE(parent.args["incomplete"].get<bool>());
  EXPECT_TRUE(s.at("wait for ready").args["incomplete"].get<bool>());
  EXPECT_EQ(s.at("wait for ready").end, parent.end);
  EXPECT_EQ(s.count("reduce"), 0u);
}

TEST(FlightRecorder, StuckInCollectiveOnMultiNodeShowsAnOpenCollective) {
  FlightRecorder r(64);
  r.Record({1000, 0, 0, kNoTensor, T::kBucketFirstReady});
  r.Record({1100, 0, 0, kNoTensor, T::kBucketLastReady});
  r.Record({1200, 0, 0, kNoTensor, T::kBucketLaunch});
  r.Record({1300, 0, 0, kNoTensor, T::kBucketLocalReduceDone});
  TraceMetadata meta;
  meta.num_nodes = 2;
  meta.end_ns = 9000;
  const std::vector<Span> spans = Spans(Export(r, meta));
  ExpectProperlyNested(spans);
  const auto buckets = ByBucket(spans);
  const auto& s = buckets.at({0u, 0u});
  EXPECT_TRUE(s.at("collective").args["incomplete"].get<bool>());
  EXPECT_EQ(s.at("collective").end, s.at("bucket 0").end);
  EXPECT_FALSE(s.at("local reduce").args.contains("incomplete"));
}

TEST(FlightRecorder, OverwrittenStartStillGivesEveryBucketASpan) {
  // Room for less than two iterations: the oldest one lost its beginning.
  const std::vector<TraceEvent> events = MakeIterations(0, 3, 2, 2, 2, false);
  FlightRecorder r(32);
  for (const TraceEvent& e : events) r.Record(e);
  const TraceSnapshot snap = r.Snapshot();
  ASSERT_GT(snap.overwritten, 0u);
  std::set<std::pair<uint32_t, uint64_t>> seen;
  for (const TraceEvent& e : snap.events) {
    if (e.tensor == kNoTensor) seen.insert({e.id, e.iteration});
  }
  const std::vector<Span> spans = Spans(json::parse(ToChromeTraceJson(snap, {})));
  ExpectProperlyNested(spans);
  const auto buckets = ByBucket(spans);
  bool any_truncated = false;
  for (const auto& key : seen) {
    ASSERT_TRUE(buckets.count(key)) << key.first << "/" << key.second;
    const Span& parent = buckets.at(key).at(absl::StrCat("bucket ", key.first));
    any_truncated |= parent.args.contains("truncated");
  }
  EXPECT_TRUE(any_truncated);
}

TEST(FlightRecorder, OutOfOrderTimestampsStillNest) {
  // A launch stamped before the last ready mark (clocks read on two threads).
  FlightRecorder r(64);
  r.Record({1000, 0, 0, kNoTensor, T::kBucketFirstReady});
  r.Record({1500, 0, 0, kNoTensor, T::kBucketLastReady});
  r.Record({1400, 0, 0, kNoTensor, T::kBucketLaunch});
  r.Record({1450, 0, 0, kNoTensor, T::kBucketLocalReduceDone});
  r.Record({1300, 0, 0, kNoTensor, T::kBucketComplete});  // even before last ready
  const std::vector<Span> spans = Spans(Export(r));
  ExpectProperlyNested(spans);
  const auto buckets = ByBucket(spans);
  const auto& s = buckets.at({0u, 0u});
  const Span& parent = s.at("bucket 0");
  for (const auto& [name, span] : s) {
    if (name != "bucket 0") ExpectInside(span, parent);
  }
  // Siblings do not overlap either.
  EXPECT_LE(s.at("wait for ready").end, s.at("reduce").start);
}

TEST(FlightRecorder, ConcurrentSnapshotsNeverSeeTornEvents) {
  FlightRecorder r(256);
  constexpr uint64_t kEvents = 300'000;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (uint64_t i = 0; i < kEvents; ++i) {
      r.Record({static_cast<int64_t>(i), i, static_cast<uint32_t>(i * 7), ~static_cast<uint32_t>(i),
                T::kTrainerReady});
    }
    done = true;
  });
  int snapshots = 0;
  while (!done || snapshots < 10) {
    const TraceSnapshot snap = r.Snapshot();
    ++snapshots;
    ASSERT_LE(snap.events.size(), r.capacity());
    ASSERT_EQ(snap.events.size() + snap.overwritten, snap.recorded);
    for (size_t k = 0; k < snap.events.size(); ++k) {
      const TraceEvent& e = snap.events[k];
      ASSERT_EQ(e.timestamp_ns, static_cast<int64_t>(e.iteration));
      ASSERT_EQ(e.id, static_cast<uint32_t>(e.iteration * 7));
      ASSERT_EQ(e.tensor, ~static_cast<uint32_t>(e.iteration));
      if (k > 0) {
        ASSERT_EQ(e.iteration, snap.events[k - 1].iteration + 1) << "snapshots are contiguous";
      }
    }
  }
  writer.join();
  EXPECT_EQ(r.recorded(), kEvents);
}

TEST(FlightRecorder, ConcurrentWritersAreSerialized) {
  FlightRecorder r(1 << 16);
  std::vector<std::thread> writers;
  for (uint32_t w = 0; w < 4; ++w) {
    writers.emplace_back([&r, w] {
      for (uint64_t i = 0; i < 10'000; ++i) r.Record({1, i, w, w, T::kTrainerReady});
    });
  }
  for (auto& t : writers) t.join();
  const TraceSnapshot snap = r.Snapshot();
  EXPECT_EQ(snap.events.size(), 40'000u);
  std::map<uint32_t, uint64_t> next;  // per writer, its events in its order
  for (const TraceEvent& e : snap.events) {
    ASSERT_EQ(e.id, e.tensor);
    ASSERT_EQ(e.iteration, next[e.id]++);
  }
}

std::string TempDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

TEST(FlightRecorder, WriteTraceFileWritesParseableJson) {
  FlightRecorder r(1024);
  for (const TraceEvent& e : MakeIterations(0, 2, 2, 2, 2, false)) r.Record(e);
  const std::string path = TempDir() + "/trace.json";
  TraceMetadata meta;
  meta.reason = "timeout";
  ASSERT_TRUE(r.WriteTraceFile(path, meta).ok());
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  const json doc = json::parse(text.str());
  EXPECT_EQ(doc["otherData"]["reason"], "timeout");
  EXPECT_EQ(ByBucket(Spans(doc)).size(), 4u);
}

TEST(FlightRecorder, WriteTraceFileReportsErrors) {
  FlightRecorder r(16);
  const absl::Status s = r.WriteTraceFile(TempDir() + "/no/such/dir/trace.json", {});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos) << s;
}

TEST(FlightRecorder, InvalidUtf8InNamesDoesNotBreakTheExport) {
  FlightRecorder r(16);
  r.Record({1, 0, 0, 0, T::kTrainerReady});
  TraceMetadata meta;
  meta.job_id = "bad\xff";
  meta.tensor_names = {"w\xfe"};
  EXPECT_FALSE(Export(r, meta).is_discarded());
}

}  // namespace
}  // namespace gradsync
