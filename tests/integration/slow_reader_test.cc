// Peers that open Control reads on the leader's --listen port and never
// read the replies (real HTTP/2 connections with a zero flow-control
// window, tests/integration/slow_reader.h) cannot starve the job's own
// traffic there: in the default configuration (reads open without a
// token) a 2-node job trains to the exact single-process result while they
// hammer its leader, a fresh client's GetStats answers while they are
// still connected (or is refused naming the bound while they hold calls),
// and the leader stops on SIGTERM while they hold calls.
#include "tests/integration/slow_reader.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/cluster.h"
#include "tests/integration/control_stats.h"
#include "tests/integration/harness.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Hang guards only: nothing here is a timing threshold.
constexpr auto kBound = seconds(120);

// Control.GetStats on 127.0.0.1:`port`, its gRPC status as is.
grpc::Status ControlGetStats(int port) {
  auto stub = v1::Control::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + seconds(10));
  v1::GetStatsResponse response;
  return stub->GetStats(&context, v1::GetStatsRequest(), &response);
}

size_t Count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) {
    ++n;
  }
  return n;
}

TEST(SlowReader, UnreadControlRepliesOnTheLeaderNeitherStopTheJobNorItsShutdown) {
  ClusterOptions options;
  options.nodes = 2;
  options.local_size = 1;
  options.job_id = "slowjob";
  // The default configuration: a job token, reads open without it.
  options.flags = {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001", "--timeout-s=15"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();

  // Long enough (sleep inside every backward) that the readers arrive while
  // the job trains and heart-beats through the leader's --listen port.
  const std::vector<std::string> args = {"--steps=300", "--batch=60", "--fp64", "--sleep-ms=40"};
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(args, &outs);
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=job_running", kBound))
      << cluster.DaemonLogs();

  // 5 connections x 20 reads, none of whose replies may be sent: more calls
  // than the leader's --listen server has threads.
  constexpr int kConnections = 5, kCallsEach = 20;
  std::vector<std::unique_ptr<SlowReader>> readers;
  for (int c = 0; c < kConnections; ++c) {
    readers.push_back(std::make_unique<SlowReader>());
    ASSERT_TRUE(readers.back()->Connect(cluster.port()).ok());
    for (int i = 0; i < kCallsEach; ++i) {
      const char* method =
          i % 2 == 0 ? "/gradsync.v1.Control/GetTrace" : "/gradsync.v1.Control/GetStats";
      ASSERT_TRUE(readers.back()->Call(method).ok());
    }
  }

  for (size_t t = 0; t < trainers.size(); ++t) {
    const ExitStatus st = trainers[t].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << t << " ended with " << st.code << "\n"
                                           << trainers[t].Log() << cluster.DaemonLogs();
  }
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  const std::vector<double> first = LoadWeights(outs[0]);
  for (const std::string& out : outs) {
    const std::vector<double> got = LoadWeights(out);
    EXPECT_LE(RelativeDifference(got, expected), 1e-12) << out;
    EXPECT_EQ(got, first) << out << " differs from node 0's trainer 0";
  }

  // With the readers still connected, a fresh client is served: the calls
  // they hold end once their replies are overdue.
  absl::StatusOr<v1::Stats> stats = absl::UnknownError("not asked");
  WaitUntil(
      [&] {
        stats = GetStats(cluster.port());
        return stats.ok();
      },
      kBound);
  ASSERT_TRUE(stats.ok()) << stats.status() << "\n" << cluster.DaemonLogs();
  EXPECT_EQ(stats->node_rank(), 0);
  for (const auto& reader : readers) EXPECT_EQ(reader->calls(), kCallsEach);
  // The readers' calls really were held and then ended by the leader.
  const std::string leader_log = cluster.node(0).process().Log();
  EXPECT_GT(Count(leader_log, "event=control_reply_overdue"), 0u) << leader_log;

  // The readers hold calls again: a fresh reader from their address is
  // refused at once, naming the bound, instead of waiting behind them.
  // (GetStats: answered at once, so every admitted one is held; a GetTrace
  // may instead be refused while others wait to be rendered.)
  for (const auto& reader : readers) {
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(reader->Call("/gradsync.v1.Control/GetStats").ok());
  }
  grpc::Status refused;
  WaitUntil(
      [&] {
        refused = ControlGetStats(cluster.port());
        return !refused.ok();
      },
      kBound);
  for (const auto& reader : readers) ASSERT_FALSE(reader->closed()) << "the leader closed a reader";
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message() << "\n"
      << cluster.node(0).process().Log();
  EXPECT_NE(refused.error_message().find("Control.GetStats refused"), std::string::npos)
      << refused.error_message();
  EXPECT_NE(refused.error_message().find("max_control_calls_per_peer"), std::string::npos)
      << refused.error_message();

  // SIGTERM while they hold them: the leader exits cleanly.
  cluster.node(0).process().Signal(SIGTERM);
  const ExitStatus leader = cluster.node(0).process().Wait(kBound);
  EXPECT_TRUE(leader.exited && leader.code == 0) << "the leader did not exit on SIGTERM\n"
                                                 << cluster.node(0).process().Log();
}

}  // namespace
}  // namespace gradsync::testing
