// End-to-end tests of the operator's view of a job: a real
// gradsyncd, real mlp_trainer processes, real gRPC on the daemon's --listen
// port, and the real gradsyncctl binary.
//
//  - GetStats counts exactly the iterations, bytes and per-bucket reductions
//    the trainers ran (gRPC stub, `stats --json`, `stats --prometheus`);
//  - `config set bucket_cap_mb=...` re-plans a running job at an iteration
//    boundary without changing the math; bad values change nothing;
//  - `trace --out` holds nested spans for every bucket of the recent
//    iterations, consistent with the trainers' ready marks;
//  - server reflection lists, describes and calls every service; health
//    follows job errors;
//  - a stall shows up in GetStats, the log and a trace file;
//  - `drain` refuses new trainers and ends the daemon (exit 0) once the
//    iteration in flight has ended.
// Two more pin fixed bugs: a stall trace shows the stalled bucket; drain
// stops after the iteration in flight while trainers keep training.
//
// mlp_trainer's default model (dim 16, hidden 32), registered as
// fc1.weight[512], fc1.bias[32], fc2.weight[32], fc2.bias[1], gate[1] and
// marked in reverse order, so iteration 0's observed order equals the initial
// plan's and the one-time rebuild changes nothing.
#include <dirent.h>
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using HealthResponse = grpc::health::v1::HealthCheckResponse;

// No hang means: every process ends well within this bound.
constexpr auto kBound = seconds(30);
constexpr auto kRpcDeadline = seconds(5);

// The default model's gradient: 16*32 + 32 + 32 + 1 + 1 elements.
constexpr uint64_t kNumel = 578;
constexpr int kTensors = 5;

// Caps that split the fp32 model into three buckets in reverse registration
// order: [gate, fc2.bias] (8 B, the 104 B first cap), [fc2.weight, fc1.bias]
// (256 B, the 1048 B cap), [fc1.weight] (2048 B).
const std::vector<std::string> kTinyCaps = {"--bucket-cap-mb=0.001",
                                            "--first-bucket-cap-mb=0.0001"};

// Waits for the daemon and returns "127.0.0.1:PORT" ("" if it never started).
std::string StartedAddr(Daemon& daemon) {
  if (!daemon.WaitReady(seconds(10))) return "";
  const int port = daemon.ListenPort(seconds(10));
  return port > 0 ? absl::StrCat("127.0.0.1:", port) : "";
}

std::shared_ptr<grpc::Channel> Channel(const std::string& addr) {
  grpc::ChannelArguments args;
  // A proxy configured for downloads must not capture loopback calls.
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  return grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
}

// GetStats through the generated stub; nullopt (with a failure recorded
// unless `quiet`) if the call or the daemon failed.
std::optional<v1::Stats> GetStats(const std::string& addr, bool quiet = false) {
  auto stub = v1::Control::NewStub(Channel(addr));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetStatsResponse resp;
  const grpc::Status st = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
  if (!st.ok() || resp.error().code() != v1::OK) {
    if (!quiet) {
      ADD_FAILURE() << "GetStats: " << st.error_message() << " " << resp.error().message();
    }
    return std::nullopt;
  }
  return resp.stats();
}

// Polls GetStats until `iterations` synced iterations are counted. Trainers
// see an iteration done before the daemon's scheduler thread counts it, so
// this also absorbs that (microseconds-long) lag after they exit.
bool WaitForIterations(const std::string& addr, uint64_t iterations) {
  return WaitUntil(
      [&] {
        std::optional<v1::Stats> s = GetStats(addr, /*quiet=*/true);
        return s && s->iterations() >= iterations;
      },
      kBound);
}

HealthResponse::ServingStatus Health(const std::string& addr) {
  auto stub = grpc::health::v1::Health::NewStub(Channel(addr));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status st = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp.status();
}

struct CtlResult {
  int code = -1;  // exit code; -1 if killed or not started
  std::string out, err;
};

// Runs the real gradsyncctl against `addr`, stdout and stderr kept apart.
CtlResult RunCtl(const std::string& addr, const std::vector<std::string>& args) {
  static int counter = 0;
  const std::string base = absl::StrCat(TestTmpDir(), "/ctl.", getpid(), ".", counter++);
  const std::string out_path = base + ".out", err_path = base + ".err";
  std::vector<std::string> argv = {Runfile("tools/gradsyncctl/gradsyncctl"), "--addr=" + addr};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions options;
  options.err_path = err_path;
  Process ctl = Process::Spawn(argv, out_path, options);
  const ExitStatus status = ctl.Wait(kBound);
  CtlResult r;
  if (status.exited) r.code = status.code;
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

// `config get` output (KEY=VALUE lines) as a map.
std::map<std::string, std::string> ParseConfig(const std::string& text) {
  std::map<std::string, std::string> out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    out[kv.first] = kv.second;
  }
  return out;
}

// A numeric `config get` value ("1e-04"); NaN if absent or not a number.
double Number(const std::map<std::string, std::string>& config, const std::string& key) {
  double v = 0;
  auto it = config.find(key);
  return it != config.end() && absl::SimpleAtod(it->second, &v) ? v : std::nan("");
}

// Protobuf JSON prints uint64 as strings, other integers as numbers.
uint64_t U64(const json& v) {
  if (v.is_string()) {
    uint64_t n = 0;
    return absl::SimpleAtoi(v.get<std::string>(), &n) ? n : ~uint64_t{0};
  }
  return v.is_number() ? v.get<uint64_t>() : ~uint64_t{0};
}

// Runs `n` trainers to completion with `flags`; each must exit 0.
void RunJob(Daemon& daemon, int n, const std::vector<std::string>& flags) {
  std::vector<Process> ps;
  for (int r = 0; r < n; ++r) ps.push_back(StartTrainer(daemon, r, flags, ""));
  for (int r = 0; r < n; ++r) {
    const ExitStatus st = ps[r].Wait(kBound);
    EXPECT_TRUE(st.exited && st.code == 0) << "trainer " << r << " code " << st.code << "\n"
                                           << ps[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
  }
}

size_t CountOf(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

// ---- 1. GetStats -----------------------------------------------------------

TEST(ControlE2eTest, StatsCountEveryIterationBucketAndByteThroughStubJsonAndPrometheus) {
  Daemon daemon(2, kTinyCaps);
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  constexpr uint64_t kSteps = 12;
  constexpr uint64_t kBytes = kNumel * sizeof(float);  // per trainer per iteration
  RunJob(daemon, 2, {absl::StrCat("--steps=", kSteps)});
  // The daemon keeps the last job's stats after its trainers exit.
  ASSERT_TRUE(WaitForIterations(addr, kSteps)) << daemon.process().Log();

  std::optional<v1::Stats> s = GetStats(addr);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->world_size(), 2);
  EXPECT_EQ(s->local_size(), 2);
  EXPECT_EQ(s->num_nodes(), 1);
  EXPECT_EQ(s->iterations(), kSteps);
  EXPECT_EQ(s->bytes_reduced(), kSteps * kBytes);
  EXPECT_EQ(s->errors(), 0u);
  EXPECT_EQ(s->stalls_size(), 0);
  ASSERT_EQ(s->trainers_size(), 2);
  for (const v1::TrainerStats& t : s->trainers()) {
    EXPECT_EQ(t.iterations(), kSteps) << "local rank " << t.local_rank();
    EXPECT_EQ(t.bytes_reduced(), kSteps * kBytes) << "local rank " << t.local_rank();
    EXPECT_EQ(t.state(), "gone");
  }
  // One latency record per bucket per iteration; the plan never changed.
  const std::vector<uint64_t> kBucketBytes = {8, 256, 2048};
  const std::vector<uint32_t> kBucketTensors = {2, 2, 1};
  ASSERT_EQ(s->buckets_size(), 3);
  uint64_t bucket_bytes = 0;
  for (int b = 0; b < s->buckets_size(); ++b) {
    const v1::BucketStats& bs = s->buckets(b);
    EXPECT_EQ(bs.id(), static_cast<uint32_t>(b));
    EXPECT_EQ(bs.count(), kSteps) << "bucket " << b;
    EXPECT_EQ(bs.bytes(), kBucketBytes[b]) << "bucket " << b;
    EXPECT_EQ(bs.tensor_count(), kBucketTensors[b]) << "bucket " << b;
    // The same bucket's last iteration: its phases lie inside its total.
    EXPECT_GE(bs.total().last_us(), bs.wait_for_ready().last_us()) << "bucket " << b;
    EXPECT_GE(bs.total().last_us(), bs.local_reduce().last_us()) << "bucket " << b;
    EXPECT_EQ(bs.collective().last_us(), 0) << "one node: no cross-node step";
    bucket_bytes += bs.bytes();
  }
  EXPECT_EQ(bucket_bytes, kBytes);
  const std::string dlog = daemon.process().Log();
  EXPECT_EQ(CountOf(dlog, "event=plan_rebuilt"), 0u) << dlog;

  // The same numbers through the CLI's protobuf JSON...
  const CtlResult js = RunCtl(addr, {"stats", "--json"});
  ASSERT_EQ(js.code, 0) << js.err;
  const json doc = json::parse(js.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << js.out;
  EXPECT_EQ(U64(doc["iterations"]), kSteps) << js.out;
  EXPECT_EQ(U64(doc["bytes_reduced"]), kSteps * kBytes) << js.out;
  ASSERT_TRUE(doc["trainers"].is_array() && doc["trainers"].size() == 2) << js.out;
  for (const json& t : doc["trainers"]) {
    EXPECT_EQ(U64(t["iterations"]), kSteps) << t.dump();
    EXPECT_EQ(U64(t["bytes_reduced"]), kSteps * kBytes) << t.dump();
  }
  ASSERT_TRUE(doc["buckets"].is_array() && doc["buckets"].size() == 3) << js.out;
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_EQ(U64(doc["buckets"][b]["count"]), kSteps) << doc["buckets"][b].dump();
    EXPECT_EQ(U64(doc["buckets"][b]["bytes"]), kBucketBytes[b]) << doc["buckets"][b].dump();
  }

  // ...and its Prometheus exposition.
  const CtlResult prom = RunCtl(addr, {"stats", "--prometheus"});
  ASSERT_EQ(prom.code, 0) << prom.err;
  EXPECT_THAT(prom.out, HasSubstr("\n# TYPE gradsync_iterations_total counter\n"));
  // One sample, labelled with the node and job: NAME{LABELS} VALUE.
  auto sample = [&prom](const std::string& name) -> std::optional<std::string> {
    std::smatch m;
    if (!std::regex_search(prom.out, m,
                           std::regex("(^|\n)" + name + R"((\{[^}\n]*\})? (\S+)\n)"))) {
      return std::nullopt;
    }
    return m[3].str();
  };
  EXPECT_EQ(sample("gradsync_iterations_total"), absl::StrCat(kSteps)) << prom.out;
  EXPECT_EQ(sample("gradsync_reduced_bytes_total"), absl::StrCat(kSteps * kBytes)) << prom.out;
}

// ---- 2. config set ---------------------------------------------------------

TEST(ControlE2eTest, ConfigSetMidRunRebuildsThePlanAtABoundaryAndTrainingStaysExact) {
  Daemon daemon(2, kTinyCaps);
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  constexpr uint64_t kSteps = 30;
  const std::string steps = absl::StrCat("--steps=", kSteps);
  // Slow backward passes keep the job running while the CLI calls land.
  std::vector<Process> ps;
  std::vector<std::string> outs;
  for (int r = 0; r < 2; ++r) {
    outs.push_back(absl::StrCat(daemon.dir(), "/weights", r));
    ps.push_back(StartTrainer(daemon, r, {steps, "--fp64", "--sleep-ms=40"}, outs.back()));
  }
  const std::string ref_out = daemon.dir() + "/weights.single";
  Process ref = Process::Spawn({Runfile("tests/testing/fault_trainer"), "--single", "--quiet",
                                "--fp64", steps, "--out=" + ref_out},
                               daemon.dir() + "/single.log");

  ASSERT_TRUE(WaitForIterations(addr, 3)) << daemon.process().Log();
  const CtlResult get0 = RunCtl(addr, {"config", "get"});
  ASSERT_EQ(get0.code, 0) << get0.err;
  const std::map<std::string, std::string> initial = ParseConfig(get0.out);
  EXPECT_EQ(Number(initial, "bucket_cap_mb"), 0.001) << get0.out;
  EXPECT_EQ(Number(initial, "first_bucket_cap_mb"), 0.0001) << get0.out;

  const uint64_t before_set = GetStats(addr).value_or(v1::Stats()).iterations();
  const CtlResult set =
      RunCtl(addr, {"config", "set", "bucket_cap_mb=25", "first_bucket_cap_mb=1"});
  ASSERT_EQ(set.code, 0) << set.err;
  const uint64_t after_set = GetStats(addr).value_or(v1::Stats()).iterations();
  // Precondition, not a result: the change must land with iterations to go.
  ASSERT_LT(after_set + 1, kSteps) << "the job ended before the change could land mid-run";
  const std::map<std::string, std::string> changed = ParseConfig(set.out);
  EXPECT_EQ(Number(changed, "bucket_cap_mb"), 25) << set.out;
  EXPECT_EQ(Number(changed, "first_bucket_cap_mb"), 1) << set.out;
  EXPECT_EQ(Number(changed, "version"), Number(initial, "version") + 1) << set.out;

  // Bad values are refused as a whole (exit 1, a message) and change nothing.
  struct Bad {
    std::vector<std::string> values;
    std::string message;
  };
  const std::vector<Bad> bads = {
      {{"bucket_cap_mb=-1"}, "--bucket-cap-mb -1 is not in (0, 4096]"},
      {{"no_such_knob=1"}, "unknown key"},
      {{"log_level=loud"}, "log_level=loud"},
      {{"bucket_cap_mb=2", "log_level=loud"}, "log_level=loud"},  // all or nothing
      // Not representable as int64 milliseconds: refused before any cast.
      {{"timeout_s=1e300"}, "timeout_s=1e300: out of range"},
      {{"timeout_s=nan"}, "timeout_s=nan: out of range"},
  };
  for (const Bad& bad : bads) {
    std::vector<std::string> args = {"config", "set"};
    args.insert(args.end(), bad.values.begin(), bad.values.end());
    const CtlResult r = RunCtl(addr, args);
    EXPECT_EQ(r.code, 1) << bad.values[0] << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT")) << bad.values[0];
    EXPECT_THAT(r.err, HasSubstr(bad.message)) << bad.values[0];
    const CtlResult get = RunCtl(addr, {"config", "get"});
    ASSERT_EQ(get.code, 0) << get.err;
    EXPECT_EQ(ParseConfig(get.out), changed) << "after " << bad.values[0] << ":\n" << get.out;
  }

  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = ps[r].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << "\n" << ps[r].Log();
  }
  ASSERT_EQ(ref.Wait(kBound).code, 0) << ref.Log();

  // Exactly one re-plan (the bad sets changed nothing), at the first
  // iteration boundary after the set, from three buckets to one.
  const std::string dlog = daemon.process().Log();
  EXPECT_EQ(CountOf(dlog, "event=plan_rebuilt"), 1u) << dlog;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      dlog, m,
      std::regex(R"(event=plan_rebuilt iteration=(\d+) buckets_before=(\d+) buckets_after=(\d+))")))
      << dlog;
  const uint64_t rebuilt_at = std::stoull(m[1]);
  EXPECT_GE(rebuilt_at, before_set + 1);
  EXPECT_LE(rebuilt_at, after_set + 1);
  EXPECT_LT(rebuilt_at, kSteps) << "not mid-run";
  EXPECT_EQ(m[2], "3");
  EXPECT_EQ(m[3], "1");

  // Stats agree: bucket 0 reduced every iteration, the old buckets 1 and 2
  // only until the re-plan (counts are kept per bucket id across plans).
  std::optional<v1::Stats> s = GetStats(addr);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->iterations(), kSteps);
  EXPECT_EQ(s->bytes_reduced(), kSteps * kNumel * sizeof(double));
  ASSERT_EQ(s->buckets_size(), 3);
  EXPECT_EQ(s->buckets(0).count(), kSteps);
  EXPECT_EQ(s->buckets(0).bytes(), kNumel * sizeof(double));
  EXPECT_EQ(s->buckets(0).tensor_count(), static_cast<uint32_t>(kTensors));
  EXPECT_EQ(s->buckets(1).count(), rebuilt_at);
  EXPECT_EQ(s->buckets(2).count(), rebuilt_at);

  // Still the same training as one process on the whole batch.
  const std::vector<double> reference = LoadWeights(ref_out);
  ASSERT_EQ(reference.size(), kNumel);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(RelativeDifference(LoadWeights(outs[r]), reference), 1e-12) << "trainer " << r;
  }
}

// ---- 3. trace --------------------------------------------------------------

struct Span {
  double start = 0, end = 0;
  json args;
};

// `inner` lies within `outer`; the slack absorbs ts + dur rounding (µs doubles).
bool Within(const Span& inner, const Span& outer) {
  constexpr double kSlackUs = 1e-3;
  return inner.start >= outer.start - kSlackUs && inner.end <= outer.end + kSlackUs;
}

TEST(ControlE2eTest, TraceHasNestedSpansForEveryBucketOfTheRecordedIterations) {
  Daemon daemon(2, kTinyCaps);
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  constexpr uint64_t kSteps = 20;
  constexpr uint32_t kBuckets = 3;
  RunJob(daemon, 2, {absl::StrCat("--steps=", kSteps)});
  ASSERT_TRUE(WaitForIterations(addr, kSteps));

  const std::string path = daemon.dir() + "/trace.json";
  const CtlResult r = RunCtl(addr, {"trace", "--out", path});
  ASSERT_EQ(r.code, 0) << r.err;
  const json doc = json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << "not JSON";
  ASSERT_TRUE(doc.contains("traceEvents") && doc["traceEvents"].is_array());

  // (iteration, bucket) -> span name -> spans; iteration -> ready marks.
  std::map<std::pair<uint64_t, uint32_t>, std::map<std::string, std::vector<Span>>> spans;
  std::map<uint64_t, std::vector<double>> marks;
  std::set<std::string> track_names;
  for (const json& e : doc["traceEvents"]) {
    const std::string ph = e.value("ph", "");
    if (ph == "M" && e.value("name", "") == "thread_name") {
      track_names.insert(e["args"]["name"].get<std::string>());
    } else if (ph == "X" && e.value("cat", "") == "bucket") {
      const double ts = e["ts"].get<double>();
      const uint64_t it = e["args"]["iteration"].get<uint64_t>();
      const uint32_t b = e["args"]["bucket"].get<uint32_t>();
      spans[{it, b}][e["name"].get<std::string>()].push_back(
          Span{ts, ts + e["dur"].get<double>(), e["args"]});
    } else if (ph == "i" && absl::StartsWith(e.value("name", ""), "ready ")) {
      marks[e["args"]["iteration"].get<uint64_t>()].push_back(e["ts"].get<double>());
    }
  }
  for (const char* t : {"trainer 0", "trainer 1", "bucket 0", "bucket 1", "bucket 2"}) {
    EXPECT_EQ(track_names.count(t), 1u) << t;
  }
  ASSERT_FALSE(spans.empty());
  // The ring wraps: its oldest iteration may be cut; every later one is whole.
  const uint64_t oldest = spans.begin()->first.first;
  const uint64_t newest = spans.rbegin()->first.first;
  EXPECT_EQ(newest, kSteps - 1);
  EXPECT_GE(newest - oldest, 8u) << "the recorder keeps at least the last 8 iterations";
  EXPECT_EQ(doc["otherData"]["events_overwritten"].get<uint64_t>() > 0, oldest > 0);

  for (uint64_t it = oldest + 1; it <= newest; ++it) {
    std::vector<Span> waits;
    for (uint32_t b = 0; b < kBuckets; ++b) {
      SCOPED_TRACE(absl::StrCat("iteration ", it, " bucket ", b));
      auto found = spans.find({it, b});
      ASSERT_NE(found, spans.end());
      auto& named = found->second;
      for (const char* n : {"wait for ready", "reduce", "local reduce"}) {
        ASSERT_EQ(named[n].size(), 1u) << n;
      }
      ASSERT_EQ(named[absl::StrCat("bucket ", b)].size(), 1u);
      EXPECT_EQ(named.count("collective"), 0u) << "one node: no cross-node step";
      const Span& bucket = named[absl::StrCat("bucket ", b)][0];
      const Span& wait = named["wait for ready"][0];
      const Span& reduce = named["reduce"][0];
      const Span& local = named["local reduce"][0];
      EXPECT_FALSE(bucket.args.contains("incomplete")) << bucket.args.dump();
      EXPECT_FALSE(bucket.args.contains("truncated")) << bucket.args.dump();
      // The data flow: the bucket = wait for ready, then reduce; reduce
      // contains the local reduce.
      EXPECT_TRUE(Within(wait, bucket));
      EXPECT_TRUE(Within(reduce, bucket));
      EXPECT_LE(wait.end, reduce.start + 1e-3) << "reduce starts after the last gradient is ready";
      EXPECT_TRUE(Within(local, reduce));
      waits.push_back(wait);
    }
    // Every trainer marked every tensor, each mark inside the wait of a bucket.
    SCOPED_TRACE(absl::StrCat("iteration ", it));
    EXPECT_EQ(marks[it].size(), 2u * kTensors);
    for (double ts : marks[it]) {
      EXPECT_TRUE(std::any_of(waits.begin(), waits.end(),
                              [ts](const Span& w) {
                                return Within(Span{ts, ts, {}}, w);
                              }))
          << "a ready mark at " << ts << " us outside every bucket's wait for ready";
    }
  }
}

// ---- 4. reflection and health ----------------------------------------------

using ReflectionStream =
    grpc::ClientReaderWriter<grpc::reflection::v1alpha::ServerReflectionRequest,
                             grpc::reflection::v1alpha::ServerReflectionResponse>;

// The services reflection lists on `stream`, in its order (empty, with a
// failure recorded, when it did not answer with a list).
std::vector<std::string> ListServices(ReflectionStream& stream) {
  namespace refl = grpc::reflection::v1alpha;
  refl::ServerReflectionRequest list;
  list.set_list_services("");
  refl::ServerReflectionResponse resp;
  if (!stream.Write(list) || !stream.Read(&resp) || !resp.has_list_services_response()) {
    ADD_FAILURE() << "reflection did not list the services: " << resp.DebugString();
    return {};
  }
  std::vector<std::string> services;
  for (const refl::ServiceResponse& s : resp.list_services_response().service()) {
    services.push_back(s.name());
  }
  return services;
}

TEST(ControlE2eTest, ReflectionListsTheServicesAndHealthFollowsJobErrors) {
  Daemon daemon(2, {"--timeout-s=30"});
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();

  {
    namespace refl = grpc::reflection::v1alpha;
    auto stub = refl::ServerReflection::NewStub(Channel(addr));
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto stream = stub->ServerReflectionInfo(&ctx);
    const std::vector<std::string> listed = ListServices(*stream);
    const std::set<std::string> services(listed.begin(), listed.end());
    refl::ServerReflectionResponse resp;
    for (const char* s : {"gradsync.v1.Control", "grpc.health.v1.Health",
                          "grpc.reflection.v1alpha.ServerReflection"}) {
      EXPECT_EQ(services.count(s), 1u) << s;
    }
    // A gRPC CLI can also fetch the schema: the file defining Control.
    refl::ServerReflectionRequest symbol;
    symbol.set_file_containing_symbol("gradsync.v1.Control");
    ASSERT_TRUE(stream->Write(symbol));
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_TRUE(resp.has_file_descriptor_response()) << resp.DebugString();
    bool found_control = false;
    for (const std::string& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(bytes));
      if (file.name() != "gradsync/v1/control.proto") continue;
      EXPECT_EQ(file.package(), "gradsync.v1");
      ASSERT_EQ(file.service_size(), 1);
      EXPECT_EQ(file.service(0).name(), "Control");
      std::set<std::string> methods;
      for (const auto& m : file.service(0).method()) methods.insert(m.name());
      EXPECT_EQ(methods, (std::set<std::string>{"GetStats", "GetConfig", "SetConfig", "GetTrace",
                                                "Drain", "GetStragglers"}));
      found_control = true;
    }
    EXPECT_TRUE(found_control);
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
  }

  EXPECT_EQ(Health(addr), HealthResponse::SERVING);
  CtlResult h = RunCtl(addr, {"health"});
  EXPECT_EQ(h.code, 0) << h.err;
  EXPECT_EQ(h.out, "SERVING\n");

  // A trainer SIGKILLed mid-iteration fails the job: NOT_SERVING.
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) {
    ps.push_back(StartTrainer(daemon, r, {"--steps=1000", "--sleep-ms=50"}, ""));
  }
  ASSERT_TRUE(WaitForIterations(addr, 2)) << daemon.process().Log();
  EXPECT_EQ(Health(addr), HealthResponse::SERVING) << "while the job runs";
  ps[1].Signal(SIGKILL);
  EXPECT_EQ(ps[1].Wait(kBound).code, SIGKILL);
  const ExitStatus survivor = ps[0].Wait(kBound);
  EXPECT_FALSE(survivor.timed_out) << "the surviving trainer hung";
  EXPECT_EQ(survivor.code, kExitPeerFailed) << ps[0].Log();
  // The death is noticed asynchronously (its Watch stream breaks).
  WaitUntil([&] { return Health(addr) != HealthResponse::SERVING; }, kBound);
  EXPECT_EQ(Health(addr), HealthResponse::NOT_SERVING);
  h = RunCtl(addr, {"health"});
  EXPECT_EQ(h.code, 1) << h.err;
  EXPECT_EQ(h.out, "NOT_SERVING\n");
  std::optional<v1::Stats> s = GetStats(addr);
  ASSERT_TRUE(s.has_value());
  EXPECT_GE(s->errors(), 1u);

  // A new job that runs makes the daemon SERVING again.
  RunJob(daemon, 2, {"--steps=5"});
  EXPECT_EQ(Health(addr), HealthResponse::SERVING);
  h = RunCtl(addr, {"health"});
  EXPECT_EQ(h.code, 0) << h.err;
  EXPECT_EQ(h.out, "SERVING\n");
}

// What grpcurl does with no .proto files: list the services, fetch each
// one's schema by its name, then call it with messages built from that
// schema alone (a separate pool, dynamic messages, raw bytes on the wire).
// Every listed service must be describable; the unary ones get called.
TEST(ControlE2eTest, ReflectionAloneDescribesAndCallsEveryListedService) {
  Daemon daemon(2, {"--timeout-s=30"});
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  namespace refl = grpc::reflection::v1alpha;
  namespace pb = google::protobuf;

  auto reflection = refl::ServerReflection::NewStub(Channel(addr));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  auto stream = reflection->ServerReflectionInfo(&ctx);
  const std::vector<std::string> services = ListServices(*stream);
  ASSERT_EQ(services.size(), 3u) << absl::StrJoin(services, ", ");
  refl::ServerReflectionResponse resp;

  pb::SimpleDescriptorDatabase schemas;
  std::set<std::string> added;
  for (const std::string& service : services) {
    refl::ServerReflectionRequest symbol;
    symbol.set_file_containing_symbol(service);
    ASSERT_TRUE(stream->Write(symbol));
    ASSERT_TRUE(stream->Read(&resp));
    ASSERT_TRUE(resp.has_file_descriptor_response())
        << service << " cannot be described: " << resp.DebugString();
    for (const std::string& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
      pb::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(bytes)) << service;
      if (added.insert(file.name()).second) {
        ASSERT_TRUE(schemas.Add(file)) << file.name();
      }
    }
  }
  stream->WritesDone();
  const grpc::Status reflection_status = stream->Finish();
  EXPECT_TRUE(reflection_status.ok()) << reflection_status.error_message();

  pb::DescriptorPool pool(&schemas);
  pb::DynamicMessageFactory factory(&pool);
  // The read-only unary method to call on each service (the reflection
  // service itself was called above: it is a stream).
  const std::map<std::string, std::string> calls = {{"gradsync.v1.Control", "GetStats"},
                                                    {"grpc.health.v1.Health", "Check"}};
  for (const std::string& service : services) {
    const pb::ServiceDescriptor* described = pool.FindServiceByName(service);
    ASSERT_NE(described, nullptr) << service << " is listed but its schema does not define it";
    EXPECT_GT(described->method_count(), 0) << service;
    const auto call = calls.find(service);
    if (call == calls.end()) {
      EXPECT_EQ(service, "grpc.reflection.v1alpha.ServerReflection");
      continue;
    }
    const pb::MethodDescriptor* method = described->FindMethodByName(call->second);
    ASSERT_NE(method, nullptr) << service << "." << call->second;
    std::unique_ptr<pb::Message> request(factory.GetPrototype(method->input_type())->New());
    std::string request_bytes;
    ASSERT_TRUE(request->SerializeToString(&request_bytes));
    grpc::Slice slice(request_bytes);
    grpc::ByteBuffer request_buffer(&slice, 1);

    grpc::GenericStub generic(Channel(addr));
    grpc::ClientContext call_ctx;
    SetDeadline(&call_ctx);
    grpc::CompletionQueue cq;
    const std::string path = absl::StrCat("/", service, "/", method->name());
    auto reader = generic.PrepareUnaryCall(&call_ctx, path, request_buffer, &cq);
    reader->StartCall();
    grpc::ByteBuffer reply_buffer;
    grpc::Status st;
    reader->Finish(&reply_buffer, &st, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_TRUE(ok);
    ASSERT_TRUE(st.ok()) << path << ": " << st.error_message();
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(reply_buffer.Dump(&slices).ok());
    std::string reply_bytes;
    for (const grpc::Slice& s : slices) reply_bytes.append(s.begin(), s.end());
    std::unique_ptr<pb::Message> reply(factory.GetPrototype(method->output_type())->New());
    ASSERT_TRUE(reply->ParseFromString(reply_bytes)) << path;
    const pb::Reflection* fields = reply->GetReflection();
    if (service == "grpc.health.v1.Health") {
      const pb::FieldDescriptor* status = method->output_type()->FindFieldByName("status");
      ASSERT_NE(status, nullptr);
      EXPECT_EQ(fields->GetEnum(*reply, status)->name(), "SERVING");
    } else {
      const pb::FieldDescriptor* stats = method->output_type()->FindFieldByName("stats");
      ASSERT_NE(stats, nullptr);
      EXPECT_TRUE(fields->HasField(*reply, stats)) << reply->DebugString();
    }
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }
}

// ---- 5. stall --------------------------------------------------------------

std::vector<std::string> TraceFiles(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (absl::StartsWith(name, "gradsync-trace-") && absl::EndsWith(name, ".json")) {
        out.push_back(dir + "/" + name);
      }
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The trace file the daemon wrote for the stall of bucket 0 in iteration 1
// (null if none); every trace file in `dir` must be valid trace JSON.
json StallTrace(const std::string& dir) {
  json found;
  for (const std::string& f : TraceFiles(dir)) {
    const json doc = json::parse(ReadFile(f), nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(doc.is_discarded()) << f << " is not JSON";
    if (doc.is_discarded()) continue;
    EXPECT_TRUE(doc.contains("traceEvents") && doc["traceEvents"].is_array()) << f;
    if (absl::StartsWith(doc["otherData"].value("reason", ""), "stall: bucket 0 of iteration 1")) {
      found = doc;
    }
  }
  return found;
}

// Local rank 1 never marks fc1.weight after step 0: iteration 1 stalls (a
// report after 1 s), then times out (4 s). Its own wait deadline is longer
// than the daemon's, so the daemon's diagnosis is what both trainers get.
struct StallRun {
  ScratchDir logs_dir;  // the daemon's $LOGS_DIRECTORY
  std::string logs = logs_dir.path();
  Daemon daemon{2, {"--stall-threshold-s=1", "--timeout-s=4"}, {{"LOGS_DIRECTORY", logs}}};
  std::string addr = StartedAddr(daemon);

  void Run() {
    ASSERT_FALSE(addr.empty()) << daemon.process().Log();
    Process ok = StartTrainer(daemon, 0, {"--steps=5"}, "");
    Process stuck =
        StartTrainer(daemon, 1, {"--steps=5", "--withhold=0", "--wait-timeout-ms=60000"}, "");
    const ExitStatus a = ok.Wait(kBound), b = stuck.Wait(kBound);
    EXPECT_EQ(a.code, kExitTimeout) << ok.Log();
    EXPECT_EQ(b.code, kExitTimeout) << stuck.Log();
  }
};

TEST(ControlE2eTest, StallShowsInStatsLogAndATraceFileInLogsDirectory) {
  StallRun run;
  ASSERT_NO_FATAL_FAILURE(run.Run());

  std::optional<v1::Stats> s = GetStats(run.addr);
  ASSERT_TRUE(s.has_value());
  ASSERT_GE(s->stalls_size(), 1) << s->DebugString();
  const v1::StallReport& stall = s->stalls(0);
  EXPECT_EQ(stall.iteration(), 1u);
  EXPECT_EQ(stall.bucket(), 0u);
  EXPECT_GE(stall.waited_s(), 1.0) << "reported before the threshold";
  EXPECT_THAT(stall.description(), HasSubstr("rank 1 (local 1"));
  EXPECT_THAT(stall.description(), HasSubstr("fc1.weight"));
  EXPECT_THAT(stall.description(), Not(HasSubstr("rank 0 (local 0"))) << "rank 0 marked all";
  EXPECT_GE(s->errors(), 1u);
  ASSERT_GE(s->recent_errors_size(), 1);
  EXPECT_THAT(s->recent_errors(0), HasSubstr("made no progress"));
  // The CLI's JSON carries the same report.
  const CtlResult js = RunCtl(run.addr, {"stats", "--json"});
  ASSERT_EQ(js.code, 0) << js.err;
  const json doc = json::parse(js.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(!doc.is_discarded() && doc["stalls"].is_array() && !doc["stalls"].empty()) << js.out;
  EXPECT_EQ(doc["stalls"][0]["description"], stall.description());

  const std::string dlog = run.daemon.process().Log();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dlog, m, std::regex(R"(event=stall iteration=1 [^\n]*)"))) << dlog;
  EXPECT_THAT(m.str(), HasSubstr("rank 1 (local 1"));
  EXPECT_THAT(m.str(), HasSubstr("fc1.weight"));
  EXPECT_THAT(dlog, HasSubstr("event=trace_written path=" + run.logs + "/gradsync-trace-"));

  // The stall's trace file in $LOGS_DIRECTORY: valid JSON that shows who
  // marked what in the stuck iteration — everything but rank 1's fc1.weight.
  const json trace = StallTrace(run.logs);
  ASSERT_FALSE(trace.is_null()) << "no trace file with the stall's reason in " << run.logs;
  std::map<int64_t, std::string> tracks;  // tid -> "trainer N"
  for (const json& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      tracks[e["tid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
    }
  }
  std::map<std::string, std::set<std::string>> marked;  // trainer -> marks in iteration 1
  for (const json& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "i" && e["args"].value("iteration", uint64_t{0}) == 1) {
      marked[tracks[e["tid"].get<int64_t>()]].insert(e["name"].get<std::string>());
    }
  }
  const std::set<std::string> all = {"ready gate", "ready fc2.bias", "ready fc2.weight",
                                     "ready fc1.bias", "ready fc1.weight"};
  std::set<std::string> all_but_fc1_weight = all;
  all_but_fc1_weight.erase("ready fc1.weight");
  EXPECT_EQ(marked["trainer 0"], all);
  EXPECT_EQ(marked["trainer 1"], all_but_fc1_weight);
}

// Regression: a stalled bucket used to be missing from the stall trace
// (first/last ready were recorded only when the bucket completed).
TEST(ControlE2eTest, StallTraceShowsTheStalledBucketAsAnOpenSpan) {
  StallRun run;
  ASSERT_NO_FATAL_FAILURE(run.Run());
  const json trace = StallTrace(run.logs);
  ASSERT_FALSE(trace.is_null()) << "no trace file with the stall's reason in " << run.logs;
  bool open_bucket = false;
  for (const json& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("name", "") == "bucket 0" &&
        e["args"].value("iteration", uint64_t{0}) == 1 && e["args"].value("incomplete", false)) {
      open_bucket = true;
    }
  }
  EXPECT_TRUE(open_bucket) << "no incomplete span for the stalled bucket 0 of iteration 1:\n"
                           << trace.dump(1);
}

// ---- 6. drain --------------------------------------------------------------

// Ready marks per iteration in the daemon's flight recorder (GetTrace).
std::map<uint64_t, int> ReadyMarks(const std::string& addr) {
  auto stub = v1::Control::NewStub(Channel(addr));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetTraceResponse resp;
  std::map<uint64_t, int> marks;
  if (!stub->GetTrace(&ctx, v1::GetTraceRequest(), &resp).ok()) return marks;
  const json doc = json::parse(resp.trace_json(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("traceEvents")) return marks;
  for (const json& e : doc["traceEvents"]) {
    if (e.value("ph", "") == "i" && absl::StartsWith(e.value("name", ""), "ready ")) {
      ++marks[e["args"]["iteration"].get<uint64_t>()];
    }
  }
  return marks;
}

// Polls until the recorder holds `count` ready marks of `iteration`.
bool WaitForMarks(const std::string& addr, uint64_t iteration, int count) {
  return WaitUntil([&] { return ReadyMarks(addr)[iteration] >= count; }, kBound);
}

// The iteration in flight at the drain cannot finish (rank 1 withholds a
// gradient), so the daemon is observably draining until that iteration ends
// (here: times out); only then does it stop, with exit code 0.
TEST(ControlE2eTest, DrainRefusesNewTrainersAndExitsZeroOnceTheIterationInFlightEnds) {
  Daemon daemon(2, {"--timeout-s=3"});
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  Process ok = StartTrainer(daemon, 0, {"--steps=100"}, "");
  Process stuck =
      StartTrainer(daemon, 1, {"--steps=100", "--withhold=0", "--wait-timeout-ms=60000"}, "");
  // Iteration 1 is in flight: rank 0 marked its 5 gradients, rank 1 its 4.
  ASSERT_TRUE(WaitForMarks(addr, 1, 9)) << daemon.process().Log();

  const CtlResult drain = RunCtl(addr, {"drain"});
  ASSERT_EQ(drain.code, 0) << drain.err;
  EXPECT_THAT(drain.out, HasSubstr("is draining"));
  Process late = StartTrainer(daemon, 0, {"--steps=1"}, "");
  const ExitStatus l = late.Wait(kBound);
  EXPECT_EQ(l.code, kExitUnavailable) << late.Log();
  EXPECT_THAT(late.Log(), HasSubstr("draining")) << "refused for another reason";

  const ExitStatus d = daemon.process().Wait(kBound);
  EXPECT_FALSE(d.timed_out) << "the daemon did not stop\n" << daemon.process().Log();
  EXPECT_TRUE(d.exited && d.code == 0) << "code " << d.code << "\n" << daemon.process().Log();
  for (Process* p : {&ok, &stuck}) {
    const ExitStatus st = p->Wait(kBound);
    EXPECT_FALSE(st.timed_out) << "a trainer hung\n" << p->Log();
    // The iteration in flight timed out, naming who held it up.
    EXPECT_TRUE(st.exited && st.code == kExitTimeout) << "code " << st.code << "\n" << p->Log();
    EXPECT_THAT(p->Log(), HasSubstr("rank 1 (local 1")) << "the culprit is not named";
  }
  // In this order: the drain, the end of the iteration in flight, the stop.
  const std::string dlog = daemon.process().Log();
  const size_t requested = dlog.find("event=drain_requested");
  const size_t failed = dlog.find("event=job_failed");
  const size_t shutdown = dlog.find("event=shutdown reason=\"drain\"");
  const size_t stopped = dlog.find("event=stopped");
  ASSERT_NE(requested, std::string::npos) << dlog;
  ASSERT_NE(failed, std::string::npos) << dlog;
  ASSERT_NE(shutdown, std::string::npos) << dlog;
  ASSERT_NE(stopped, std::string::npos) << dlog;
  EXPECT_LT(requested, failed) << dlog;
  EXPECT_LT(failed, shutdown) << dlog;
  EXPECT_LT(shutdown, stopped) << dlog;
}

// Regression: drain used to poll for a gap between iterations, which
// trainers close within microseconds, and so kept training.
TEST(ControlE2eTest, DrainStopsAfterTheIterationInFlightWhileTrainersKeepTraining) {
  // --timeout-s bounds the drain's wait, so the bug shows as extra steps.
  Daemon daemon(2, {"--timeout-s=10"});
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  // Not --quiet: local rank 0 prints "step N" after each completed iteration.
  // A long backward pass (marks, then the sleep): the drain lands mid-iteration.
  std::vector<Process> ps;
  for (int r = 0; r < 2; ++r) {
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", std::to_string(r)}};
    ps.push_back(Process::Spawn({Runfile("tests/testing/fault_trainer"),
                                 "--socket=" + daemon.socket(), "--steps=1000", "--sleep-ms=1500"},
                                absl::StrCat(daemon.dir(), "/drain.trainer", r), options));
  }
  ASSERT_TRUE(WaitForIterations(addr, 2)) << daemon.process().Log();
  const uint64_t in_flight = GetStats(addr).value_or(v1::Stats()).iterations();
  ASSERT_TRUE(WaitForMarks(addr, in_flight, 1)) << daemon.process().Log();

  const CtlResult drain = RunCtl(addr, {"drain"});
  ASSERT_EQ(drain.code, 0) << drain.err;
  const ExitStatus d = daemon.process().Wait(kBound);
  EXPECT_FALSE(d.timed_out) << "the daemon did not stop\n" << daemon.process().Log();
  EXPECT_TRUE(d.exited && d.code == 0) << "code " << d.code << "\n" << daemon.process().Log();
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = ps[r].Wait(kBound);
    EXPECT_FALSE(st.timed_out) << "trainer " << r << " hung";
    // The daemon went away after the drain: it says so, and why.
    EXPECT_TRUE(st.exited && st.code == kExitUnavailable)
        << "trainer " << r << " code " << st.code << "\n"
        << ps[r].Log();
    EXPECT_THAT(ps[r].Log(), HasSubstr("drain")) << "trainer " << r;
  }
  // Steps 0..in_flight completed (the one in flight included), no more.
  EXPECT_EQ(CountOf(ps[0].Log(), "step "), in_flight + 1) << ps[0].Log();
}

}  // namespace
}  // namespace gradsync::testing
