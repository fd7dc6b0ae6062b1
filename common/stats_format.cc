#include "common/stats_format.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace gradsync {
namespace {

// ---- the readable table ----------------------------------------------------

// Display width of UTF-8 text: code points, not bytes ("µs" is 2 columns).
size_t DisplayWidth(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Columns padded to their widest cell; numbers right-aligned.
class TextTable {
 public:
  enum Align { kLeft, kRight };
  explicit TextTable(std::vector<std::pair<std::string, Align>> columns)
      : columns_(std::move(columns)) {}

  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

  std::string Render() const {
    std::vector<size_t> width(columns_.size());
    for (size_t c = 0; c < columns_.size(); ++c) {
      width[c] = DisplayWidth(columns_[c].first);
      for (const auto& row : rows_) width[c] = std::max(width[c], DisplayWidth(row[c]));
    }
    std::string out;
    auto emit = [&](const std::vector<std::string>& cells) {
      std::string line;
      for (size_t c = 0; c < columns_.size(); ++c) {
        const std::string pad(width[c] - DisplayWidth(cells[c]), ' ');
        if (c > 0) line += "  ";
        line += columns_[c].second == kRight ? pad + cells[c] : cells[c] + pad;
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      absl::StrAppend(&out, line, "\n");
    };
    std::vector<std::string> header;
    for (const auto& col : columns_) header.push_back(col.first);
    emit(header);
    for (const auto& row : rows_) emit(row);
    return out;
  }

 private:
  std::vector<std::pair<std::string, Align>> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// "last/p50/p99" in µs, or "-" for a phase that never ran.
std::string LatencyCell(const v1::LatencyStats& l, bool ran) {
  if (!ran) return "-";
  return absl::StrCat(FormatMicros(l.last_us()), "/", FormatMicros(l.p50_us()), "/",
                      FormatMicros(l.p99_us()));
}

std::string Gbps(double gbps) { return absl::StrFormat("%.2f GB/s", gbps); }

// ---- Prometheus text exposition format -------------------------------------

// Shortest text that parses back to the same double (Go's ParseFloat reads it).
std::string PromValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : absl::StrCat(v);
}

std::string PromValue(uint64_t v) { return absl::StrCat(v); }

// A bucket bound as "0.0005", not "5e-04": the le label reads as written.
std::string FixedNotation(double v) {
  char buf[400];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed);
  return ec == std::errc() ? std::string(buf, end) : PromValue(v);
}

std::string EscapeLabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

using Labels = std::vector<std::pair<std::string, std::string>>;

// Collects samples per metric family, then prints each family once: HELP,
// TYPE, then its samples (the format requires a family's lines together).
class PromWriter {
 public:
  PromWriter(Labels common) : common_(std::move(common)) {}

  // A sample of `family`; `name` is the family's name plus a histogram's
  // _bucket, _sum or _count suffix.
  void Add(const std::string& name, const char* type, const char* help, const Labels& labels,
           const std::string& value, const std::string& family = "") {
    const std::string& family_name = family.empty() ? name : family;
    auto [it, inserted] = index_.emplace(family_name, families_.size());
    if (inserted) families_.push_back({family_name, type, help, {}});
    Labels all = common_;
    all.insert(all.end(), labels.begin(), labels.end());
    std::vector<std::string> parts;
    for (const auto& [k, v] : all)
      parts.push_back(absl::StrCat(k, "=\"", EscapeLabelValue(v), "\""));
    families_[it->second].samples.push_back(
        absl::StrCat(name, "{", absl::StrJoin(parts, ","), "} ", value));
  }
  void Gauge(const std::string& name, const char* help, const Labels& labels, double v) {
    Add(name, "gauge", help, labels, PromValue(v));
  }
  void Counter(const std::string& name, const char* help, const Labels& labels, uint64_t v) {
    Add(name, "counter", help, labels, PromValue(v));
  }
  // Cumulative buckets le=<bound in seconds>, then +Inf, _sum and _count.
  void Histogram(const std::string& name, const char* help, const Labels& labels,
                 const v1::LatencyStats& l) {
    const int n = std::min(l.histogram_bounds_us_size(), l.histogram_counts_size());
    for (int i = 0; i < n; ++i) {
      Labels le = labels;
      le.push_back({"le", FixedNotation(l.histogram_bounds_us(i) / 1e6)});
      Add(name + "_bucket", "histogram", help, le, PromValue(l.histogram_counts(i)), name);
    }
    Labels inf = labels;
    inf.push_back({"le", "+Inf"});
    Add(name + "_bucket", "histogram", help, inf, PromValue(l.histogram_count()), name);
    Add(name + "_sum", "histogram", help, labels, PromValue(l.histogram_sum_us() / 1e6), name);
    Add(name + "_count", "histogram", help, labels, PromValue(l.histogram_count()), name);
  }

  std::string Render() const {
    std::string out;
    for (const auto& f : families_) {
      absl::StrAppend(&out, "# HELP ", f.name, " ", f.help, "\n# TYPE ", f.name, " ", f.type, "\n");
      for (const auto& s : f.samples) absl::StrAppend(&out, s, "\n");
    }
    return out;
  }

 private:
  struct Family {
    std::string name;
    const char* type;
    const char* help;
    std::vector<std::string> samples;
  };
  Labels common_;
  std::vector<Family> families_;
  std::map<std::string, size_t> index_;
};

// ---- config ----------------------------------------------------------------

std::string FieldText(const google::protobuf::Message& m,
                      const google::protobuf::FieldDescriptor* f) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  switch (f->cpp_type()) {
    case FD::CPPTYPE_DOUBLE:
      return PromValue(r->GetDouble(m, f));
    case FD::CPPTYPE_FLOAT:
      return PromValue(static_cast<double>(r->GetFloat(m, f)));
    case FD::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(m, f));
    case FD::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(m, f));
    case FD::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(m, f));
    case FD::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(m, f));
    case FD::CPPTYPE_BOOL:
      return r->GetBool(m, f) ? "true" : "false";
    case FD::CPPTYPE_STRING:
      return r->GetString(m, f);
    case FD::CPPTYPE_ENUM:
      return r->GetEnum(m, f)->name();
    default:
      return "(unsupported)";
  }
}

// --autotune's section: the state, and on the tuning node its candidates.
void AppendAutotune(const v1::Stats& s, std::string* out) {
  if (!s.autotune_state().empty()) {
    absl::StrAppendFormat(out, "\nAUTOTUNE (%s)\n", s.autotune_state());
  }
  // Only the tuning node lists candidates; the others' state names it.
  if (s.autotune_candidates_size() > 0) {
    TextTable t({{"#", TextTable::kRight},
                 {"FIRST CAP MiB", TextTable::kRight},
                 {"CAP MiB", TextTable::kRight},
                 {"AT ITERATION", TextTable::kRight},
                 {"MEDIAN STEP", TextTable::kRight},
                 {"SCORED", TextTable::kRight},
                 {"", TextTable::kLeft}});
    for (int i = 0; i < s.autotune_candidates_size(); ++i) {
      const v1::AutotuneCandidate& c = s.autotune_candidates(i);
      const bool chosen = i == s.autotune_choice();
      t.AddRow(
          {absl::StrCat(i), absl::StrCat(c.first_bucket_cap_mb()), absl::StrCat(c.bucket_cap_mb()),
           absl::StrCat(c.at_iteration()),
           c.scored_iterations() > 0 ? absl::StrFormat("%.1f ms", c.median_step_s() * 1e3) : "-",
           absl::StrCat(c.scored_iterations()),
           chosen ? absl::StrCat("chosen, from iteration ", s.autotune_chosen_at_iteration())
                  : ""});
    }
    absl::StrAppend(out, t.Render());
  }
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (v >= 1024 && unit + 1 < std::size(kUnits)) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string FormatMicros(double us) {
  // Sub-10 µs figures matter (a 4 KB bucket takes a few µs): keep a decimal.
  return us < 10 ? absl::StrFormat("%.1f", us) : absl::StrFormat("%.0f", us);
}

std::string FormatDuration(double seconds) {
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  const uint64_t s = static_cast<uint64_t>(seconds);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%dd%02dh%02dm", s / 86400, s / 3600 % 24, s / 60 % 60);
}

// --nonfinite=skip: the iterations not applied, and whose gradient was to
// blame (sorted: a protobuf map's order is unspecified).
static std::string NonFiniteLine(const v1::Stats& s) {
  std::string out = absl::StrFormat("non-finite gradients: %d iterations skipped",
                                    s.nonfinite_skipped_iterations());
  const std::map<std::string, uint64_t> culprits(s.nonfinite_skipped_by_culprit().begin(),
                                                 s.nonfinite_skipped_by_culprit().end());
  if (!culprits.empty()) {
    std::vector<std::string> parts;
    for (const auto& [culprit, n] : culprits) parts.push_back(absl::StrCat(n, " from ", culprit));
    absl::StrAppend(&out, " (", absl::StrJoin(parts, "; "), ")");
  }
  return absl::StrCat(out, "\n");
}

std::string FormatStatsTable(const v1::Stats& s) {
  std::string out = absl::StrFormat(
      "gradsyncd node %d of %d  job %s  generation %d  backend %s  uptime %s\n", s.node_rank(),
      s.num_nodes(), s.job_id().empty() ? "-" : s.job_id(), s.generation(),
      s.backend().empty() ? "-" : s.backend(), FormatDuration(s.uptime_s()));
  absl::StrAppendFormat(&out,
                        "world %d trainers (%d nodes x %d local)  %d iterations  %s reduced  "
                        "algbw %s  busbw %s  %d errors\n",
                        s.world_size(), s.num_nodes(), s.local_size(), s.iterations(),
                        FormatBytes(s.bytes_reduced()), Gbps(s.algbw_gbps()), Gbps(s.busbw_gbps()),
                        s.errors());
  // The cross-node hop (--wire-dtype) and uneven inputs (gs_join).
  absl::StrAppendFormat(&out,
                        "wire %s  %s sent to the cross-node allreduce  %d active trainers  "
                        "%d joined here\n",
                        s.wire_dtype().empty() ? "-" : s.wire_dtype(), FormatBytes(s.wire_bytes()),
                        s.active_trainers(), s.joined_local_trainers());
  absl::StrAppend(&out, NonFiniteLine(s));

  absl::StrAppend(&out, "\nTRAINERS\n");
  if (s.trainers_size() == 0) {
    absl::StrAppend(&out, "(none attached)\n");
  } else {
    TextTable t({{"RANK", TextTable::kRight},
                 {"LOCAL", TextTable::kRight},
                 {"PID", TextTable::kRight},
                 {"STATE", TextTable::kLeft},
                 {"ITERATIONS", TextTable::kRight},
                 {"REDUCED", TextTable::kRight},
                 {"JOINED", TextTable::kLeft}});
    for (const v1::TrainerStats& tr : s.trainers()) {
      t.AddRow({absl::StrCat(tr.rank()), absl::StrCat(tr.local_rank()), absl::StrCat(tr.pid()),
                tr.state(), absl::StrCat(tr.iterations()), FormatBytes(tr.bytes_reduced()),
                tr.joined() ? "yes" : "no"});
    }
    absl::StrAppend(&out, t.Render());
  }

  absl::StrAppend(&out, "\nBUCKETS (latency in µs: last/p50/p99)\n");
  if (s.buckets_size() == 0) {
    absl::StrAppend(&out, "(no plan yet)\n");
  } else {
    TextTable t({{"ID", TextTable::kRight},
                 {"SIZE", TextTable::kRight},
                 {"TENSORS", TextTable::kRight},
                 {"COUNT", TextTable::kRight},
                 {"TOTAL", TextTable::kRight},
                 {"WAIT FOR READY", TextTable::kRight},
                 {"LOCAL REDUCE", TextTable::kRight},
                 {"COLLECTIVE", TextTable::kRight}});
    for (const v1::BucketStats& b : s.buckets()) {
      const bool ran = b.count() > 0;
      t.AddRow({absl::StrCat(b.id()), FormatBytes(b.bytes()), absl::StrCat(b.tensor_count()),
                absl::StrCat(b.count()), LatencyCell(b.total(), ran),
                LatencyCell(b.wait_for_ready(), ran), LatencyCell(b.local_reduce(), ran),
                // One node has no cross-node step.
                LatencyCell(b.collective(), ran && s.num_nodes() > 1)});
    }
    absl::StrAppend(&out, t.Render());
  }

  AppendAutotune(s, &out);

  // Who is the straggler, in one line per named trainer (details:
  // `gradsyncctl stragglers`).
  for (const v1::TrainerLateness& t : s.stragglers()) {
    if (!t.straggler()) continue;
    absl::StrAppendFormat(&out,
                          "\nSTRAGGLER rank %d (node %d, pid %d): late by %.3f ms on average, last "
                          "in %.0f%% of %d iterations\n",
                          t.rank(), t.node_rank(), t.pid(), t.late_mean_us() / 1000,
                          t.share_last() * 100, t.window_iterations());
  }

  if (s.stalls_size() > 0) {
    absl::StrAppend(&out, "\nSTALLS\n");
    for (const v1::StallReport& st : s.stalls()) {
      absl::StrAppendFormat(&out, "iteration %d bucket %d waited %s: %s\n", st.iteration(),
                            st.bucket(), FormatDuration(st.waited_s()), st.description());
    }
  }
  if (s.recent_errors_size() > 0) {
    absl::StrAppend(&out, "\nRECENT ERRORS\n");
    for (const std::string& e : s.recent_errors()) absl::StrAppend(&out, e, "\n");
  }
  return out;
}

absl::StatusOr<std::string> FormatJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  // Scripts should find every key, zero or not.
  options.always_print_primitive_fields = true;
  // The names in control.proto, as in the docs and the Prometheus metrics.
  options.preserve_proto_field_names = true;
  std::string out;
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot convert to JSON: ", status.ToString()));
  }
  return out;
}

std::string FormatStatsPrometheus(const v1::Stats& s) {
  PromWriter w({{"node", absl::StrCat(s.node_rank())}, {"job", s.job_id()}});
  w.Gauge("gradsync_info", "Constant 1; the daemon's backend and generation as labels.",
          {{"backend", s.backend()}, {"generation", absl::StrCat(s.generation())}}, 1);
  w.Gauge("gradsync_uptime_seconds", "Seconds since the daemon started.", {}, s.uptime_s());
  w.Gauge("gradsync_world_size", "Trainers in the whole job.", {}, s.world_size());
  w.Gauge("gradsync_nodes", "Nodes (daemons) in the job.", {}, s.num_nodes());
  w.Gauge("gradsync_local_trainers", "Trainers this daemon serves.", {}, s.local_size());
  w.Counter("gradsync_iterations_total", "Synced iterations completed.", {}, s.iterations());
  w.Counter("gradsync_reduced_bytes_total", "Gradient bytes reduced per trainer, all iterations.",
            {}, s.bytes_reduced());
  w.Gauge("gradsync_algbw_bytes_per_second",
          "Algorithm bandwidth over the last iteration (nccl-tests: bytes / time).", {},
          s.algbw_gbps() * 1e9);
  w.Gauge("gradsync_busbw_bytes_per_second",
          "Bus bandwidth over the last iteration (nccl-tests: algbw * 2(n-1)/n).", {},
          s.busbw_gbps() * 1e9);
  w.Counter("gradsync_errors_total", "Errors since the daemon started.", {}, s.errors());
  w.Gauge("gradsync_stalls", "Stall reports currently held by the daemon.", {}, s.stalls_size());
  w.Gauge("gradsync_wire_info", "Constant 1; the cross-node hop's dtype (--wire-dtype) as a label.",
          {{"wire_dtype", s.wire_dtype().empty() ? "off" : s.wire_dtype()}}, 1);
  w.Counter("gradsync_wire_bytes_total",
            "Gradient payload bytes this node handed to cross-node allreduces, in the wire dtype.",
            {}, s.wire_bytes());
  w.Gauge("gradsync_active_trainers",
          "Trainers of the job still active (not joined) in the last agreed iteration.", {},
          s.active_trainers());
  w.Gauge("gradsync_joined_local_trainers", "This node's trainers that called gs_join.", {},
          s.joined_local_trainers());
  w.Counter("gradsync_nonfinite_skipped_iterations_total",
            "Iterations not applied because a gradient held a NaN or an Inf (--nonfinite=skip).",
            {}, s.nonfinite_skipped_iterations());
  const std::map<std::string, uint64_t> culprits(s.nonfinite_skipped_by_culprit().begin(),
                                                 s.nonfinite_skipped_by_culprit().end());
  for (const auto& [culprit, n] : culprits) {
    w.Counter("gradsync_nonfinite_skipped_by_culprit_total",
              "Iterations skipped (--nonfinite=skip) per trainer whose gradient held the first "
              "NaN or Inf (\"another node\": none of this node's trainers).",
              {{"culprit", culprit}}, n);
  }
  if (s.has_iteration_duration()) {
    // Daemon-wide and present from the start (zero counts): a scraper sees
    // the family before the first job, unlike the per-bucket ones.
    w.Histogram("gradsync_iteration_duration_seconds",
                "Synced iterations' duration, every job since the daemon started.", {},
                s.iteration_duration());
  }

  for (const v1::TrainerStats& t : s.trainers()) {
    const Labels rank = {{"rank", absl::StrCat(t.rank())},
                         {"local_rank", absl::StrCat(t.local_rank())}};
    Labels info = rank;
    info.push_back({"pid", absl::StrCat(t.pid())});
    info.push_back({"state", t.state()});
    w.Gauge("gradsync_trainer_info", "Constant 1; the trainer's pid and state as labels.", info, 1);
    w.Counter("gradsync_trainer_iterations_total", "Synced iterations the trainer completed.", rank,
              t.iterations());
    w.Counter("gradsync_trainer_reduced_bytes_total", "Gradient bytes reduced for the trainer.",
              rank, t.bytes_reduced());
    w.Gauge("gradsync_trainer_joined", "1 once the trainer called gs_join (uneven inputs).", rank,
            t.joined() ? 1 : 0);
  }

  for (const v1::TrainerLateness& t : s.stragglers()) {
    const Labels rank = {{"rank", absl::StrCat(t.rank())},
                         {"local_rank", absl::StrCat(t.local_rank())}};
    // Buckets, not quantiles: every node's trainers can be summed.
    w.Histogram("gradsync_trainer_lateness_seconds",
                "Per iteration, how long after the job's first trainer marked its last gradient "
                "this trainer marked its own last one; every iteration of the job.",
                rank, t.lateness());
    w.Gauge("gradsync_trainer_lateness_mean_seconds",
            "The trainer's mean lateness over the straggler window.", rank, t.late_mean_us() / 1e6);
    w.Gauge("gradsync_trainer_last_share",
            "Share of the straggler window's iterations in which the trainer marked last of "
            "the job.",
            rank, t.share_last());
    w.Gauge("gradsync_trainer_straggler",
            "1 while the trainer is named a straggler (--straggler-share, --straggler-late-ms).",
            rank, t.straggler() ? 1 : 0);
  }

  for (const v1::BucketStats& b : s.buckets()) {
    const Labels bucket = {{"bucket", absl::StrCat(b.id())}};
    w.Gauge("gradsync_bucket_size_bytes", "Bytes in the bucket.", bucket, b.bytes());
    w.Gauge("gradsync_bucket_tensors", "Tensors in the bucket.", bucket, b.tensor_count());
    w.Counter("gradsync_bucket_reductions_total", "Times the bucket was reduced.", bucket,
              b.count());
    const std::pair<const char*, const v1::LatencyStats*> phases[] = {
        {"total", &b.total()},
        {"wait_for_ready", &b.wait_for_ready()},
        {"local_reduce", &b.local_reduce()},
        {"collective", &b.collective()},
        {"write_back", &b.write_back()}};
    for (const auto& [phase, l] : phases) {
      Labels labels = bucket;
      labels.push_back({"phase", phase});
      w.Gauge("gradsync_bucket_last_latency_seconds",
              "The bucket's latest latency per phase (total: first ready to done).", labels,
              l->last_us() / 1e6);
      // Buckets, not quantiles: histograms of many nodes can be summed.
      w.Histogram("gradsync_bucket_latency_seconds",
                  "The bucket's latency per phase since the daemon started.", labels, *l);
    }
  }
  return w.Render();
}

std::string FormatStragglersTable(const v1::GetStragglersResponse& r) {
  const v1::StragglerSettings& set = r.settings();
  std::string out = absl::StrFormat(
      "job %s  window %d iterations  straggler: last in more than %.0f%% and median late by "
      "more than %s ms\n",
      r.job_id().empty() ? "-" : r.job_id(), set.window(), set.share() * 100,
      absl::StrFormat("%.1f", set.late_us() / 1000));
  if (r.trainers_size() == 0) return out + "(no trainer measured yet)\n";
  TextTable t({{"RANK", TextTable::kRight},
               {"NODE", TextTable::kRight},
               {"HOST", TextTable::kLeft},
               {"PID", TextTable::kRight},
               {"ITERS", TextTable::kRight},
               {"LATE MEAN ms", TextTable::kRight},
               {"LATE P99 ms", TextTable::kRight},
               {"LAST", TextTable::kRight},
               {"USUAL BUCKET", TextTable::kRight},
               {"STRAGGLER", TextTable::kLeft}});
  std::vector<std::string> named;
  for (const v1::TrainerLateness& tr : r.trainers()) {
    t.AddRow({absl::StrCat(tr.rank()), absl::StrCat(tr.node_rank()), tr.host(),
              absl::StrCat(tr.pid()), absl::StrCat(tr.window_iterations()),
              absl::StrFormat("%.3f", tr.late_mean_us() / 1000),
              absl::StrFormat("%.3f", tr.late_p99_us() / 1000),
              absl::StrFormat("%.0f%%", tr.share_last() * 100),
              tr.usual_bucket() < 0 ? "-" : absl::StrCat(tr.usual_bucket()),
              tr.straggler() ? "yes" : "no"});
    if (tr.straggler()) named.push_back(absl::StrCat("rank ", tr.rank()));
  }
  absl::StrAppend(&out, t.Render());
  absl::StrAppend(&out, named.empty()
                            ? "no straggler\n"
                            : absl::StrCat("straggler: ", absl::StrJoin(named, ", "), "\n"));
  return out;
}

std::string FormatConfig(const v1::Config& config) {
  std::string out;
  const google::protobuf::Descriptor* d = config.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->is_repeated() || f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      continue;  // Config is flat; anything else has no KEY=VALUE form
    }
    absl::StrAppend(&out, f->name(), "=", FieldText(config, f), "\n");
  }
  return out;
}

}  // namespace gradsync
