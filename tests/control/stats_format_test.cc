// stats_format on a hand-built Stats: the readable table, protobuf JSON
// (parses, round-trips, every field present) and Prometheus text that a
// strict line-by-line reading of the exposition format accepts.
#include "common/stats_format.h"

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace gradsync {
namespace {

void SetLatency(v1::LatencyStats* l, double last, double p50, double p99) {
  l->set_last_us(last);
  l->set_p50_us(p50);
  l->set_p99_us(p99);
}

v1::Stats SampleStats() {
  v1::Stats s;
  s.set_node_rank(1);
  s.set_job_id("resnet \"a\"\\b");  // needs escaping in Prometheus labels
  s.set_generation(3);
  s.set_backend("gloo");
  s.set_world_size(4);
  s.set_num_nodes(2);
  s.set_local_size(2);
  s.set_uptime_s(3723.5);
  s.set_iterations(1200);
  s.set_bytes_reduced(12345678901234);
  s.set_algbw_gbps(1.25);
  s.set_busbw_gbps(1.875);
  s.set_errors(0);
  for (int r = 0; r < 2; ++r) {
    v1::TrainerStats* t = s.add_trainers();
    t->set_rank(2 + r);
    t->set_local_rank(r);
    t->set_pid(4242 + r);
    t->set_state("registered");
    t->set_iterations(1200);
    t->set_bytes_reduced(12345678901234);
  }
  v1::BucketStats* b0 = s.add_buckets();
  b0->set_id(0);
  b0->set_bytes(1 << 20);
  b0->set_tensor_count(3);
  b0->set_count(1200);
  SetLatency(b0->mutable_total(), 812, 790, 1030);
  SetLatency(b0->mutable_wait_for_ready(), 400, 380, 600);
  SetLatency(b0->mutable_local_reduce(), 3.25, 3.5, 9.75);
  SetLatency(b0->mutable_collective(), 250, 240, 300);
  SetLatency(b0->mutable_write_back(), 12.5, 12, 20);
  // 1200 totals: 700 within 500 µs, 1100 within 1 ms, 100 slower.
  b0->mutable_total()->add_histogram_bounds_us(500);
  b0->mutable_total()->add_histogram_counts(700);
  b0->mutable_total()->add_histogram_bounds_us(1000);
  b0->mutable_total()->add_histogram_counts(1100);
  b0->mutable_total()->set_histogram_count(1200);
  b0->mutable_total()->set_histogram_sum_us(960000);
  v1::BucketStats* b1 = s.add_buckets();  // planned, never reduced
  b1->set_id(1);
  b1->set_bytes(25u << 20);
  b1->set_tensor_count(40);
  v1::StallReport* st = s.add_stalls();
  st->set_iteration(1199);
  st->set_bucket(1);
  st->set_waited_s(61);
  st->set_description("trainer 3 has not marked fc9.weight");
  s.add_recent_errors("trainer 3 detached");
  s.set_nonfinite_skipped_iterations(3);
  (*s.mutable_nonfinite_skipped_by_culprit())["rank 3 (local 1, pid 4243) on node 1 (host h)"] = 2;
  (*s.mutable_nonfinite_skipped_by_culprit())["another node"] = 1;
  return s;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

size_t Width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Display column where `needle` ends in `line`, or npos.
size_t EndColumn(const std::string& line, const std::string& needle) {
  const size_t at = line.find(needle);
  if (at == std::string::npos) return std::string::npos;
  return Width(line.substr(0, at + needle.size()));
}

TEST(StatsTable, ShowsHeaderTrainersBucketsAndProblems) {
  const std::string text = FormatStatsTable(SampleStats());
  SCOPED_TRACE(text);
  const std::vector<std::string> lines = Lines(text);
  ASSERT_GE(lines.size(), 10u);
  EXPECT_NE(lines[0].find("node 1 of 2"), std::string::npos);
  EXPECT_NE(lines[0].find("job resnet \"a\"\\b"), std::string::npos);
  EXPECT_NE(lines[0].find("backend gloo"), std::string::npos);
  EXPECT_NE(lines[0].find("uptime 1h02m03s"), std::string::npos);
  EXPECT_NE(lines[1].find("world 4 trainers (2 nodes x 2 local)"), std::string::npos);
  EXPECT_NE(lines[1].find("1200 iterations"), std::string::npos);
  EXPECT_NE(lines[1].find("11.2 TiB reduced"), std::string::npos);
  EXPECT_NE(lines[1].find("algbw 1.25 GB/s"), std::string::npos);
  EXPECT_NE(lines[1].find("busbw 1.88 GB/s"), std::string::npos);

  EXPECT_NE(text.find("TRAINERS\n"), std::string::npos);
  EXPECT_NE(text.find("BUCKETS (latency in µs: last/p50/p99)\n"), std::string::npos);
  EXPECT_NE(text.find("STALLS\niteration 1199 bucket 1 waited 1m01s: trainer 3 has not marked"),
            std::string::npos);
  EXPECT_NE(text.find("RECENT ERRORS\ntrainer 3 detached\n"), std::string::npos);
  EXPECT_NE(text.find("non-finite gradients: 3 iterations skipped (1 from another node; 2 from "
                      "rank 3 (local 1, pid 4243) on node 1 (host h))\n"),
            std::string::npos);

  // Rows and right-aligned columns: a cell ends where its header ends.
  std::string bucket_header, bucket0, bucket1, trainer_header, trainer2;
  for (const std::string& l : lines) {
    if (l.rfind("ID", 0) == 0) bucket_header = l;
    if (l.find("1.0 MiB") != std::string::npos) bucket0 = l;
    if (l.find("25.0 MiB") != std::string::npos) bucket1 = l;
    if (l.find("RANK") != std::string::npos) trainer_header = l;
    if (l.find("4242") != std::string::npos) trainer2 = l;
  }
  ASSERT_FALSE(bucket0.empty());
  ASSERT_FALSE(bucket1.empty());
  ASSERT_FALSE(trainer2.empty());
  EXPECT_EQ(EndColumn(bucket_header, "TOTAL"), EndColumn(bucket0, "812/790/1030"));
  EXPECT_EQ(EndColumn(bucket_header, "LOCAL REDUCE"), EndColumn(bucket0, "3.2/3.5/9.8"));
  EXPECT_EQ(EndColumn(bucket_header, "COLLECTIVE"), EndColumn(bucket0, "250/240/300"));
  EXPECT_EQ(EndColumn(bucket_header, "WAIT FOR READY"), EndColumn(bucket0, "400/380/600"));
  EXPECT_EQ(EndColumn(trainer_header, "PID"), EndColumn(trainer2, "4242"));
  EXPECT_NE(trainer2.find("registered"), std::string::npos);
  // A bucket that never ran shows dashes, not zeros.
  EXPECT_EQ(bucket1.find("0/0/0"), std::string::npos);
  EXPECT_NE(bucket1.find("-"), std::string::npos);
}

TEST(StatsTable, SingleNodeHasNoCollectiveAndEmptySectionsSaySo) {
  v1::Stats s = SampleStats();
  s.set_num_nodes(1);
  const std::string one_node = FormatStatsTable(s);
  EXPECT_EQ(one_node.find("250/240/300"), std::string::npos);

  const std::string empty = FormatStatsTable(v1::Stats());
  EXPECT_NE(empty.find("(none attached)"), std::string::npos);
  EXPECT_NE(empty.find("(no plan yet)"), std::string::npos);
  EXPECT_EQ(empty.find("STALLS"), std::string::npos);
}

TEST(StatsTable, AutotuneListsCandidatesScoresAndTheChoice) {
  v1::Stats s;
  s.set_autotune_state("chosen");
  s.set_autotune_choice(1);
  s.set_autotune_chosen_at_iteration(77);
  for (double cap : {4.0, 16.0}) {
    v1::AutotuneCandidate* c = s.add_autotune_candidates();
    c->set_first_bucket_cap_mb(0.25);
    c->set_bucket_cap_mb(cap);
    c->set_at_iteration(cap == 4 ? 40 : 44);
    c->set_median_step_s(cap == 4 ? 0.25 : 0.125);
    c->set_scored_iterations(3);
  }
  const std::string table = FormatStatsTable(s);
  EXPECT_NE(table.find("AUTOTUNE (chosen)"), std::string::npos) << table;
  EXPECT_NE(table.find("chosen, from iteration 77"), std::string::npos) << table;
  // The chosen row is the 16 MiB one, with its median; the other is not chosen.
  const size_t chosen = table.find("chosen, from");
  const size_t start = table.rfind('\n', chosen) + 1;
  const std::string line = table.substr(start, chosen - start);
  EXPECT_NE(line.find(" 16 "), std::string::npos) << table;
  EXPECT_NE(line.find("125.0 ms"), std::string::npos) << table;
  EXPECT_NE(table.find("250.0 ms"), std::string::npos) << table;
  // Off: no section.
  EXPECT_EQ(FormatStatsTable(v1::Stats()).find("AUTOTUNE"), std::string::npos);
}

// A node that does not tune says which one does, without an empty table.
TEST(StatsTable, AutotuneOnANodeThatDoesNotTuneNamesTheTunerWithoutATable) {
  v1::Stats s;
  s.set_autotune_state(
      "node_rank=1 tunes (the first member of generation 2); this node applies its choices");
  s.set_autotune_choice(-1);
  const std::string table = FormatStatsTable(s);
  EXPECT_NE(table.find("AUTOTUNE (node_rank=1 tunes (the first member of generation 2); this "
                       "node applies its choices)\n"),
            std::string::npos)
      << table;
  EXPECT_EQ(table.find("FIRST CAP MiB"), std::string::npos) << table;
}

TEST(StatsJson, ParsesRoundTripsAndPrintsEveryField) {
  const v1::Stats s = SampleStats();
  absl::StatusOr<std::string> text = FormatJson(s);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json doc = nlohmann::json::parse(*text);
  EXPECT_EQ(doc["node_rank"], 1);
  EXPECT_EQ(doc["job_id"], "resnet \"a\"\\b");
  EXPECT_EQ(doc["bytes_reduced"], "12345678901234");  // proto3 JSON: 64-bit ints are strings
  EXPECT_EQ(doc["errors"], "0");                      // zero, but printed
  EXPECT_EQ(doc["buckets"][0]["wait_for_ready"]["p50_us"], 380);
  EXPECT_EQ(doc["buckets"][1]["count"], "0");
  EXPECT_EQ(doc["trainers"].size(), 2u);

  v1::Stats back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*text, &back).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(s, back));
}

// ---- a strict reading of the Prometheus text format ------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value;
};

// Parses `{a="x",b="y\"z"}` with the format's escapes; nullopt if malformed.
std::optional<std::map<std::string, std::string>> ParseLabels(const std::string& s) {
  std::map<std::string, std::string> out;
  size_t i = 0;
  static const std::regex kName("[a-zA-Z_][a-zA-Z0-9_]*");
  while (i < s.size()) {
    const size_t eq = s.find('=', i);
    if (eq == std::string::npos) return std::nullopt;
    const std::string name = s.substr(i, eq - i);
    if (!std::regex_match(name, kName) || eq + 1 >= s.size() || s[eq + 1] != '"') {
      return std::nullopt;
    }
    std::string value;
    size_t j = eq + 2;
    for (; j < s.size() && s[j] != '"'; ++j) {
      if (s[j] == '\\') {
        if (++j >= s.size()) return std::nullopt;
        if (s[j] == 'n') {
          value += '\n';
        } else if (s[j] == '\\' || s[j] == '"') {
          value += s[j];
        } else {
          return std::nullopt;
        }
      } else if (s[j] == '\n') {
        return std::nullopt;
      } else {
        value += s[j];
      }
    }
    if (j >= s.size()) return std::nullopt;
    if (!out.emplace(name, value).second) return std::nullopt;  // duplicate label
    i = j + 1;
    if (i < s.size()) {
      if (s[i] != ',') return std::nullopt;
      ++i;
    }
  }
  return out;
}

std::vector<Sample> ParsePrometheus(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+))");
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
  static const std::regex kSample(R"(([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+))");
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;
  std::set<std::string> helped, series;
  std::string current;  // the family whose samples are being read
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  for (const std::string& line : Lines(text)) {
    std::smatch m;
    if (std::regex_match(line, m, kHelp)) {
      // One HELP per family, and samples must follow their own: so every
      // family's lines are contiguous, as the format requires.
      EXPECT_TRUE(helped.insert(m[1]).second) << "HELP twice: " << line;
      current = m[1];
    } else if (std::regex_match(line, m, kType)) {
      EXPECT_EQ(m[1], current) << "TYPE without its HELP: " << line;
      EXPECT_TRUE(types.emplace(m[1], m[2]).second) << "TYPE twice: " << line;
    } else if (std::regex_match(line, m, kSample)) {
      const std::string name = m[1];
      const auto type = types.find(current);
      const bool histogram_part =
          type != types.end() && type->second == "histogram" &&
          (name == current + "_bucket" || name == current + "_sum" || name == current + "_count");
      EXPECT_TRUE(name == current || histogram_part) << "sample outside its family block: " << line;
      EXPECT_TRUE(types.count(current)) << "sample before its TYPE: " << line;
      auto labels = ParseLabels(m[2]);
      EXPECT_TRUE(labels.has_value()) << "bad labels: " << line;
      const std::string v = m[3];
      char* end = nullptr;
      const double value = std::strtod(v.c_str(), &end);
      EXPECT_TRUE(*end == '\0' || v == "NaN" || v == "+Inf" || v == "-Inf") << line;
      EXPECT_TRUE(series.insert(name + "{" + std::string(m[2]) + "}").second)
          << "duplicate series: " << line;
      samples.push_back({name, labels.value_or(std::map<std::string, std::string>{}), value});
    } else {
      ADD_FAILURE() << "not exposition format: " << line;
    }
  }
  for (const auto& [name, type] : types) {
    EXPECT_EQ(name.rfind("gradsync_", 0), 0u) << name;
    const bool total = name.size() > 6 && name.substr(name.size() - 6) == "_total";
    EXPECT_EQ(type == "counter", total) << name << " is a " << type;
  }
  return samples;
}

const Sample* Find(const std::vector<Sample>& samples, const std::string& name,
                   const std::map<std::string, std::string>& labels) {
  for (const Sample& s : samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      match &= it != s.labels.end() && it->second == v;
    }
    if (match) return &s;
  }
  return nullptr;
}

TEST(StatsPrometheus, ParsesStrictlyAndCarriesTheFigures) {
  const std::string text = FormatStatsPrometheus(SampleStats());
  SCOPED_TRACE(text);
  const std::vector<Sample> samples = ParsePrometheus(text);
  ASSERT_FALSE(samples.empty());
  for (const Sample& s : samples) {
    EXPECT_EQ(s.labels.at("node"), "1");
    EXPECT_EQ(s.labels.at("job"), "resnet \"a\"\\b");  // escaped and read back intact
  }
  auto value = [&](const std::string& name, const std::map<std::string, std::string>& labels) {
    const Sample* s = Find(samples, name, labels);
    EXPECT_NE(s, nullptr) << name;
    return s != nullptr ? s->value : -1;
  };
  EXPECT_EQ(value("gradsync_iterations_total", {}), 1200);
  EXPECT_EQ(value("gradsync_reduced_bytes_total", {}), 12345678901234.0);
  EXPECT_DOUBLE_EQ(value("gradsync_busbw_bytes_per_second", {}), 1.875e9);
  EXPECT_EQ(value("gradsync_info", {{"backend", "gloo"}, {"generation", "3"}}), 1);
  EXPECT_EQ(
      value("gradsync_trainer_info", {{"rank", "3"}, {"pid", "4243"}, {"state", "registered"}}), 1);
  EXPECT_EQ(value("gradsync_trainer_iterations_total", {{"rank", "2"}, {"local_rank", "0"}}), 1200);
  EXPECT_EQ(value("gradsync_bucket_size_bytes", {{"bucket", "1"}}), 25 << 20);
  EXPECT_EQ(value("gradsync_bucket_reductions_total", {{"bucket", "0"}}), 1200);
  // A histogram (cumulative buckets in seconds), not quantile gauges.
  EXPECT_EQ(value("gradsync_bucket_latency_seconds_bucket",
                  {{"bucket", "0"}, {"phase", "total"}, {"le", "0.0005"}}),
            700);
  EXPECT_EQ(value("gradsync_bucket_latency_seconds_bucket",
                  {{"bucket", "0"}, {"phase", "total"}, {"le", "0.001"}}),
            1100);
  EXPECT_EQ(value("gradsync_bucket_latency_seconds_bucket",
                  {{"bucket", "0"}, {"phase", "total"}, {"le", "+Inf"}}),
            1200);
  EXPECT_EQ(value("gradsync_bucket_latency_seconds_count", {{"bucket", "0"}, {"phase", "total"}}),
            1200);
  EXPECT_DOUBLE_EQ(
      value("gradsync_bucket_latency_seconds_sum", {{"bucket", "0"}, {"phase", "total"}}), 0.96);
  for (const Sample& sample : samples) {
    EXPECT_EQ(sample.labels.count("quantile"), 0u) << sample.name;
  }
  EXPECT_DOUBLE_EQ(
      value("gradsync_bucket_last_latency_seconds", {{"bucket", "0"}, {"phase", "wait_for_ready"}}),
      400e-6);
  EXPECT_DOUBLE_EQ(
      value("gradsync_bucket_last_latency_seconds", {{"bucket", "0"}, {"phase", "write_back"}}),
      12.5e-6);
  EXPECT_EQ(value("gradsync_stalls", {}), 1);
  EXPECT_EQ(value("gradsync_nonfinite_skipped_iterations_total", {}), 3);
  EXPECT_EQ(value("gradsync_nonfinite_skipped_by_culprit_total",
                  {{"culprit", "rank 3 (local 1, pid 4243) on node 1 (host h)"}}),
            2);
  EXPECT_EQ(value("gradsync_nonfinite_skipped_by_culprit_total", {{"culprit", "another node"}}), 1);
}

TEST(StatsPrometheus, EmptyStatsStillWellFormed) {
  const std::vector<Sample> samples = ParsePrometheus(FormatStatsPrometheus(v1::Stats()));
  EXPECT_NE(Find(samples, "gradsync_iterations_total", {}), nullptr);
  EXPECT_EQ(Find(samples, "gradsync_bucket_size_bytes", {}), nullptr);
  // Zero skipped iterations is a figure too; no culprit, no per-culprit sample.
  EXPECT_NE(Find(samples, "gradsync_nonfinite_skipped_iterations_total", {}), nullptr);
  EXPECT_EQ(Find(samples, "gradsync_nonfinite_skipped_by_culprit_total", {}), nullptr);
}

// The daemon-wide iteration histogram is printed whenever the daemon set it,
// with zero counts too: scrapers see the family before the first job.
TEST(StatsPrometheus, IterationHistogramIsPrintedWheneverSetEvenWithZeroCounts) {
  v1::Stats fresh;
  v1::LatencyStats* zero = fresh.mutable_iteration_duration();
  zero->add_histogram_bounds_us(1000);
  zero->add_histogram_counts(0);
  std::vector<Sample> samples = ParsePrometheus(FormatStatsPrometheus(fresh));
  const Sample* count = Find(samples, "gradsync_iteration_duration_seconds_count", {});
  ASSERT_NE(count, nullptr);
  EXPECT_EQ(count->value, 0);

  v1::Stats s;
  v1::LatencyStats* d = s.mutable_iteration_duration();
  d->add_histogram_bounds_us(1000);
  d->add_histogram_bounds_us(2500);
  d->add_histogram_counts(2);
  d->add_histogram_counts(3);
  d->set_histogram_count(4);
  d->set_histogram_sum_us(6000);
  samples = ParsePrometheus(FormatStatsPrometheus(s));
  auto value = [&](const std::string& name, const std::map<std::string, std::string>& labels) {
    const Sample* found = Find(samples, name, labels);
    EXPECT_NE(found, nullptr) << name;
    return found != nullptr ? found->value : -1;
  };
  EXPECT_EQ(value("gradsync_iteration_duration_seconds_bucket", {{"le", "0.001"}}), 2);
  EXPECT_EQ(value("gradsync_iteration_duration_seconds_bucket", {{"le", "0.0025"}}), 3);
  EXPECT_EQ(value("gradsync_iteration_duration_seconds_bucket", {{"le", "+Inf"}}), 4);
  EXPECT_EQ(value("gradsync_iteration_duration_seconds_count", {}), 4);
  EXPECT_DOUBLE_EQ(value("gradsync_iteration_duration_seconds_sum", {}), 0.006);

  EXPECT_EQ(Find(ParsePrometheus(FormatStatsPrometheus(v1::Stats())),
                 "gradsync_iteration_duration_seconds_count", {}),
            nullptr)
      << "not set: not printed";
}

v1::TrainerLateness Lateness(int rank, int node, double mean_us, double share, bool straggler) {
  v1::TrainerLateness t;
  t.set_rank(rank);
  t.set_node_rank(node);
  t.set_host(absl::StrCat("host", node));
  t.set_pid(4000 + rank);
  t.set_window_iterations(100);
  t.set_late_mean_us(mean_us);
  t.set_late_p99_us(mean_us * 2);
  t.set_share_last(share);
  t.set_usual_bucket(straggler ? 3 : -1);
  t.set_straggler(straggler);
  t.mutable_lateness()->add_histogram_bounds_us(10000);
  t.mutable_lateness()->add_histogram_counts(straggler ? 0 : 100);
  t.mutable_lateness()->set_histogram_count(100);
  t.mutable_lateness()->set_histogram_sum_us(mean_us * 100);
  return t;
}

TEST(StragglersTable, ListsEveryTrainerAndNamesTheStraggler) {
  v1::GetStragglersResponse r;
  r.set_job_id("j");
  r.mutable_settings()->set_window(100);
  r.mutable_settings()->set_share(0.5);
  r.mutable_settings()->set_late_us(10000);
  *r.add_trainers() = Lateness(0, 0, 31, 0.02, false);
  *r.add_trainers() = Lateness(1, 1, 20427, 0.97, true);
  const std::string table = FormatStragglersTable(r);
  SCOPED_TRACE(table);
  EXPECT_NE(table.find("more than 50% and median late by more than 10.0 ms"), std::string::npos);
  EXPECT_NE(table.find("host1"), std::string::npos);
  EXPECT_NE(table.find("4001"), std::string::npos);
  EXPECT_NE(table.find("20.427"), std::string::npos);
  EXPECT_NE(table.find("40.854"), std::string::npos);  // p99
  EXPECT_NE(table.find("97%"), std::string::npos);
  EXPECT_NE(table.find("straggler: rank 1\n"), std::string::npos);
  v1::Stats stats;
  *stats.mutable_stragglers() = r.trainers();
  EXPECT_NE(FormatStatsTable(stats).find("STRAGGLER rank 1 (node 1, pid 4001): late by 20.427 ms "
                                         "on average, last in 97% of 100 iterations\n"),
            std::string::npos)
      << FormatStatsTable(stats);
  r.mutable_trainers()->RemoveLast();
  EXPECT_NE(FormatStragglersTable(r).find("no straggler\n"), std::string::npos);
  r.clear_trainers();
  EXPECT_NE(FormatStragglersTable(r).find("(no trainer measured yet)"), std::string::npos);
}

TEST(StatsPrometheus, CarriesEachTrainersLatenessHistogramShareAndVerdict) {
  v1::Stats stats;
  *stats.add_stragglers() = Lateness(0, 0, 31, 0.02, false);
  *stats.add_stragglers() = Lateness(1, 0, 20427, 0.97, true);
  const std::vector<Sample> samples = ParsePrometheus(FormatStatsPrometheus(stats));
  const Sample* late =
      Find(samples, "gradsync_trainer_lateness_seconds_bucket", {{"rank", "1"}, {"le", "0.01"}});
  ASSERT_NE(late, nullptr);
  EXPECT_EQ(late->value, 0);
  const Sample* all = Find(samples, "gradsync_trainer_lateness_seconds_count", {{"rank", "1"}});
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->value, 100);
  const Sample* share = Find(samples, "gradsync_trainer_last_share", {{"rank", "1"}});
  ASSERT_NE(share, nullptr);
  EXPECT_DOUBLE_EQ(share->value, 0.97);
  const Sample* named = Find(samples, "gradsync_trainer_straggler", {{"rank", "1"}});
  ASSERT_NE(named, nullptr);
  EXPECT_EQ(named->value, 1);
  const Sample* other = Find(samples, "gradsync_trainer_straggler", {{"rank", "0"}});
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(other->value, 0);
}

TEST(ConfigFormat, KeyValueLinesInFieldOrder) {
  v1::Config c;
  c.set_bucket_cap_mb(25);
  c.set_first_bucket_cap_mb(0.5);
  c.set_timeout_ms(300000);
  c.set_stall_threshold_s(60);
  c.set_log_level("debug");
  c.set_version(7);
  EXPECT_EQ(FormatConfig(c),
            "bucket_cap_mb=25\n"
            "first_bucket_cap_mb=0.5\n"
            "timeout_ms=300000\n"
            "stall_threshold_s=60\n"
            "log_level=debug\n"
            "version=7\n");
  absl::StatusOr<std::string> json = FormatJson(c);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(nlohmann::json::parse(*json)["log_level"], "debug");
}

TEST(Units, BytesMicrosDurations) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(25u << 20), "25.0 MiB");
  EXPECT_EQ(FormatBytes(uint64_t{3} << 30), "3.0 GiB");
  EXPECT_EQ(FormatMicros(3.25), "3.2");
  EXPECT_EQ(FormatMicros(9.96), "10.0");
  EXPECT_EQ(FormatMicros(812.4), "812");
  EXPECT_EQ(FormatDuration(12.34), "12.3s");
  EXPECT_EQ(FormatDuration(61), "1m01s");
  EXPECT_EQ(FormatDuration(3723.5), "1h02m03s");
  EXPECT_EQ(FormatDuration(90061), "1d01h01m");
}

}  // namespace
}  // namespace gradsync
