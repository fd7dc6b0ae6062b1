// The Rendezvous service over real gRPC on loopback, driven by
// RendezvousClients from threads of this process (one thread per node).
// Covers join rounds and refusals, timeouts, aborts (error, Leave, missed
// heartbeats), re-forming, and the generation-scoped key-value store.
#include "daemon/cluster/rendezvous_service.h"

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/call_token.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "daemon/cluster/rendezvous_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/multinode/test_leader.h"
#include "tests/testing/loopback_port.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = "rdv-job";
constexpr char kToken[] = "s3cret-t0ken";

// A machine's two clocks, moved by hand (the real ones cannot be stepped in
// a test): the wall clock, which NTP or an operator may step, and the
// monotonic clock, which only real elapsed time moves. The service reads
// them from gRPC threads.
class FakeMachineClocks {
 public:
  // Someone sets the date: only the wall clock jumps.
  void StepWallClock(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    wall_ += d;
  }
  // Real time goes by: both clocks move.
  void Elapse(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    wall_ += d;
    monotonic_ += d;
  }
  MonotonicClock Monotonic() {
    return [this] {
      absl::MutexLock lock(&mu_);
      return monotonic_;
    };
  }
  MonotonicClock Wall() {
    return [this] {
      absl::MutexLock lock(&mu_);
      return wall_;
    };
  }

 private:
  absl::Mutex mu_;
  absl::Time wall_ = absl::FromUnixSeconds(1'700'000'000);
  absl::Time monotonic_ = absl::FromUnixSeconds(12'345);
};

// absl::string_view prints as a char array in gtest: compare std::strings.
std::string Msg(const absl::Status& status) { return std::string(status.message()); }

class RendezvousServiceTest : public ::testing::Test {
 protected:
  void StartLeader(int num_nodes, absl::Duration heartbeat_timeout = absl::Minutes(10),
                   MonotonicClock clock = MonotonicNow) {
    leader_ = std::make_unique<TestLeader>(kJob, kToken, num_nodes, absl::Seconds(20),
                                           heartbeat_timeout, std::move(clock));
    ASSERT_FALSE(leader_->address().empty());
    num_nodes_ = num_nodes;
  }

  // True once some Wait is blocked in the service on missing keys (polled
  // state, within 10 s).
  bool BlockedWaitSeen() {
    return WaitUntil([&] { return leader_->service().GetStatus().blocked_waits != 0; },
                     absl::Seconds(10));
  }

  std::unique_ptr<RendezvousClient> Client(const std::string& token = kToken,
                                           const std::string& job = kJob) {
    RendezvousClientOptions options;
    options.leader = leader_->address();
    options.job_id = job;
    options.job_token = token;
    options.rpc_timeout = absl::Seconds(5);
    return RendezvousClient::Connect(options);
  }

  JoinParams Params(int rank, absl::Duration timeout = absl::Seconds(20)) const {
    JoinParams p;
    p.node_rank = rank;
    p.num_nodes = num_nodes_;
    p.local_size = rank + 1;
    p.host = absl::StrCat("10.0.0.", rank + 1);
    if (auto it = listen_addresses_.find(rank); it != listen_addresses_.end()) {
      p.listen_address = it->second;
    }
    p.timeout = timeout;
    return p;
  }

  // Every rank in `ranks` joins from its own thread; results by position.
  std::vector<absl::StatusOr<JoinResult>> JoinAll(const std::vector<int>& ranks,
                                                  absl::Duration timeout = absl::Seconds(20)) {
    std::vector<absl::StatusOr<JoinResult>> results(ranks.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = Client()->Join(Params(ranks[i], timeout)); });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  // Forms a generation with every node; returns it.
  uint64_t FormGeneration() {
    std::vector<int> ranks;
    for (int r = 0; r < num_nodes_; ++r) ranks.push_back(r);
    uint64_t generation = 0;
    for (const auto& result : JoinAll(ranks)) {
      EXPECT_TRUE(result.ok()) << result.status();
      if (result.ok()) generation = result->generation;
    }
    return generation;
  }

  absl::StatusOr<HeartbeatResult> Beat(int rank, uint64_t generation,
                                       absl::Status error = absl::OkStatus()) {
    HeartbeatParams p;
    p.node_rank = rank;
    p.generation = generation;
    p.iteration = 7;
    p.last_launched_bucket = 3;
    p.node_error = std::move(error);
    return Client()->Heartbeat(p);
  }

  std::unique_ptr<TestLeader> leader_;
  int num_nodes_ = 0;
  // Each node's JoinRequest.listen_address; a node without one sends none.
  std::map<int, std::string> listen_addresses_;
};

TEST_F(RendezvousServiceTest, AllNodesJoinAndGetPeersInRankOrder) {
  StartLeader(3);
  const auto results = JoinAll({2, 0, 1});
  for (const auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->generation, 1u);
    EXPECT_EQ(result->world_size, 1 + 2 + 3);
    ASSERT_EQ(result->peers.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(result->peers[r].node_rank, r);
      EXPECT_EQ(result->peers[r].host, absl::StrCat("10.0.0.", r + 1));
      EXPECT_EQ(result->peers[r].local_size, r + 1);
    }
  }
  const RendezvousStatus status = leader_->service().GetStatus();
  EXPECT_EQ(status.generation, 1u);
  EXPECT_FALSE(status.aborted);
  EXPECT_EQ(status.nodes.size(), 3u);
}

TEST_F(RendezvousServiceTest, WrongTokenAndJobIdAreRefusedAndTheTokenIsNotLogged) {
  StartLeader(2);
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);

  // The token is call metadata: a wrong one is refused by gRPC status.
  const auto bad_token = Client("not-the-token")->Join(Params(0));
  ASSERT_FALSE(bad_token.ok());
  EXPECT_EQ(bad_token.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Msg(bad_token.status()),
              HasSubstr("Rendezvous.Join refused: the job token does not match"));
  EXPECT_THAT(Msg(bad_token.status()), Not(HasSubstr("not-the-token")));

  const auto no_token = Client("")->Join(Params(0));
  ASSERT_FALSE(no_token.ok());
  EXPECT_EQ(no_token.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Msg(no_token.status()),
              HasSubstr("Rendezvous.Join refused: the call carries no job token"));

  const auto bad_job = Client(kToken, "other-job")->Join(Params(0));
  ASSERT_FALSE(bad_job.ok());
  EXPECT_EQ(CodeOf(bad_job.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(Msg(bad_job.status()), HasSubstr("job_id 'other-job' does not match"));

  // Every RPC checks the token, not only Join: a stranger can neither read
  // the store nor abort a generation.
  ASSERT_TRUE(Client()->Set("job/secret-layout", "v").ok());
  const auto read = Client("")->Get("job/secret-layout");
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Msg(read.status()), HasSubstr("Rendezvous.Get refused"));
  const absl::Status set = Client("not-the-token")->Set("k", "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Msg(set), HasSubstr("Rendezvous.Set refused"));
  const absl::Status leave = Client("")->Leave(0, 0, "x");
  EXPECT_EQ(leave.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Msg(leave), HasSubstr("Rendezvous.Leave refused"));
  const absl::Status wait = Client("")->Wait({"job/secret-layout"}, absl::Seconds(1));
  EXPECT_EQ(wait.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Msg(wait), HasSubstr("Rendezvous.Wait refused"));
  HeartbeatParams beat;
  const auto heartbeat = Client("")->Heartbeat(beat);
  EXPECT_EQ(heartbeat.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(Msg(heartbeat.status()), HasSubstr("Rendezvous.Heartbeat refused"));

  spdlog::default_logger()->flush();
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_THAT(log.str(), HasSubstr("event=call_refused rpc=Rendezvous.Join"));
  EXPECT_THAT(log.str(), HasSubstr("event=rendezvous_refused rpc=Join"));
  EXPECT_THAT(log.str(), Not(HasSubstr("not-the-token")));
  EXPECT_THAT(log.str(), Not(HasSubstr(kToken)));
}

TEST_F(RendezvousServiceTest, NumNodesDisagreementIsAMismatch) {
  StartLeader(2);
  JoinParams p = Params(1);
  p.num_nodes = 4;
  const auto result = Client()->Join(p);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(CodeOf(result.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(Msg(result.status()), HasSubstr("node_rank=1 was started with num_nodes=4"));
  EXPECT_THAT(Msg(result.status()), HasSubstr("num_nodes=2"));
}

TEST_F(RendezvousServiceTest, OutOfRangeRankAndBadFieldsAreRefused) {
  StartLeader(2);
  for (int rank : {-1, 2}) {
    const auto result = Client()->Join(Params(rank));
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(CodeOf(result.status()), v1::INVALID_ARGUMENT);
    EXPECT_THAT(Msg(result.status()),
                HasSubstr(absl::StrCat("node_rank=", rank, " is out of range [0, 2)")));
  }
  JoinParams no_host = Params(0);
  no_host.host.clear();
  EXPECT_EQ(CodeOf(Client()->Join(no_host).status()), v1::INVALID_ARGUMENT);
  JoinParams no_trainers = Params(0);
  no_trainers.local_size = 0;
  EXPECT_EQ(CodeOf(Client()->Join(no_trainers).status()), v1::INVALID_ARGUMENT);
}

TEST_F(RendezvousServiceTest, LocalSizeAboveTheMaximumIsRefusedNamingTheNode) {
  StartLeader(2);
  JoinParams huge = Params(1, absl::Seconds(2));  // unfixed: it would wait in the round
  huge.local_size = kMaxJoinLocalSize + 1;
  const auto refused = Client()->Join(huge);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(CodeOf(refused.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(Msg(refused.status()), HasSubstr("node_rank=1 sent local_size=1025"));
  // The refused node is not part of the round; the largest allowed size joins.
  EXPECT_TRUE(leader_->service().GetStatus().pending_node_ranks.empty());
  JoinParams largest = Params(0);
  largest.local_size = kMaxJoinLocalSize;
  absl::StatusOr<JoinResult> first = absl::UnknownError("not run");
  std::thread node0([&] { first = Client()->Join(largest); });
  const auto second = Client()->Join(Params(1));
  node0.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->peers[0].local_size, kMaxJoinLocalSize);
}

TEST_F(RendezvousServiceTest, DuplicateNodeRankIsRefusedAndTheRoundStillForms) {
  StartLeader(2);
  absl::StatusOr<JoinResult> first = absl::UnknownError("not run");
  std::thread waiter([&] { first = Client()->Join(Params(0)); });
  // Wait until rank 0 is in the round (status, not timing).
  WaitUntil([&] { return !leader_->service().GetStatus().pending_node_ranks.empty(); },
            absl::Seconds(10));
  const auto duplicate = Client()->Join(Params(0));
  ASSERT_FALSE(duplicate.ok());
  EXPECT_EQ(CodeOf(duplicate.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(Msg(duplicate.status()), HasSubstr("node_rank=0 joined twice"));

  const auto second = Client()->Join(Params(1));
  waiter.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->generation, 1u);

  // A member of the active generation cannot join again.
  const auto again = Client()->Join(Params(1));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(CodeOf(again.status()), v1::STATE);
  EXPECT_THAT(Msg(again.status()),
              HasSubstr("node_rank=1 is already a member of active generation 1"));
}

TEST_F(RendezvousServiceTest, JoinTimeoutNamesTheMissingNodesAndLeavesTheRound) {
  StartLeader(3);
  const auto results = JoinAll({0, 1}, absl::Milliseconds(500));
  for (const auto& result : results) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(CodeOf(result.status()), v1::TIMEOUT);
    // Node 2 never came; the node that gave up first is missing for the
    // other one too.
    EXPECT_THAT(
        Msg(result.status()),
        ContainsRegex(
            "missing node ranks: (node_rank=[01] \\([^,]*\\), )?node_rank=2 \\(no report from it"));
  }
  EXPECT_TRUE(leader_->service().GetStatus().pending_node_ranks.empty());
  // The timed-out nodes can join again and form the generation.
  EXPECT_EQ(FormGeneration(), 1u);
}

TEST_F(RendezvousServiceTest, JoinTimeoutQuotesWhatTheMissingNodeReportedAndAJoinDropsIt) {
  StartLeader(3);
  ASSERT_TRUE(
      Client()
          ->Set(FormingReportKey(2), "1 of 2 local trainers registered; missing local ranks 1")
          .ok());
  const auto results = JoinAll({0, 1}, absl::Milliseconds(500));
  for (const auto& result : results) {
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(CodeOf(result.status()), v1::TIMEOUT);
    EXPECT_THAT(Msg(result.status()),
                HasSubstr("node_rank=2 (1 of 2 local trainers registered; missing local ranks 1)"));
  }
  // Node 2 joined this time: its report is over, the next timeout does not quote it.
  EXPECT_EQ(FormGeneration(), 1u);
  auto report = Client()->Get(FormingReportKey(2));
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_FALSE(report->has_value());
}

TEST_F(RendezvousServiceTest, ReportedErrorAbortsAndTheJobReformsWithTheNextGeneration) {
  StartLeader(2);
  ASSERT_EQ(FormGeneration(), 1u);

  auto healthy = Beat(0, 1);
  ASSERT_TRUE(healthy.ok()) << healthy.status();
  EXPECT_FALSE(healthy->abort);
  EXPECT_EQ(healthy->generation, 1u);

  auto reported = Beat(1, 1, MakeError(v1::PEER_FAILED, "allreduce of bucket 4 failed"));
  ASSERT_TRUE(reported.ok()) << reported.status();
  EXPECT_TRUE(reported->abort);
  EXPECT_THAT(reported->abort_reason, HasSubstr("node_rank=1"));
  EXPECT_THAT(reported->abort_reason, HasSubstr("allreduce of bucket 4 failed"));

  auto other = Beat(0, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->abort);
  EXPECT_EQ(other->abort_reason, reported->abort_reason);
  // The report itself, code and message, travels with the abort.
  EXPECT_EQ(CodeOf(other->abort_error), v1::PEER_FAILED) << other->abort_error;
  EXPECT_EQ(Msg(other->abort_error), "allreduce of bucket 4 failed");

  const RendezvousStatus status = leader_->service().GetStatus();
  EXPECT_TRUE(status.aborted);
  ASSERT_EQ(status.nodes.size(), 2u);
  EXPECT_EQ(status.nodes[0].iteration, 7u);
  EXPECT_EQ(status.nodes[0].last_launched_bucket, 3);
  EXPECT_EQ(status.nodes[0].heartbeats, 2u);

  EXPECT_EQ(FormGeneration(), 2u);
  // A node still on generation 1 is told to abort.
  auto stale = Beat(0, 1);
  ASSERT_TRUE(stale.ok());
  EXPECT_TRUE(stale->abort);
  EXPECT_EQ(stale->generation, 2u);
  auto current = Beat(0, 2);
  ASSERT_TRUE(current.ok());
  EXPECT_FALSE(current->abort);
  EXPECT_TRUE(current->abort_error.ok()) << current->abort_error;
  // Generation 2's abort is its own: a later report's code, not the first's.
  auto culprit = Beat(1, 2, MakeError(v1::INVALID_ARGUMENT, "rank 3: tensor 0 element 5 = nan"));
  ASSERT_TRUE(culprit.ok()) << culprit.status();
  auto told = Beat(0, 2);
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_TRUE(told->abort);
  EXPECT_EQ(CodeOf(told->abort_error), v1::INVALID_ARGUMENT) << told->abort_error;
  EXPECT_EQ(Msg(told->abort_error), "rank 3: tensor 0 element 5 = nan");
  // A generation that has not formed is an error.
  EXPECT_EQ(CodeOf(Beat(0, 3).status()), v1::STATE);
}

TEST_F(RendezvousServiceTest, LeaveAbortsTheGeneration) {
  StartLeader(2);
  ASSERT_EQ(FormGeneration(), 1u);
  ASSERT_TRUE(Client()->Leave(1, 1, "operator drained the node").ok());
  auto beat = Beat(0, 1);
  ASSERT_TRUE(beat.ok());
  EXPECT_TRUE(beat->abort);
  EXPECT_THAT(beat->abort_reason, HasSubstr("node_rank=1"));
  EXPECT_THAT(beat->abort_reason, HasSubstr("left: operator drained the node"));
  // No node reported an error: nothing for the others to fail with but
  // the reason (PEER_FAILED).
  EXPECT_TRUE(beat->abort_error.ok()) << beat->abort_error;
}

// Generations restart at 1 on a restarted leader; the old
// leader's node 1 link, still around, sends its Leave(generation=1) late.
// It names the old incarnation, so the fresh generation 1 is untouched.
TEST_F(RendezvousServiceTest, StaleLeaveFromBeforeALeaderRestartLeavesTheNewGenerationAlone) {
  StartLeader(2);
  auto old_link = Client();  // node 1's link of the first leader's generation 1
  std::thread node0([&] { EXPECT_TRUE(Client()->Join(Params(0)).ok()); });
  const auto joined = old_link->Join(Params(1));
  node0.join();
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_EQ(joined->generation, 1u);
  const uint64_t old_incarnation = joined->incarnation;
  EXPECT_EQ(old_incarnation, leader_->service().incarnation());

  // The leader restarts on the same address; the job forms generation 1 again.
  const int port = leader_->port();
  leader_.reset();
  leader_ = std::make_unique<TestLeader>(kJob, kToken, 2, absl::Seconds(20), absl::Minutes(10),
                                         MonotonicNow, port);
  ASSERT_EQ(leader_->port(), port);
  ASSERT_EQ(FormGeneration(), 1u);
  const uint64_t new_incarnation = leader_->service().incarnation();
  ASSERT_NE(new_incarnation, old_incarnation);

  const absl::Status stale = old_link->Leave(1, 1, "the job's trainers closed");
  EXPECT_EQ(CodeOf(stale), v1::STATE) << stale;
  EXPECT_THAT(Msg(stale), HasSubstr("node_rank=1"));
  EXPECT_THAT(Msg(stale), HasSubstr(absl::StrFormat("incarnation %016x", old_incarnation)));
  EXPECT_THAT(Msg(stale), HasSubstr(absl::StrFormat("incarnation %016x", new_incarnation)));
  // Its heartbeat and its store calls are refused the same way.
  HeartbeatParams beat;
  beat.node_rank = 1;
  beat.generation = 1;
  beat.node_error = MakeError(v1::PEER_FAILED, "the old leader is gone");
  EXPECT_EQ(CodeOf(old_link->Heartbeat(beat).status()), v1::STATE);
  EXPECT_EQ(CodeOf(old_link->Set("g1/gloo/stale", "x")), v1::STATE);

  const RendezvousStatus status = leader_->service().GetStatus();
  EXPECT_EQ(status.generation, 1u);
  EXPECT_FALSE(status.aborted) << status.abort_reason;
  auto fresh = Beat(0, 1);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->abort) << fresh->abort_reason;
  EXPECT_FALSE(Client()->Get("g1/gloo/stale")->has_value());
}

TEST_F(RendezvousServiceTest, MissedHeartbeatsAbortNamingTheSilentNode) {
  StartLeader(2, /*heartbeat_timeout=*/absl::Milliseconds(300));
  ASSERT_EQ(FormGeneration(), 1u);
  // Node 0 keeps beating, node 1 is silent; no timing is asserted, only that
  // the abort comes and names node 1.
  bool aborted = false;
  std::string reason;
  const absl::Time deadline = MonotonicNow() + absl::Seconds(20);
  while (!aborted && MonotonicNow() < deadline) {
    auto beat = Beat(0, 1);
    ASSERT_TRUE(beat.ok()) << beat.status();
    aborted = beat->abort;
    reason = beat->abort_reason;
    absl::SleepFor(absl::Milliseconds(50));  // paces node 0's heartbeats
  }
  ASSERT_TRUE(aborted);
  EXPECT_THAT(reason, HasSubstr("node_rank=1"));
  EXPECT_THAT(reason, HasSubstr("sent no heartbeat"));
}

TEST_F(RendezvousServiceTest, AWallClockStepDoesNotMakeAHealthyNodeStaleButRealSilenceDoes) {
  FakeMachineClocks clocks;
  StartLeader(2, /*heartbeat_timeout=*/absl::Seconds(10), clocks.Monotonic());
  ASSERT_EQ(FormGeneration(), 1u);
  ASSERT_FALSE(Beat(0, 1)->abort);
  ASSERT_FALSE(Beat(1, 1)->abort);

  // +30 s on the leader's wall clock, 3x the heartbeat
  // timeout, failed a healthy job.
  clocks.StepWallClock(absl::Seconds(30));
  EXPECT_FALSE(leader_->service().GetStatus().aborted);
  auto beat = Beat(0, 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_FALSE(beat->abort) << beat->abort_reason;
  ASSERT_FALSE(Beat(1, 1)->abort);

  // Real silence still counts: node 0 keeps beating, node 1 says nothing
  // for longer than the timeout.
  clocks.Elapse(absl::Seconds(6));
  ASSERT_FALSE(Beat(0, 1)->abort);
  EXPECT_FALSE(leader_->service().GetStatus().aborted);
  clocks.Elapse(absl::Seconds(6));
  beat = Beat(0, 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->abort);
  EXPECT_THAT(beat->abort_reason, HasSubstr("node_rank=1"));
  EXPECT_THAT(beat->abort_reason, HasSubstr("sent no heartbeat"));
}

// The fake clocks reproduce the defect when the service is handed the wall
// clock, so the test above would catch a return to it.
TEST_F(RendezvousServiceTest, OnTheWallClockTheSameStepWouldHaveAbortedTheHealthyJob) {
  FakeMachineClocks clocks;
  StartLeader(2, /*heartbeat_timeout=*/absl::Seconds(10), clocks.Wall());
  ASSERT_EQ(FormGeneration(), 1u);
  ASSERT_FALSE(Beat(0, 1)->abort);
  ASSERT_FALSE(Beat(1, 1)->abort);
  clocks.StepWallClock(absl::Seconds(30));
  EXPECT_TRUE(leader_->service().GetStatus().aborted);
}

// The default clock, the one gradsyncd uses, is the steady clock: no reading
// of it falls outside the steady_clock readings taken around it.
TEST(MonotonicNowTest, ReadsTheSteadyClockNotTheWallClock) {
  for (int i = 0; i < 1000; ++i) {
    const absl::Time before = FromSteadyClock(std::chrono::steady_clock::now());
    const absl::Time now = MonotonicNow();
    const absl::Time after = FromSteadyClock(std::chrono::steady_clock::now());
    ASSERT_LE(before, now);
    ASSERT_LE(now, after);
  }
}

TEST_F(RendezvousServiceTest, HostingDaemonCanAbortTheGeneration) {
  StartLeader(2);
  ASSERT_EQ(FormGeneration(), 1u);
  EXPECT_FALSE(leader_->service().AbortGeneration(2, "wrong generation"));
  EXPECT_TRUE(leader_->service().AbortGeneration(1, "leader saw a failure"));
  auto beat = Beat(1, 1);
  ASSERT_TRUE(beat.ok());
  EXPECT_TRUE(beat->abort);
  EXPECT_EQ(beat->abort_reason, "leader saw a failure");
}

// The config log of a generation. Versions count 1, 2, ...
// and switch at strictly increasing iterations even when the leader asks
// for an earlier one; heartbeats carry the newest; the log is bounded and
// starts over with each generation.
TEST_F(RendezvousServiceTest, ConfigLogVersionsSwitchAtStrictlyIncreasingIterations) {
  StartLeader(2);
  RendezvousService& service = leader_->service();
  auto write = [](const RendezvousService::ConfigEntry& e) {
    return std::make_pair(absl::StrCat("g", e.generation, "/config/", e.version),
                          absl::StrCat(e.at_iteration));
  };
  EXPECT_EQ(service.AppendConfig(10, write).status().code(),
            absl::StatusCode::kFailedPrecondition);  // no generation yet
  ASSERT_EQ(FormGeneration(), 1u);
  const auto first = service.AppendConfig(10, write);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->version, 1u);
  EXPECT_EQ(first->at_iteration, 10u);
  // Asked for earlier (the leader's view of progress lags): still later.
  const auto second = service.AppendConfig(4, write);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version, 2u);
  EXPECT_EQ(second->at_iteration, 11u);
  auto beat = Beat(0, 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->config_version, 2u);
  auto client = Client();
  EXPECT_EQ(client->Get("g1/config/1")->value_or(""), "10");
  EXPECT_EQ(client->Get("g1/config/2")->value_or(""), "11");

  // Bounded: the oldest versions go, the newest kConfigLogKeep stay.
  for (size_t i = 0; i < kConfigLogKeep; ++i) ASSERT_TRUE(service.AppendConfig(0, write).ok());
  EXPECT_FALSE(client->Get("g1/config/2")->has_value());
  EXPECT_TRUE(client->Get("g1/config/3")->has_value());

  // A new generation has a log of its own.
  ASSERT_TRUE(service.AbortGeneration(1, "re-form"));
  ASSERT_EQ(FormGeneration(), 2u);
  const auto fresh = service.AppendConfig(5, write);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(fresh->version, 1u);
  EXPECT_EQ(fresh->generation, 2u);
  EXPECT_EQ(fresh->at_iteration, 5u);
}

// An operator's change while no generation runs (the leader's job waits
// for the other nodes) is held, the newest replacing older ones, and is the
// next generation's version 1, two iterations in; while one runs it is
// appended at once; after an abort it is held for the next one again.
TEST_F(RendezvousServiceTest, ConfigSetWhileNoGenerationRunsIsTheNextGenerationsFirstVersion) {
  StartLeader(2);
  RendezvousService& service = leader_->service();
  auto write = [](std::string caps) {
    return [caps](const RendezvousService::ConfigEntry& e) {
      return std::make_pair(absl::StrCat("g", e.generation, "/config/", e.version),
                            absl::StrCat(caps, "@", e.at_iteration));
    };
  };
  EXPECT_FALSE(service.AppendOrHoldConfig(10, write("old")).has_value());
  EXPECT_FALSE(service.AppendOrHoldConfig(10, write("new")).has_value());
  EXPECT_EQ(service.GetStatus().config_version, 0u);
  ASSERT_EQ(FormGeneration(), 1u);
  auto beat = Beat(0, 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->config_version, 1u);
  auto client = Client();
  EXPECT_EQ(client->Get("g1/config/1")->value_or("none"),
            absl::StrCat("new@", RendezvousService::kHeldConfigAfter));
  EXPECT_FALSE(client->Get("g1/config/2")->has_value());

  const auto appended = service.AppendOrHoldConfig(10, write("running"));
  ASSERT_TRUE(appended.has_value());
  EXPECT_EQ(appended->version, 2u);
  EXPECT_EQ(appended->at_iteration, 10u);

  ASSERT_TRUE(service.AbortGeneration(1, "the job's trainers closed"));
  EXPECT_FALSE(service.AppendOrHoldConfig(10, write("between")).has_value());
  ASSERT_EQ(FormGeneration(), 2u);
  EXPECT_EQ(client->Get("g2/config/1")->value_or("none"),
            absl::StrCat("between@", RendezvousService::kHeldConfigAfter));
  // Taken by generation 2: generation 3 starts with an empty log.
  ASSERT_TRUE(service.AbortGeneration(2, "the job's trainers closed"));
  ASSERT_EQ(FormGeneration(), 3u);
  EXPECT_EQ(service.GetStatus().config_version, 0u);
}

TEST_F(RendezvousServiceTest, WaitTimeoutNamesTheMissingKeys) {
  StartLeader(2);
  auto client = Client();
  ASSERT_TRUE(client->Set("job/a", "1").ok());
  const absl::Status status = client->Wait({"job/a", "job/b", "job/c"}, absl::Milliseconds(300));
  EXPECT_EQ(CodeOf(status), v1::TIMEOUT);
  EXPECT_THAT(Msg(status), HasSubstr("missing keys: job/b, job/c"));

  auto missing = client->Get("job/b");
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());

  // A Wait returns as soon as another node sets the last key.
  std::thread setter([&] {
    // Once the Wait below is blocked on the missing keys (state, not timing).
    ASSERT_TRUE(BlockedWaitSeen());
    (void)Client()->Set("job/b", "2");
    (void)Client()->Set("job/c", std::string("\0\x01binary", 8));
  });
  EXPECT_TRUE(client->Wait({"job/a", "job/b", "job/c"}, absl::Seconds(20)).ok());
  setter.join();
  auto value = client->Get("job/c");
  ASSERT_TRUE(value.ok());
  ASSERT_TRUE(value->has_value());
  EXPECT_EQ(**value, std::string("\0\x01binary", 8));
}

// A Wait asking for values answers, once the last key is set, with every
// value in the order asked (one round trip instead of a Get per key), up to
// kMaxWaitValuesBytes; WaitForValues gets the ones left out.
TEST_F(RendezvousServiceTest, WaitForValuesAnswersEveryValueOnceTheLastKeyIsSet) {
  StartLeader(2);
  auto client = Client();
  const std::string binary("\0\x01binary", 8);
  const std::string big(kMaxWaitValuesBytes, 'b');  // over the bound with its key
  ASSERT_TRUE(client->Set("job/a", binary).ok());
  ASSERT_TRUE(client->Set("job/big", big).ok());

  absl::StatusOr<std::map<std::string, std::string>> values = absl::UnknownError("not run");
  std::thread waiter([&] {
    values = Client()->WaitForValues({"job/a", "job/c", "job/big"}, absl::Seconds(20));
  });
  ASSERT_TRUE(BlockedWaitSeen());  // blocked on job/c
  ASSERT_TRUE(client->Set("job/c", "3").ok());
  waiter.join();
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(*values, (std::map<std::string, std::string>{
                         {"job/a", binary}, {"job/c", "3"}, {"job/big", big}}));

  // On the wire: the values within the bound, in the order asked, none past it.
  auto stub = v1::Rendezvous::NewStub(
      grpc::CreateChannel(leader_->address(), grpc::InsecureChannelCredentials()));
  v1::WaitRequest request;
  request.mutable_job()->set_job_id(kJob);
  for (const char* key : {"job/c", "job/a", "job/big"}) request.add_keys(key);
  request.add_read_keys("job/none");
  request.add_read_keys("job/c");
  request.set_timeout_ms(20000);
  request.set_return_values(true);
  v1::WaitResponse response;
  grpc::ClientContext context;
  AttachCallToken(&context, kToken);
  const grpc::Status rpc = stub->Wait(&context, request, &response);
  ASSERT_TRUE(rpc.ok()) << rpc.error_message();
  EXPECT_EQ(response.error().code(), v1::OK) << response.error().message();
  ASSERT_EQ(response.values_size(), 3);
  EXPECT_EQ(response.values(0).key(), "job/c");
  EXPECT_EQ(response.values(0).value(), "3");
  EXPECT_EQ(response.values(1).key(), "job/a");
  EXPECT_EQ(response.values(1).value(), binary);
  EXPECT_EQ(response.values(2).key(), "job/c");  // the read key, after the bound's gap

  // Read keys are answered when set and never waited for.
  const auto read =
      client->WaitForValues({"job/a"}, {"job/none", "job/c", "job/big"}, absl::Seconds(20));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, (std::map<std::string, std::string>{
                       {"job/a", binary}, {"job/c", "3"}, {"job/big", big}}));

  // A timeout still names the missing keys.
  const auto missing = client->WaitForValues({"job/a", "job/d"}, absl::Milliseconds(200));
  EXPECT_EQ(CodeOf(missing.status()), v1::TIMEOUT);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("missing keys: job/d"));
}

TEST_F(RendezvousServiceTest, GenerationKeysAreScopedAbortedAndDiscarded) {
  StartLeader(2);
  ASSERT_EQ(FormGeneration(), 1u);
  auto client = Client();
  ASSERT_TRUE(client->Set("g1/gloo/0", "addr").ok());
  EXPECT_EQ(CodeOf(client->Set("g2/gloo/0", "early")), v1::STATE);
  ASSERT_TRUE(client->Set("job-wide", "kept").ok());

  // A Wait on keys of a generation that aborts ends with PEER_FAILED.
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = Client()->Wait({"g1/gloo/1"}, absl::Seconds(20)); });
  ASSERT_TRUE(BlockedWaitSeen());  // the Wait is blocked before the abort
  ASSERT_TRUE(Beat(1, 1, MakeError(v1::UNAVAILABLE, "node 1 lost its peer")).ok());
  waiter.join();
  EXPECT_EQ(CodeOf(waited), v1::PEER_FAILED);
  EXPECT_THAT(Msg(waited), HasSubstr("node 1 lost its peer"));

  ASSERT_EQ(FormGeneration(), 2u);
  const absl::Status stale = client->Set("g1/gloo/0", "zombie");
  EXPECT_EQ(CodeOf(stale), v1::STATE);
  EXPECT_THAT(Msg(stale), HasSubstr("generation 1, which is over"));
  auto kept = client->Get("job-wide");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->value_or(""), "kept");
  ASSERT_TRUE(client->Set("g2/gloo/0", "addr2").ok());
}

// Over a store bound a Set is RESOURCE_EXHAUSTED naming the key and the
// bound, and nothing is stored; a new generation frees its predecessor's keys.
TEST_F(RendezvousServiceTest, StoreBoundsRefuseNamingTheKeyAndTheBound) {
  RendezvousStoreLimits limits;
  limits.max_value_bytes = 1000;
  limits.max_keys_per_generation = 3;
  limits.max_job_wide_keys = 2;
  limits.max_total_bytes = 2000;
  leader_ = std::make_unique<TestLeader>(kJob, kToken, 2, absl::Seconds(20), absl::Minutes(10),
                                         MonotonicNow, 0, limits);
  num_nodes_ = 2;
  auto client = Client();

  const absl::Status big = client->Set("job/big", std::string(1001, 'x'));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(big), HasSubstr("value of key 'job/big' is 1001 bytes"));
  EXPECT_THAT(Msg(big), HasSubstr("max_value_bytes=1000"));
  EXPECT_FALSE(client->Get("job/big")->has_value());

  ASSERT_TRUE(client->Set("job/a", std::string(1000, 'a')).ok());
  ASSERT_TRUE(client->Set("job/b", "b").ok());
  ASSERT_TRUE(client->Set("job/a", "replaced").ok());  // replacing is not a new key
  const absl::Status third = client->Set("job/c", "c");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(third), HasSubstr("key 'job/c' would be job-wide key 3"));
  EXPECT_THAT(Msg(third), HasSubstr("max_job_wide_keys=2"));

  ASSERT_EQ(FormGeneration(), 1u);
  ASSERT_TRUE(client->Set("g1/x", std::string(1000, 'x')).ok());
  ASSERT_TRUE(client->Set("g1/y", "y").ok());
  const absl::Status total = client->Set("g1/z", std::string(1000, 'z'));
  EXPECT_EQ(total.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(total), HasSubstr("key 'g1/z' would grow the store to"));
  EXPECT_THAT(Msg(total), HasSubstr("max_total_bytes=2000"));
  ASSERT_TRUE(client->Set("g1/z", "z").ok());
  const absl::Status many = client->Set("g1/w", "w");
  EXPECT_EQ(many.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(many), HasSubstr("key 'g1/w' would be key 4 of generation 1"));
  EXPECT_THAT(Msg(many), HasSubstr("max_keys_per_generation=3"));

  // Generation 2 discards generation 1's keys and their bytes.
  ASSERT_TRUE(leader_->service().AbortGeneration(1, "test"));
  ASSERT_EQ(FormGeneration(), 2u);
  for (const char* key : {"g2/x", "g2/y", "g2/z"}) {
    EXPECT_TRUE(client->Set(key, std::string(600, 'v')).ok()) << key;
  }
}

// The default value bound is the one the store answers, not gRPC's message
// limit: an oversized layout is refused naming its key.
TEST_F(RendezvousServiceTest, DefaultValueBoundIsTheStoresClearError) {
  StartLeader(2);
  const size_t bound = RendezvousStoreLimits{}.max_value_bytes;
  const absl::Status over = Client()->Set("job/layout", std::string(bound + 1, 'l'));
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(over), HasSubstr(absl::StrCat("value of key 'job/layout' is ", bound + 1)));
  EXPECT_TRUE(Client()->Set("job/layout", std::string(bound, 'l')).ok());
}

TEST_F(RendezvousServiceTest, UnreachableLeaderIsATransportErrorNamingIt) {
  RendezvousClientOptions options;
  options.leader = "127.0.0.1:1";  // nothing listens on port 1
  options.job_id = kJob;
  options.job_token = kToken;
  options.rpc_timeout = absl::Milliseconds(300);
  auto client = RendezvousClient::Connect(options);
  const absl::Status status = client->Set("k", "v");
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(CodeOf(status), ::testing::AnyOf(v1::TIMEOUT, v1::UNAVAILABLE));
  EXPECT_THAT(Msg(status), HasSubstr("127.0.0.1:1"));
}

// Elastic jobs (set_min_nodes): survivors of an aborted generation join it
// again with its number; the leader re-forms among those that did once
// every other member stayed silent past kPresumedDeadAfter (a fake
// monotonic clock moves time). Results by position in `ranks`.
class ElasticRendezvousTest : public RendezvousServiceTest {
 protected:
  void StartElastic(int num_nodes, int min_nodes, int max_nodes = 0) {
    StartLeader(num_nodes, /*heartbeat_timeout=*/absl::Minutes(10), clocks_.Monotonic());
    leader_->service().set_min_nodes(min_nodes);
    if (max_nodes != 0) leader_->service().set_max_nodes(max_nodes);
    ASSERT_EQ(FormGeneration(), 1u);
    ASSERT_TRUE(Beat(0, 1, MakeError(v1::PEER_FAILED, "allreduce failed")).ok());
  }

  // `ranks` resume generation 1 at `iterations` (same positions); once all
  // wait in the round, the other members' silence passes the bound.
  std::vector<absl::StatusOr<JoinResult>> Resume(const std::vector<int>& ranks,
                                                 const std::vector<uint64_t>& iterations) {
    std::vector<absl::StatusOr<JoinResult>> results(ranks.size(), absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i] {
        JoinParams p = Params(ranks[i]);
        p.resume_generation = 1;
        p.resume_iteration = iterations[i];
        results[i] = Client()->Join(p);
      });
    }
    EXPECT_TRUE(WaitUntil(
        [&] { return leader_->service().GetStatus().pending_node_ranks.size() == ranks.size(); },
        absl::Seconds(10)));
    clocks_.Elapse(RendezvousService::kPresumedDeadAfter + absl::Milliseconds(1));
    for (auto& t : threads) t.join();
    return results;
  }

  // `ranks` resume generation 1 at iteration 5 while the fake clock stands
  // still: only departed members may be counted out. Should the round wait
  // on silence after all, the clock is moved (bounded) and the results say
  // "waited on silence".
  std::vector<absl::StatusOr<JoinResult>> ResumeWithoutTimePassing(const std::vector<int>& ranks) {
    std::vector<absl::StatusOr<JoinResult>> results(ranks.size(), absl::UnknownError("not run"));
    std::atomic<size_t> done{0};
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i] {
        JoinParams p = Params(ranks[i]);
        p.resume_generation = 1;
        p.resume_iteration = 5;
        results[i] = Client()->Join(p);
        ++done;
      });
    }
    const bool decided = WaitUntil([&] { return done.load() == ranks.size(); }, absl::Seconds(10));
    if (!decided) clocks_.Elapse(RendezvousService::kPresumedDeadAfter + absl::Milliseconds(1));
    for (auto& t : threads) t.join();
    if (!decided) {
      for (auto& r : results) r = absl::DeadlineExceededError("waited on silence");
    }
    return results;
  }

  // Generation 1 of 3 nodes (--min-nodes 2) formed; `departing` leave it
  // for good, as a daemon stopped with SIGTERM does.
  void FormAndDepart(const std::vector<int>& departing) {
    StartLeader(3, /*heartbeat_timeout=*/absl::Minutes(10), clocks_.Monotonic());
    leader_->service().set_min_nodes(2);
    ASSERT_EQ(FormGeneration(), 1u);
    for (int rank : departing) {
      ASSERT_TRUE(Client()->Depart(rank, 1, "gradsyncd is shutting down (SIGTERM)").ok());
    }
  }

  FakeMachineClocks clocks_;
};

TEST_F(ElasticRendezvousTest, ADepartedNodeIsNamedSoAndTheSurvivorsReformWithoutItAtOnce) {
  FormAndDepart({2});
  const auto beat = Beat(0, 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->abort);
  EXPECT_THAT(beat->abort_reason,
              HasSubstr("node_rank=2 (host=10.0.0.3) left the job: gradsyncd is shutting down "
                        "(SIGTERM)"));
  bool named = false;
  for (const SilentMember& m : beat->silent_members) {
    EXPECT_EQ(m.departed, m.node_rank == 2) << "node_rank=" << m.node_rank;
    named |= m.node_rank == 2;
  }
  EXPECT_TRUE(named) << "node 2 missing from the silent members";
  for (const auto& r : ResumeWithoutTimePassing({0, 1})) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
    EXPECT_EQ(r->world_size, 1 + 2);
    ASSERT_EQ(r->peers.size(), 3u);
    EXPECT_EQ(r->peers[2].local_size, 0);
  }
}

TEST_F(ElasticRendezvousTest, DeparturesBelowMinNodesFailTheSurvivorNamingMinNodesAndThem) {
  FormAndDepart({1, 2});
  const auto results = ResumeWithoutTimePassing({0});
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(CodeOf(results[0].status()), v1::PEER_FAILED) << results[0].status();
  EXPECT_THAT(Msg(results[0].status()), HasSubstr("fewer than --min-nodes=2"));
  EXPECT_THAT(Msg(results[0].status()),
              HasSubstr("node_rank=1 (host=10.0.0.2, left the job: gradsyncd is shutting down "
                        "(SIGTERM))"));
  EXPECT_THAT(Msg(results[0].status()), HasSubstr("node_rank=2 (host=10.0.0.3, left the job"));
}

TEST_F(ElasticRendezvousTest, SurvivorsReformWithoutTheSilentNodeWhichIsThenNoMember) {
  StartElastic(3, /*min_nodes=*/2);
  const auto results = Resume({0, 1}, {5, 5});
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
    EXPECT_EQ(r->world_size, 1 + 2);  // local sizes 1 and 2; node 2's 3 gone
    ASSERT_EQ(r->peers.size(), 3u);
    EXPECT_EQ(r->peers[2].local_size, 0);
  }
  const RendezvousStatus status = leader_->service().GetStatus();
  EXPECT_EQ(status.world_size, 3);
  EXPECT_EQ(status.nodes.size(), 2u);
  // Node 2 comes back (it was only stopped): told it is out.
  JoinParams late = Params(2);
  late.resume_generation = 1;
  const absl::StatusOr<JoinResult> refused = Client()->Join(late);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(CodeOf(refused.status()), v1::STATE);
  EXPECT_THAT(Msg(refused.status()), HasSubstr("re-formed without node_rank=2"));
  auto beat = Beat(2, 2);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->abort);
  EXPECT_THAT(beat->abort_reason, HasSubstr("not a member of generation 2"));
}

// Generation 2 of nodes 0 and 1 (node 2 died in generation 1, both
// survivors redid iteration 5); node 2 joins afresh from its own thread.
// Returns once the leader holds it.
struct HeldJoin {
  absl::StatusOr<JoinResult> result = absl::UnknownError("not run");
  std::thread thread;
};

// A replacement node 2 (a fresh daemon: it joins afresh) while the
// survivors' generation runs: held, not refused; the leader's config log
// gets a grow entry two iterations past where generation 2 started, the
// members leave generation 2 there and all three form generation 3, which
// starts at that iteration.
TEST_F(ElasticRendezvousTest, AFreshJoinOfANodeTheSurvivorsLeftOutIsHeldUntilTheMembersGrow) {
  StartElastic(3, /*min_nodes=*/2);
  for (const auto& r : Resume({0, 1}, {5, 5})) ASSERT_TRUE(r.ok()) << r.status();
  HeldJoin joiner;
  joiner.thread = std::thread([&] { joiner.result = Client()->Join(Params(2)); });
  ASSERT_TRUE(WaitUntil(
      [&] { return leader_->service().GetStatus().pending_node_ranks == std::vector<int>{2}; },
      absl::Seconds(10)));
  EXPECT_EQ(leader_->service().GetStatus().generation, 2u);
  EXPECT_EQ(leader_->service().GetStatus().config_version, 1u);
  const absl::StatusOr<std::optional<std::string>> grow = Client()->Get("g2/config/1");
  ASSERT_TRUE(grow.ok() && grow->has_value()) << grow.status();
  const absl::StatusOr<JobConfigChange> change = DecodeConfig("g2/config/1", **grow);
  ASSERT_TRUE(change.ok()) << change.status();
  EXPECT_TRUE(change->grow);
  EXPECT_EQ(change->at_iteration, 5 + RendezvousService::kGrowAfter);
  // A member still in generation 2 heart-beats on untouched meanwhile.
  const absl::StatusOr<HeartbeatResult> beat = Beat(1, 2);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_FALSE(beat->abort);
  std::vector<absl::StatusOr<JoinResult>> members(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r : {0, 1}) {
    threads.emplace_back([&, r] {
      JoinParams p = Params(r);
      p.resume_generation = 2;
      p.resume_iteration = 7;
      members[r] = Client()->Join(p);
    });
  }
  for (auto& t : threads) t.join();
  joiner.thread.join();
  ASSERT_TRUE(joiner.result.ok()) << joiner.result.status();
  for (const auto& r : members) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 3u);
    EXPECT_EQ(r->start_iteration, 7u);
    EXPECT_EQ(r->world_size, 1 + 2 + 3);
  }
  EXPECT_EQ(joiner.result->generation, 3u);
  EXPECT_EQ(joiner.result->start_iteration, 7u);
  EXPECT_EQ(joiner.result->peers[2].local_size, 3);
  EXPECT_TRUE(leader_->service().GetStatus().pending_node_ranks.empty());
}

// A replacement for node 2 restarted so fast that the survivors of
// generation 1 have not re-formed yet (its rank is still a member there):
// refused with STATE, which its daemon retries; once they formed
// generation 2 without it, it is held like any joiner.
TEST_F(ElasticRendezvousTest, AReplacementFasterThanTheReformationWaitsForIt) {
  StartElastic(3, /*min_nodes=*/2);
  ASSERT_TRUE(Beat(1, 1).ok());  // node 1 answered the abort: alive
  const absl::StatusOr<JoinResult> early = Client()->Join(Params(2));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(CodeOf(early.status()), v1::STATE);
  EXPECT_THAT(Msg(early.status()),
              HasSubstr("node_rank=2 joins afresh while generation 1, of which it is a member, "
                        "may still re-form among its surviving nodes"));
  EXPECT_TRUE(leader_->service().GetStatus().pending_node_ranks.empty());
  for (const auto& r : Resume({0, 1}, {5, 5})) ASSERT_TRUE(r.ok()) << r.status();
  HeldJoin joiner;
  joiner.thread = std::thread([&] { joiner.result = Client()->Join(Params(2)); });
  ASSERT_TRUE(WaitUntil([&] { return leader_->service().GetStatus().config_version == 1u; },
                        absl::Seconds(10)));
  EXPECT_EQ(leader_->service().GetStatus().pending_node_ranks, std::vector<int>{2});
  // The members leave at the grow boundary; the joiner's Join returns.
  std::vector<std::thread> threads;
  for (int r : {0, 1}) {
    threads.emplace_back([&, r] {
      JoinParams p = Params(r);
      p.resume_generation = 2;
      p.resume_iteration = 7;
      EXPECT_TRUE(Client()->Join(p).ok());
    });
  }
  for (auto& t : threads) t.join();
  joiner.thread.join();
  ASSERT_TRUE(joiner.result.ok()) << joiner.result.status();
  EXPECT_EQ(joiner.result->generation, 3u);
}

// A member that dies at the grow boundary (silent while the other one
// switched) is counted out as in any re-formation: the next generation
// forms with the other member and the joiner.
TEST_F(ElasticRendezvousTest, AMemberSilentAtTheGrowBoundaryIsLeftOutAndTheOthersGrow) {
  StartElastic(3, /*min_nodes=*/2);
  for (const auto& r : Resume({0, 1}, {5, 5})) ASSERT_TRUE(r.ok()) << r.status();
  HeldJoin joiner;
  joiner.thread = std::thread([&] { joiner.result = Client()->Join(Params(2)); });
  ASSERT_TRUE(WaitUntil([&] { return leader_->service().GetStatus().config_version == 1u; },
                        absl::Seconds(10)));
  absl::StatusOr<JoinResult> member = absl::UnknownError("not run");
  std::thread switching([&] {
    JoinParams p = Params(0);
    p.resume_generation = 2;
    p.resume_iteration = 7;
    member = Client()->Join(p);
  });
  ASSERT_TRUE(
      WaitUntil([&] { return leader_->service().GetStatus().pending_node_ranks.size() == 2u; },
                absl::Seconds(10)));
  clocks_.Elapse(RendezvousService::kPresumedDeadAfter + absl::Milliseconds(1));
  switching.join();
  joiner.thread.join();
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE(joiner.result.ok()) << joiner.result.status();
  EXPECT_EQ(member->generation, 3u);
  EXPECT_EQ(member->world_size, 1 + 3);
  EXPECT_EQ(member->peers[1].local_size, 0);  // node 1 is no member
}

// A node rank at or above --max-nodes is refused at once naming the flag;
// below it (--max-nodes 4 > --num-nodes 3) a new rank 3 joins the running
// job like a replacement.
TEST_F(ElasticRendezvousTest, ARankBeyondMaxNodesIsRefusedNamingItAndOneBelowJoinsTheRunningJob) {
  StartElastic(3, /*min_nodes=*/2, /*max_nodes=*/4);
  JoinParams beyond = Params(4);
  const absl::StatusOr<JoinResult> refused = Client()->Join(beyond);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(CodeOf(refused.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(Msg(refused.status()),
              HasSubstr("node_rank=4 is out of range [0, 4): the job takes at most "
                        "--max-nodes=4 nodes"));
  for (const auto& r : Resume({0, 1}, {5, 5})) ASSERT_TRUE(r.ok()) << r.status();
  HeldJoin joiner;
  joiner.thread = std::thread([&] { joiner.result = Client()->Join(Params(3)); });
  ASSERT_TRUE(WaitUntil([&] { return leader_->service().GetStatus().config_version == 1u; },
                        absl::Seconds(10)));
  std::vector<absl::StatusOr<JoinResult>> members(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r : {0, 1}) {
    threads.emplace_back([&, r] {
      JoinParams p = Params(r);
      p.resume_generation = 2;
      p.resume_iteration = 7;
      members[r] = Client()->Join(p);
    });
  }
  for (auto& t : threads) t.join();
  joiner.thread.join();
  ASSERT_TRUE(joiner.result.ok()) << joiner.result.status();
  EXPECT_EQ(joiner.result->generation, 3u);
  EXPECT_EQ(joiner.result->world_size, 1 + 2 + 4);
  ASSERT_EQ(joiner.result->peers.size(), 4u);
  EXPECT_EQ(joiner.result->peers[2].local_size, 0);  // node 2 died in generation 1
  EXPECT_EQ(joiner.result->peers[3].local_size, 4);
}

// Ranks stay unique after a hole: node 1 dies, so survivors 0 and 2 keep
// ranks [0,1) and [3,6) (counting the members before node 2 would give it
// 1); a new node 3 joins and takes the lowest free range of 4, [6,10), not
// the [4,8) that counting the members before it would give (node 2's 4-5).
// Every node is told the same offsets, and which node joined the running
// job; then the replacement node 1 joins and gets its old [1,3) back.
TEST_F(ElasticRendezvousTest, NodesJoiningAfterAHoleTakeFreeRanksAndTheSurvivorsKeepTheirs) {
  StartElastic(3, /*min_nodes=*/2, /*max_nodes=*/4);
  for (const auto& r : Resume({0, 2}, {5, 5})) {
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->peers.size(), 4u);
    EXPECT_EQ(r->peers[0].rank_offset, 0);
    EXPECT_EQ(r->peers[2].rank_offset, 3);
  }
  // Grows generation `g` (`others` but the joiner switching at `at`) with
  // `joiner`; what every node of `others` is told: each node's offset and
  // joins_running flag, by node rank.
  auto grow = [&](int joiner, uint64_t g, uint64_t at, const std::vector<int>& others,
                  const std::vector<int>& offsets, const std::vector<bool>& joins) {
    HeldJoin held;
    held.thread = std::thread([&] { held.result = Client()->Join(Params(joiner)); });
    ASSERT_TRUE(WaitUntil(
        [&] {
          return leader_->service().GetStatus().pending_node_ranks == std::vector<int>{joiner};
        },
        absl::Seconds(10)));
    std::vector<absl::StatusOr<JoinResult>> members(4, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r : others) {
      if (r == joiner) continue;
      threads.emplace_back([&, r] {
        JoinParams p = Params(r);
        p.resume_generation = g;
        p.resume_iteration = at;
        members[r] = Client()->Join(p);
      });
    }
    for (auto& t : threads) t.join();
    held.thread.join();
    members[joiner] = held.result;
    for (int r : others) ASSERT_TRUE(members[r].ok()) << r << ": " << members[r].status();
    for (int r : others) {
      const JoinResult& result = *members[r];
      EXPECT_EQ(result.generation, g + 1);
      ASSERT_EQ(result.peers.size(), 4u);
      for (int n = 0; n < 4; ++n) {
        if (result.peers[n].local_size == 0) continue;
        EXPECT_EQ(result.peers[n].rank_offset, offsets[n]) << "node " << n << " told " << r;
        EXPECT_EQ(result.peers[n].joins_running, joins[n]) << "node " << n << " told " << r;
      }
    }
  };
  ASSERT_NO_FATAL_FAILURE(grow(3, 2, 7, {0, 2, 3}, {0, -1, 3, 6}, {false, false, false, true}));
  ASSERT_NO_FATAL_FAILURE(grow(1, 3, 9, {0, 1, 2, 3}, {0, 1, 3, 6}, {false, true, false, false}));
}

// Without --max-nodes (= --num-nodes) a rank past the job's is refused
// naming the flag too.
TEST_F(ElasticRendezvousTest, ARankAtNumNodesIsRefusedNamingMaxNodes) {
  StartElastic(3, /*min_nodes=*/2);
  const absl::StatusOr<JoinResult> refused = Client()->Join(Params(3));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(CodeOf(refused.status()), v1::INVALID_ARGUMENT);
  EXPECT_THAT(Msg(refused.status()),
              HasSubstr("node_rank=3 is out of range [0, 3): the job takes at most "
                        "--max-nodes=3 nodes"));
}

// Survivors re-form at the iteration they stopped in: a change held
// meanwhile switches two iterations after it, not at the fresh job's 2.
TEST_F(ElasticRendezvousTest, ConfigHeldWhileSurvivorsReformSwitchesAfterTheirIteration) {
  StartElastic(3, /*min_nodes=*/2);
  auto write = [](const RendezvousService::ConfigEntry& e) {
    return std::make_pair(absl::StrCat("g", e.generation, "/config/", e.version),
                          absl::StrCat(e.at_iteration));
  };
  EXPECT_FALSE(leader_->service().AppendOrHoldConfig(0, write).has_value());
  for (const auto& r : Resume({0, 1}, {5, 5})) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(leader_->service().GetStatus().config_version, 1u);
  EXPECT_EQ(Client()->Get("g2/config/1")->value_or("none"),
            absl::StrCat(5 + RendezvousService::kHeldConfigAfter));
}

TEST_F(ElasticRendezvousTest, BelowMinNodesEverySurvivorFailsNamingMinNodesAndTheDead) {
  StartElastic(3, /*min_nodes=*/2);
  const auto results = Resume({0}, {5});
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(CodeOf(results[0].status()), v1::PEER_FAILED);
  EXPECT_THAT(Msg(results[0].status()), HasSubstr("fewer than --min-nodes=2"));
  EXPECT_THAT(Msg(results[0].status()), HasSubstr("node_rank=1"));
  EXPECT_THAT(Msg(results[0].status()), HasSubstr("node_rank=2"));
  EXPECT_EQ(leader_->service().GetStatus().generation, 1u);
}

// A death inside an iteration's last collective: node 1 completed
// iteration 5, node 0 did not. They form the next generation at 6 (node 0
// commits 5 from node 1 before both resume).
TEST_F(ElasticRendezvousTest, SurvivorsOneIterationApartFormTheNextGenerationAtTheHigher) {
  StartElastic(3, /*min_nodes=*/2);
  const auto results = Resume({0, 1}, {5, 6});
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
    EXPECT_EQ(r->start_iteration, 6u);
    ASSERT_EQ(r->peers.size(), 3u);
    EXPECT_EQ(r->peers[2].local_size, 0);  // node 2 is no member
  }
}

TEST_F(ElasticRendezvousTest, SurvivorsMoreThanOneIterationApartFailNamingBoth) {
  StartElastic(3, /*min_nodes=*/2);
  const auto results = Resume({0, 1}, {5, 7});
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(CodeOf(r.status()), v1::PEER_FAILED);
    EXPECT_THAT(Msg(r.status()),
                HasSubstr("stopped in different iterations more than one apart (node_rank=0 in 5, "
                          "node_rank=1 in 7)"));
    EXPECT_THAT(Msg(r.status()), HasSubstr("dead: node_rank=2"));
  }
  EXPECT_EQ(leader_->service().GetStatus().generation, 1u);
}

// Liveness probes. Nodes 0 and 1 listen (live daemons, whatever their Gloo
// sockets do); the fake clock stands still, so no silence can decide.
class ProbedRendezvousTest : public ElasticRendezvousTest {
 protected:
  // Generation 1 of 3 nodes (--min-nodes `min_nodes`) formed, node 2's
  // daemon at `node2`; node 0 reports a failed collective (the abort).
  void FormAndAbort(const LoopbackPort& node2, int min_nodes = 2) {
    ASSERT_FALSE(node2.address().empty());
    listen_addresses_ = {{0, node0_.address()}, {1, node1_.address()}, {2, node2.address()}};
    StartElastic(3, min_nodes);
  }

  // Node `rank`'s entry among the silent members of a heartbeat's answer
  // (node_rank -1: absent).
  static SilentMember SilentEntry(const HeartbeatResult& beat, int rank) {
    for (const SilentMember& m : beat.silent_members) {
      if (m.node_rank == rank) return m;
    }
    SilentMember absent;
    absent.node_rank = -1;
    return absent;
  }

  // Heart-beats as node 0 until node 2 is named refusing connections
  // (the leader's probe is asynchronous; bounded).
  absl::StatusOr<HeartbeatResult> BeatUntilNodeTwoRefuses() {
    absl::StatusOr<HeartbeatResult> beat = absl::UnknownError("no heartbeat");
    WaitUntil(
        [&] {
          beat = Beat(0, 1);
          return beat.ok() && SilentEntry(*beat, 2).refuses_connections;
        },
        absl::Seconds(10));
    return beat;
  }

  LoopbackPort node0_ = LoopbackPort::Listening();
  LoopbackPort node1_ = LoopbackPort::Listening();
};

TEST_F(ProbedRendezvousTest, ANodeWhoseDaemonRefusesConnectionsIsDeadAtOnceAndTheOthersReform) {
  const LoopbackPort node2 = LoopbackPort::Refusing();
  FormAndAbort(node2);
  const absl::StatusOr<HeartbeatResult> beat = BeatUntilNodeTwoRefuses();
  ASSERT_TRUE(beat.ok()) << beat.status();
  const SilentMember dead = SilentEntry(*beat, 2);
  EXPECT_TRUE(dead.refuses_connections) << "node 2 not named refusing";
  EXPECT_EQ(dead.listen_address, node2.address());
  EXPECT_FALSE(dead.departed);
  for (const auto& r : ResumeWithoutTimePassing({0, 1})) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
    EXPECT_EQ(r->world_size, 1 + 2);
    ASSERT_EQ(r->peers.size(), 3u);
    EXPECT_EQ(r->peers[2].local_size, 0);
    EXPECT_EQ(r->peers[1].listen_address, node1_.address());
  }
}

// Node 1 stays silent but its daemon still listens (a stalled node, or one
// that only closed its Gloo sockets): never counted dead by a probe, only
// by its silence. Node 2's refusal comes from the same probe.
TEST_F(ProbedRendezvousTest, ASilentNodeWhosePortListensIsLeftToTheSilenceRule) {
  const LoopbackPort node2 = LoopbackPort::Refusing();
  FormAndAbort(node2);
  const absl::StatusOr<HeartbeatResult> beat = BeatUntilNodeTwoRefuses();
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(SilentEntry(*beat, 1).node_rank, 1);
  EXPECT_FALSE(SilentEntry(*beat, 1).refuses_connections);
  std::vector<absl::StatusOr<JoinResult>> results(1, absl::UnknownError("not run"));
  std::thread survivor([&] {
    JoinParams p = Params(0);
    p.resume_generation = 1;
    p.resume_iteration = 5;
    results[0] = Client()->Join(p);
  });
  ASSERT_TRUE(
      WaitUntil([&] { return leader_->service().GetStatus().pending_node_ranks.size() == 1; },
                absl::Seconds(10)));
  // Node 2 is decided, node 1 is not: the round waits on node 1's silence.
  EXPECT_EQ(leader_->service().GetStatus().generation, 1u);
  clocks_.Elapse(RendezvousService::kPresumedDeadAfter + absl::Milliseconds(1));
  survivor.join();
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(CodeOf(results[0].status()), v1::PEER_FAILED) << results[0].status();
  EXPECT_THAT(Msg(results[0].status()), HasSubstr("fewer than --min-nodes=2"));
  EXPECT_THAT(Msg(results[0].status()), HasSubstr("node_rank=1 (host=10.0.0.2, silent 2001 ms)"));
  EXPECT_THAT(Msg(results[0].status()),
              HasSubstr(absl::StrCat("node_rank=2 (host=10.0.0.3, its daemon at ", node2.address(),
                                     " refuses connections)")));
}

// A probe that times out (a host that drops the connect) proves nothing,
// and the leader answers meanwhile.
TEST_F(ProbedRendezvousTest, AProbeThatTimesOutProvesNothingAndTheLeaderAnswersMeanwhile) {
  const LoopbackPort node2 = LoopbackPort::Unanswering();
  FormAndAbort(node2);
  for (int rank : {0, 1}) {
    const absl::StatusOr<HeartbeatResult> beat = Beat(rank, 1);
    ASSERT_TRUE(beat.ok()) << beat.status();
    EXPECT_TRUE(beat->abort);
    EXPECT_EQ(SilentEntry(*beat, 2).node_rank, 2);
    EXPECT_FALSE(SilentEntry(*beat, 2).refuses_connections);
  }
  std::vector<absl::StatusOr<JoinResult>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> survivors;
  for (int rank : {0, 1}) {
    survivors.emplace_back([&, rank] {
      JoinParams p = Params(rank);
      p.resume_generation = 1;
      p.resume_iteration = 5;
      results[rank] = Client()->Join(p);
    });
  }
  ASSERT_TRUE(
      WaitUntil([&] { return leader_->service().GetStatus().pending_node_ranks.size() == 2; },
                absl::Seconds(10)));
  EXPECT_EQ(leader_->service().GetStatus().generation, 1u);  // node 2 undecided
  clocks_.Elapse(RendezvousService::kPresumedDeadAfter + absl::Milliseconds(1));
  for (auto& t : survivors) t.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
  }
}

TEST_F(RendezvousServiceTest, AListenAddressThatIsNotHostPortIsRefusedNamingTheNode) {
  StartLeader(2);
  JoinParams p = Params(1);
  for (const std::string& bad :
       {std::string("10.0.0.2"), std::string("10.0.0.2:7x"), std::string(400, 'a') + ":1"}) {
    p.listen_address = bad;
    const absl::StatusOr<JoinResult> r = Client()->Join(p);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(CodeOf(r.status()), v1::INVALID_ARGUMENT) << r.status();
    EXPECT_THAT(Msg(r.status()), HasSubstr("node_rank=1 sent listen_address"));
  }
}

TEST_F(ElasticRendezvousTest, AFixedJobRefusesAResumingJoin) {
  StartLeader(2);
  ASSERT_EQ(FormGeneration(), 1u);
  ASSERT_TRUE(Beat(0, 1, MakeError(v1::PEER_FAILED, "allreduce failed")).ok());
  JoinParams p = Params(0);
  p.resume_generation = 1;
  const absl::StatusOr<JoinResult> r = Client()->Join(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(CodeOf(r.status()), v1::STATE);
  EXPECT_THAT(Msg(r.status()), HasSubstr("not elastic"));
}

}  // namespace
}  // namespace gradsync::testing
