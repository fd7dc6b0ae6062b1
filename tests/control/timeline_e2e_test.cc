// The whole-run timeline (--trace-file): a real gradsyncd streams
// every scheduling event of the run to a Chrome trace-event JSON array,
// real mlp_trainer processes train through it.
//
//  - after a clean shutdown the file is one JSON array holding, for every
//    iteration of the run (more than the flight recorder's ring holds, as
//    GetTrace's events_overwritten shows), one complete "bucket <b>" span
//    per bucket with the bucket and iteration in args, and every trainer's
//    ready marks;
//  - a daemon killed with SIGKILL leaves an array without its "]" that
//    parses once the "]" is added (what chrome://tracing and Perfetto do);
//  - an unwritable --trace-file stops the daemon at start, naming the path.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using std::chrono::seconds;

constexpr auto kBound = seconds(60);
constexpr uint32_t kBuckets = 3;
constexpr int kTensors = 5;  // mlp_trainer's default model

// The caps that split mlp_trainer's model into three buckets (as in
// control_e2e_test).
std::vector<std::string> DaemonArgs(const std::string& trace_file) {
  return {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001", "--trace-file=" + trace_file};
}

void RunJob(Daemon& daemon, uint64_t steps) {
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(StartTrainer(daemon, r, {absl::StrCat("--steps=", steps)}, ""));
  }
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = trainers[r].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " " << st.ToString() << "\n"
                                           << trainers[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
  }
}

// GetTrace's otherData.events_overwritten: events the ring no longer holds.
uint64_t RingOverwritten(Daemon& daemon) {
  const int port = daemon.ListenPort(seconds(10));
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto stub = v1::Control::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  v1::GetTraceResponse resp;
  const grpc::Status st = stub->GetTrace(&ctx, v1::GetTraceRequest(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.error().code(), v1::OK) << resp.error().message();
  const json doc = json::parse(resp.trace_json(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  return doc["otherData"].value("events_overwritten", uint64_t{0});
}

// What the timeline holds: (iteration, bucket) -> complete "bucket <b>"
// spans (their args), and iteration -> ready marks.
struct Timeline {
  std::map<std::pair<uint64_t, uint32_t>, std::vector<json>> bucket_spans;
  std::map<uint64_t, int> ready_marks;
};

Timeline Collect(const json& events) {
  Timeline t;
  for (const json& e : events) {
    const std::string name = e.value("name", "");
    if (e.value("ph", "") == "X" && e.value("cat", "") == "bucket" &&
        name.rfind("bucket ", 0) == 0) {
      const json& a = e["args"];
      t.bucket_spans[{a["iteration"].get<uint64_t>(), a["bucket"].get<uint32_t>()}].push_back(a);
      EXPECT_EQ(name, absl::StrCat("bucket ", a["bucket"].get<uint32_t>()));
      EXPECT_GE(e["dur"].get<double>(), 0.0);
    } else if (e.value("ph", "") == "i" && name.rfind("ready ", 0) == 0) {
      ++t.ready_marks[e["args"]["iteration"].get<uint64_t>()];
    }
  }
  return t;
}

// Every iteration in [0, steps): one complete span per bucket, every mark.
void ExpectEveryIteration(const Timeline& t, uint64_t steps) {
  EXPECT_EQ(t.bucket_spans.size(), steps * kBuckets);
  for (uint64_t it = 0; it < steps; ++it) {
    for (uint32_t b = 0; b < kBuckets; ++b) {
      auto found = t.bucket_spans.find({it, b});
      ASSERT_NE(found, t.bucket_spans.end()) << "iteration " << it << " bucket " << b;
      ASSERT_EQ(found->second.size(), 1u) << "iteration " << it << " bucket " << b;
      EXPECT_FALSE(found->second[0].contains("incomplete")) << found->second[0].dump();
      EXPECT_FALSE(found->second[0].contains("truncated")) << found->second[0].dump();
    }
    auto marks = t.ready_marks.find(it);
    ASSERT_NE(marks, t.ready_marks.end()) << "iteration " << it;
    EXPECT_EQ(marks->second, 2 * kTensors) << "iteration " << it;
  }
}

TEST(TimelineE2eTest, HoldsEveryBucketOfEveryIterationOfTheRunAfterACleanShutdown) {
  ScratchDir dir;
  const std::string path = dir.File("timeline.json");
  Daemon daemon(2, DaemonArgs(path));
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  // 25 events per iteration: 1000 iterations overflow the 16384-event ring.
  constexpr uint64_t kSteps = 1000;
  RunJob(daemon, kSteps);
  if (HasFatalFailure()) return;
  EXPECT_GT(RingOverwritten(daemon), 0u) << "the run must outgrow the flight recorder's ring";

  const ExitStatus st = daemon.Stop();
  ASSERT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << daemon.process().Log();
  const json doc = json::parse(ReadFile(path), nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << "not JSON: " << ReadFile(path).substr(0, 400);
  ASSERT_TRUE(doc.is_array());
  ExpectEveryIteration(Collect(doc), kSteps);
  EXPECT_THAT(daemon.process().Log(), Not(HasSubstr("event=timeline_lost_events")));
}

TEST(TimelineE2eTest, AKilledDaemonLeavesAnArrayThatParsesOnceClosed) {
  ScratchDir dir;
  const std::string path = dir.File("timeline.json");
  Daemon daemon(2, DaemonArgs(path));
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  constexpr uint64_t kSteps = 50;
  RunJob(daemon, kSteps);
  if (HasFatalFailure()) return;

  // The writer streams while the daemon runs: wait until the last bucket of
  // the last iteration is on disk, then kill the daemon without warning.
  const std::string last = absl::StrCat("\"bucket\":", kBuckets - 1, ",\"iteration\":", kSteps - 1);
  WaitUntil([&] { return ReadFile(path).find(last) != std::string::npos; }, kBound);
  daemon.process().Signal(SIGKILL);
  daemon.process().Wait(seconds(10));

  const std::string text = ReadFile(path);
  ASSERT_NE(text.find(last), std::string::npos) << "the timeline never got the last iteration";
  EXPECT_TRUE(json::parse(text, nullptr, false).is_discarded()) << "no \"]\" after a SIGKILL";
  const json doc = json::parse(text + "]", nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded())
      << "not JSON with \"]\" added: ..." << text.substr(text.size() > 400 ? text.size() - 400 : 0);
  ExpectEveryIteration(Collect(doc), kSteps);
}

TEST(TimelineE2eTest, AnUnwritableTraceFileStopsTheDaemonAndNamesThePath) {
  ScratchDir dir;
  const std::string path = dir.File("no-such-dir/timeline.json");
  Daemon daemon(1, {"--trace-file=" + path});
  const ExitStatus st = daemon.process().Wait(kBound);
  EXPECT_TRUE(st.exited) << st.ToString();
  EXPECT_EQ(st.code, 1);
  EXPECT_THAT(daemon.process().Log(), HasSubstr("event=start_failed"));
  EXPECT_THAT(daemon.process().Log(), HasSubstr(absl::StrCat("--trace-file ", path)));
  EXPECT_THAT(daemon.process().Log(), HasSubstr("No such file or directory"));
}

}  // namespace
}  // namespace gradsync::testing
