// The job's rendezvous kept in etcd (EtcdRendezvous), against real etcd
// members on loopback ports: daemons racing to form a generation agree on
// it, the job token never reaches etcd in plain text and a wrong one is
// refused, a missing node is named when a join times out, a member whose
// lease is gone aborts the generation naming it, a wait on an aborted
// generation's keys ends, a config change made while no generation runs
// becomes the next one's version 1, nodes joining a running elastic job are
// held until its members reach the grow boundary their first member
// appended, and an unreachable etcd fails the join UNAVAILABLE naming it.
#include "daemon/cluster/etcd_rendezvous.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_code.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/testing/loopback_port.h"
#include "tests/testing/wait.h"

namespace gradsync {
namespace {

using ::gradsync::testing::EtcdCluster;
using ::testing::HasSubstr;
using ::testing::Not;

#define SKIP_WITHOUT_ETCD()                                              \
  do {                                                                   \
    const std::string reason = ::gradsync::testing::EtcdMissingReason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;                         \
  } while (0)

constexpr char kToken[] = "the-job-token-s3cret";
constexpr absl::Duration kLeaseTtl = absl::Seconds(10);

std::shared_ptr<EtcdRendezvous> Rendezvous(const std::vector<std::string>& endpoints,
                                           const std::string& token = kToken,
                                           absl::Duration lease_ttl = kLeaseTtl, int min_nodes = 0,
                                           int max_nodes = 0) {
  EtcdRendezvousOptions options;
  options.etcd.endpoints = endpoints;
  options.etcd.call_timeout = absl::Seconds(3);
  options.etcd.attempt_timeout = absl::Seconds(1);
  options.prefix = "gs";
  options.job_id = "job1";
  options.job_token = token;
  options.lease_ttl = lease_ttl;
  options.min_nodes = min_nodes;
  options.max_nodes = max_nodes;
  absl::StatusOr<std::shared_ptr<EtcdRendezvous>> r = EtcdRendezvous::Connect(options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : nullptr;
}

JoinParams Node(int rank, int num_nodes, absl::Duration timeout = absl::Seconds(30)) {
  JoinParams p;
  p.node_rank = rank;
  p.num_nodes = num_nodes;
  p.local_size = rank + 1;
  p.host = absl::StrCat("10.0.0.", rank + 1);
  p.timeout = timeout;
  return p;
}

// Every node of `nodes` joins at once, each on its own thread.
std::vector<absl::StatusOr<JoinResult>> JoinAll(
    const std::vector<std::shared_ptr<EtcdRendezvous>>& nodes) {
  std::vector<absl::StatusOr<JoinResult>> results(nodes.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < nodes.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = nodes[i]->Join(Node(static_cast<int>(i), static_cast<int>(nodes.size())));
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Node `rank`'s heartbeat in `generation`, reporting `node_error` (OK: none)
// from `iteration`.
absl::StatusOr<HeartbeatResult> Beat(EtcdRendezvous& node, int rank, uint64_t generation = 1,
                                     const absl::Status& node_error = absl::OkStatus(),
                                     uint64_t iteration = 0) {
  HeartbeatParams params;
  params.node_rank = rank;
  params.generation = generation;
  params.node_error = node_error;
  params.iteration = iteration;
  return node.Heartbeat(params);
}

// A Join on a thread of its own, whose result is read once it is done.
class BackgroundJoin {
 public:
  BackgroundJoin(std::shared_ptr<EtcdRendezvous> node, JoinParams params)
      : node_(std::move(node)), thread_([this, params] {
          absl::StatusOr<JoinResult> r = node_->Join(params);
          absl::MutexLock lock(&mu_);
          result_ = std::move(r);
          done_ = true;
        }) {}
  ~BackgroundJoin() {
    if (thread_.joinable()) thread_.join();
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  absl::StatusOr<JoinResult> Result() {
    thread_.join();
    absl::MutexLock lock(&mu_);
    return result_;
  }

 private:
  std::shared_ptr<EtcdRendezvous> node_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusOr<JoinResult> result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("not done");
  std::thread thread_;
};

// Each test runs against an etcd member of its own; nodes_ are the job's
// daemons' rendezvous clients, by node rank.
class EtcdRendezvousTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_ETCD();
    ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Logs();
  }

  std::shared_ptr<EtcdRendezvous> NewNode(absl::Duration lease_ttl = kLeaseTtl, int min_nodes = 0,
                                          int max_nodes = 0) {
    return Rendezvous(etcd_.endpoints(), kToken, lease_ttl, min_nodes, max_nodes);
  }

  void AddNodes(int count, absl::Duration lease_ttl = kLeaseTtl, int min_nodes = 0,
                int max_nodes = 0) {
    for (int i = 0; i < count; ++i) nodes_.push_back(NewNode(lease_ttl, min_nodes, max_nodes));
  }

  // Whether `key` (under the job's root) is in etcd, read past the
  // rendezvous.
  bool JobKeyExists(const std::string& key) const {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = RawClient();
    if (!client.ok()) return false;
    absl::StatusOr<std::optional<EtcdKeyValue>> kv = (*client)->Get("gs/job/job1/" + key);
    return kv.ok() && kv->has_value();
  }

  // Each of `members` of running generation `generation` leaves it at its
  // grow boundary `at` as job_grow does: its client retired, a new one joins
  // generation + 1 resuming from `at`; all at once, each on its own thread.
  // The results by rank (others: "not a member").
  std::vector<absl::StatusOr<JoinResult>> SwitchAtTheGrowBoundary(const std::vector<int>& members,
                                                                  uint64_t generation, uint64_t at,
                                                                  int num_nodes, int min_nodes,
                                                                  int max_nodes) {
    std::vector<absl::StatusOr<JoinResult>> results(nodes_.size(),
                                                    absl::UnknownError("not a member"));
    std::vector<std::thread> threads;
    for (int i : members) {
      threads.emplace_back([&, i] {
        nodes_[i]->Retire();
        nodes_[i] = NewNode(kLeaseTtl, min_nodes, max_nodes);
        JoinParams p = Node(i, num_nodes);
        p.resume_generation = generation;
        p.resume_iteration = at;
        results[i] = nodes_[i]->Join(p);
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  // Every node joins at once; whether all formed the generation.
  bool FormGeneration() {
    bool formed = true;
    for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes_)) {
      EXPECT_TRUE(r.ok()) << r.status();
      formed = formed && r.ok();
    }
    return formed;
  }

  // A client that reads etcd as it is, past the rendezvous.
  absl::StatusOr<std::unique_ptr<EtcdClient>> RawClient() const {
    EtcdClientOptions raw;
    raw.endpoints = etcd_.endpoints();
    return EtcdClient::Connect(raw);
  }

  // Each of the `survivors` of an elastic job (--min-nodes 2) that formed
  // generation 1 reports `failure` (if any), leaves, and joins again as a new
  // daemon to resume generation 1 at `iterations[rank]`, each on its own
  // thread, as job_reform does. The results by rank ("dead": no survivor).
  std::vector<absl::StatusOr<JoinResult>> ReformResuming(
      const std::vector<int>& survivors, const absl::Status& failure,
      const std::vector<uint64_t>& iterations, absl::Duration lease_ttl = kLeaseTtl,
      absl::Duration join_timeout = absl::Seconds(30)) {
    const int num_nodes = static_cast<int>(nodes_.size());
    std::vector<absl::StatusOr<JoinResult>> results(num_nodes, absl::UnknownError("dead"));
    std::vector<std::thread> threads;
    for (int i : survivors) {
      threads.emplace_back([&, i] {
        if (!failure.ok()) {
          EXPECT_TRUE(Beat(*nodes_[i], i, 1, failure).ok());
        }
        EXPECT_TRUE(nodes_[i]->Leave(i, 1, "re-forming").ok());
        nodes_[i] = NewNode(lease_ttl, /*min_nodes=*/2);
        JoinParams p = Node(i, num_nodes, join_timeout);
        p.resume_generation = 1;
        p.resume_iteration = iterations[i];
        results[i] = nodes_[i]->Join(p);
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  // Three nodes of an elastic job (--min-nodes 2) formed generation 1; each
  // node in `dead` is gone (its lease revoked, as one that expired, never
  // having heard of the abort); the others report a failure and re-form.
  std::vector<absl::StatusOr<JoinResult>> ResumeAfterDeaths(
      const std::vector<int>& dead, const std::vector<uint64_t>& iterations) {
    AddNodes(3, kLeaseTtl, /*min_nodes=*/2);
    if (!FormGeneration()) return {};
    std::vector<int> survivors;
    for (int i = 0; i < 3; ++i) {
      if (std::find(dead.begin(), dead.end(), i) == dead.end()) {
        survivors.push_back(i);
      } else {
        nodes_[i].reset();
      }
    }
    return ReformResuming(survivors, absl::UnavailableError("a collective failed"), iterations);
  }

  EtcdCluster etcd_{1};
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes_;
};

TEST_F(EtcdRendezvousTest, NodesRacingToFormAGenerationAllGetTheSameOne) {
  AddNodes(4);
  std::vector<absl::StatusOr<JoinResult>> results = JoinAll(nodes_);
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << "node " << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->generation, 1u);
    EXPECT_EQ(results[i]->world_size, 1 + 2 + 3 + 4);
    EXPECT_EQ(results[i]->incarnation, results[0]->incarnation);
    ASSERT_EQ(results[i]->peers.size(), 4u);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(results[i]->peers[r].node_rank, r);
      EXPECT_EQ(results[i]->peers[r].host, absl::StrCat("10.0.0.", r + 1));
    }
  }
  // The records every node publishes reach every other, from any node.
  ASSERT_TRUE(nodes_[3]->Set("g1/layout/3", "L3").ok());
  absl::StatusOr<std::map<std::string, std::string>> values =
      nodes_[0]->WaitForValues({"g1/layout/3"}, absl::Seconds(10));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->at("g1/layout/3"), "L3");
}

TEST_F(EtcdRendezvousTest, TheJobTokenNeverReachesEtcdAndAnotherTokenIsRefused) {
  AddNodes(2);
  ASSERT_TRUE(FormGeneration());

  absl::StatusOr<std::unique_ptr<EtcdClient>> client = RawClient();
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<EtcdRange> all = (*client)->GetPrefix("gs/");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_FALSE(all->kvs.empty());
  for (const EtcdKeyValue& kv : all->kvs) {
    EXPECT_THAT(kv.value, Not(HasSubstr(kToken))) << kv.key;
  }

  std::shared_ptr<EtcdRendezvous> intruder = Rendezvous(etcd_.endpoints(), "another-token");
  absl::StatusOr<JoinResult> refused = intruder->Join(Node(0, 2, absl::Seconds(5)));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("gs/job/job1/token_proof"));
  EXPECT_THAT(refused.status().message(), HasSubstr("another job token"));
}

TEST_F(EtcdRendezvousTest, AJoinTimeoutNamesTheNodeThatNeverJoined) {
  std::shared_ptr<EtcdRendezvous> node0 = NewNode();
  ASSERT_TRUE(node0->Set("forming/node2", "waiting for local_rank=1").ok());
  absl::StatusOr<JoinResult> r = node0->Join(Node(0, 3, absl::Seconds(2)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(CodeOf(r.status()), v1::TIMEOUT) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("1 of 3 nodes joined"));
  EXPECT_THAT(r.status().message(), HasSubstr("node_rank=1 (no report from it"));
  EXPECT_THAT(r.status().message(), HasSubstr("node_rank=2 (waiting for local_rank=1)"));
}

TEST_F(EtcdRendezvousTest, AMemberWhoseLeaseIsGoneAbortsTheGenerationNamingIt) {
  AddNodes(2);
  ASSERT_TRUE(FormGeneration());
  absl::StatusOr<HeartbeatResult> before = Beat(*nodes_[0], 0);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->abort);

  // A wait on generation 1's keys is under way when node 1 goes.
  absl::StatusOr<std::map<std::string, std::string>> waited;
  std::thread waiter([&] { waited = nodes_[0]->WaitForValues({"g1/never"}, absl::Seconds(30)); });
  nodes_[1].reset();  // its lease is revoked: as a lease that expired
  absl::StatusOr<HeartbeatResult> after = Beat(*nodes_[0], 0);
  waiter.join();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->abort);
  EXPECT_THAT(after->abort_reason, HasSubstr("node_rank=1 (host=10.0.0.2) is dead"));
  EXPECT_THAT(after->abort_reason, HasSubstr("lease"));
  EXPECT_TRUE(after->abort_error.ok()) << after->abort_error;  // a death: nobody reported
  ASSERT_EQ(after->silent_members.size(), 1u);
  EXPECT_EQ(after->silent_members[0].node_rank, 1);
  EXPECT_GE(after->silent_members[0].silent, absl::Seconds(2));  // presumed dead at once
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(CodeOf(waited.status()), v1::PEER_FAILED) << waited.status();
  EXPECT_THAT(waited.status().message(), HasSubstr("node_rank=1 (host=10.0.0.2) is dead"));

  // The next generation forms with a new daemon for node 1.
  nodes_[1] = NewNode();
  std::vector<absl::StatusOr<JoinResult>> again = JoinAll(nodes_);
  for (const absl::StatusOr<JoinResult>& r : again) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
  }
}

TEST_F(EtcdRendezvousTest, ANodeErrorAbortsTheGenerationForEveryMember) {
  AddNodes(2);
  ASSERT_TRUE(FormGeneration());
  ASSERT_TRUE(Beat(*nodes_[1], 1, 1, absl::DataLossError("trainer 3 stopped")).ok());
  absl::StatusOr<HeartbeatResult> r = Beat(*nodes_[0], 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->abort);
  EXPECT_THAT(r->abort_reason, HasSubstr("node_rank=1 (host=10.0.0.2) reported"));
  EXPECT_THAT(r->abort_reason, HasSubstr("trainer 3 stopped"));
  EXPECT_TRUE(r->silent_members.empty());  // node 1 acknowledged its own abort
  // The report itself, code and message, is read with the abort.
  EXPECT_EQ(CodeOf(r->abort_error), CodeOf(absl::DataLossError(""))) << r->abort_error;
  EXPECT_EQ(r->abort_error.message(), "trainer 3 stopped");
}

// Of two reports racing, the one whose abort stands is the one whose error
// every member reads: reason and error come from one transaction.
TEST_F(EtcdRendezvousTest, TheAbortsErrorIsTheReportWhoseReasonStands) {
  AddNodes(2);
  ASSERT_TRUE(FormGeneration());
  ASSERT_TRUE(
      Beat(*nodes_[1], 1, 1, MakeError(v1::INVALID_ARGUMENT, "rank 3: element 5 = nan")).ok());
  ASSERT_TRUE(Beat(*nodes_[0], 0, 1, MakeError(v1::INVALID_ARGUMENT, "bucket 0 holds a nan")).ok());
  for (int rank : {0, 1}) {
    absl::StatusOr<HeartbeatResult> r = Beat(*nodes_[rank], rank);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->abort);
    EXPECT_THAT(r->abort_reason,
                HasSubstr("node_rank=1 (host=10.0.0.2) reported INVALID_ARGUMENT"));
    EXPECT_EQ(CodeOf(r->abort_error), v1::INVALID_ARGUMENT) << r->abort_error;
    EXPECT_EQ(r->abort_error.message(), "rank 3: element 5 = nan");
  }
}

TEST_F(EtcdRendezvousTest, SurvivorsReformWithoutADeadNodeZero) {
  std::vector<absl::StatusOr<JoinResult>> results = ResumeAfterDeaths({0}, {7, 7, 7});
  ASSERT_EQ(results.size(), 3u);
  for (int i : {1, 2}) {
    ASSERT_TRUE(results[i].ok()) << "node " << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->generation, 2u);
    ASSERT_EQ(results[i]->peers.size(), 2u);
    EXPECT_EQ(results[i]->peers[0].node_rank, 1);
    EXPECT_EQ(results[i]->peers[1].node_rank, 2);
    EXPECT_EQ(results[i]->world_size, 2 + 3);
    EXPECT_EQ(results[i]->incarnation, results[1]->incarnation);
  }
}

// Node 2 departs (its daemon shuts down) while its lease lives on: every
// heartbeat names it departed and the survivors re-form without it at
// once. Counted out by silence instead, the round would wait the lease
// TTL and kPresumedDeadAfter (62 s), past the survivors' 20 s join timeout.
TEST_F(EtcdRendezvousTest, ADepartedNodeIsNamedSoAndTheSurvivorsReformWithoutItAtOnce) {
  const absl::Duration ttl = absl::Seconds(60);
  AddNodes(3, ttl, /*min_nodes=*/2);
  ASSERT_TRUE(FormGeneration());
  ASSERT_TRUE(nodes_[2]->Depart(2, 1, "gradsyncd is shutting down (SIGTERM)").ok());
  const absl::StatusOr<HeartbeatResult> beat = Beat(*nodes_[0], 0);
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
  std::vector<absl::StatusOr<JoinResult>> results =
      ReformResuming({0, 1}, absl::OkStatus(), {7, 7, 7}, ttl, absl::Seconds(20));
  for (int i : {0, 1}) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(results[i]->generation, 2u);
    ASSERT_EQ(results[i]->peers.size(), 2u);
    EXPECT_EQ(results[i]->peers[0].node_rank, 0);
    EXPECT_EQ(results[i]->peers[1].node_rank, 1);
    EXPECT_EQ(results[i]->world_size, 1 + 2);
  }
}

// Node 2's lease lives on (a 60 s TTL) but its daemon's port refuses
// connections: the survivors' probe names it dead at once, records it for
// every survivor, and the round counts it out.
TEST_F(EtcdRendezvousTest, ANodeWhoseDaemonRefusesConnectionsIsNamedSoAndTheSurvivorsReform) {
  const absl::Duration ttl = absl::Seconds(60);
  const std::vector<testing::LoopbackPort> ports = [] {
    std::vector<testing::LoopbackPort> p;
    p.push_back(testing::LoopbackPort::Listening());
    p.push_back(testing::LoopbackPort::Listening());
    p.push_back(testing::LoopbackPort::Refusing());
    return p;
  }();
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(Rendezvous(etcd_.endpoints(), kToken, ttl, 2));
  std::vector<absl::StatusOr<JoinResult>> formed(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      JoinParams p = Node(i, 3);
      p.listen_address = ports[i].address();
      formed[i] = nodes[i]->Join(p);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::StatusOr<JoinResult>& r : formed) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(formed[0]->peers[2].listen_address, ports[2].address());
  HeartbeatParams hb;
  hb.node_rank = 0;
  hb.generation = 1;
  hb.node_error = MakeError(v1::PEER_FAILED, "allreduce failed");
  ASSERT_TRUE(nodes[0]->Heartbeat(hb).ok());
  hb.node_error = absl::OkStatus();
  const absl::StatusOr<HeartbeatResult> beat = nodes[0]->Heartbeat(hb);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->abort);
  bool named = false;
  for (const SilentMember& m : beat->silent_members) {
    EXPECT_EQ(m.refuses_connections, m.node_rank == 2) << "node_rank=" << m.node_rank;
    if (m.node_rank == 2) {
      EXPECT_EQ(m.listen_address, ports[2].address());
    }
    named |= m.node_rank == 2;
  }
  EXPECT_TRUE(named) << "node 2 missing from the silent members";
  std::vector<absl::StatusOr<JoinResult>> results(2, absl::UnknownError("not run"));
  threads.clear();
  for (int i : {0, 1}) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(nodes[i]->Leave(i, 1, "re-forming").ok());
      nodes[i] = Rendezvous(etcd_.endpoints(), kToken, ttl, /*min_nodes=*/2);
      JoinParams p = Node(i, 3, absl::Seconds(20));
      p.listen_address = ports[i].address();
      p.resume_generation = 1;
      p.resume_iteration = 7;
      results[i] = nodes[i]->Join(p);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::StatusOr<JoinResult>& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
    ASSERT_EQ(r->peers.size(), 2u);
    EXPECT_EQ(r->peers[1].node_rank, 1);
  }
}

TEST_F(EtcdRendezvousTest, FewerSurvivorsThanMinNodesFailNamingMinNodesAndTheDead) {
  std::vector<absl::StatusOr<JoinResult>> results = ResumeAfterDeaths({1, 2}, {7, 7, 7});
  ASSERT_EQ(results.size(), 3u);
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(CodeOf(results[0].status()), v1::PEER_FAILED) << results[0].status();
  EXPECT_THAT(results[0].status().message(),
              HasSubstr("only 1 node(s) survive generation 1, fewer than --min-nodes=2"));
  EXPECT_THAT(results[0].status().message(), HasSubstr("node_rank=1 (host=10.0.0.2"));
  EXPECT_THAT(results[0].status().message(), HasSubstr("node_rank=2 (host=10.0.0.3"));

  // The failed round does not stand in the way of the next job: three
  // fresh daemons form the generation after it.
  nodes_.clear();
  AddNodes(3, kLeaseTtl, /*min_nodes=*/2);
  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes_)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 3u);
    EXPECT_EQ(r->peers.size(), 3u);
  }
}

// The embedded leader's rule (resume_rule.h): one iteration apart, the
// survivors form the next generation at the higher; further apart, all fail.
TEST_F(EtcdRendezvousTest, SurvivorsOneIterationApartFormTheNextGenerationAtTheHigher) {
  std::vector<absl::StatusOr<JoinResult>> results = ResumeAfterDeaths({2}, {4, 5, 0});
  ASSERT_EQ(results.size(), 3u);
  for (int i : {0, 1}) {
    ASSERT_TRUE(results[i].ok()) << "node " << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->generation, 2u);
    ASSERT_EQ(results[i]->peers.size(), 2u);
  }
}

TEST_F(EtcdRendezvousTest, SurvivorsMoreThanOneIterationApartAllFailNamingBoth) {
  std::vector<absl::StatusOr<JoinResult>> results = ResumeAfterDeaths({2}, {4, 6, 0});
  ASSERT_EQ(results.size(), 3u);
  for (int i : {0, 1}) {
    ASSERT_FALSE(results[i].ok()) << "node " << i;
    EXPECT_EQ(CodeOf(results[i].status()), v1::PEER_FAILED) << results[i].status();
    EXPECT_THAT(results[i].status().message(),
                HasSubstr("stopped in different iterations more than one apart (node_rank=0 in "
                          "4, node_rank=1 in 6)"));
  }
}

TEST_F(EtcdRendezvousTest, TheConfigLogGrowsInOrderAndHeartbeatsAnswerItsNewestVersion) {
  AddNodes(2);
  auto value = [](const EtcdConfigEntry& e) { return absl::StrCat("v", e.version); };
  // No generation yet: nothing to change (AppendOrHoldConfig holds it).
  absl::StatusOr<EtcdConfigEntry> early = nodes_[1]->AppendConfig(5, value);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(CodeOf(early.status()), v1::STATE) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("no active generation"));

  ASSERT_TRUE(FormGeneration());
  absl::StatusOr<EtcdConfigEntry> first = nodes_[1]->AppendConfig(10, value);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->generation, 1u);
  EXPECT_EQ(first->version, 1u);
  EXPECT_EQ(first->at_iteration, 10u);
  // Asked for an earlier switch: still after the previous version's.
  absl::StatusOr<EtcdConfigEntry> second = nodes_[0]->AppendConfig(3, value);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version, 2u);
  EXPECT_EQ(second->at_iteration, 11u);
  absl::StatusOr<std::optional<std::string>> stored = nodes_[0]->Get("g1/config/2");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->value_or("none"), "v2");
  absl::StatusOr<HeartbeatResult> r = Beat(*nodes_[0], 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config_version, 2u);
}

// --autotune's appends name the generation they tune: once survivors
// re-formed, a candidate meant for the old generation is refused instead of
// landing in the new one's log; the new generation's log takes its own.
TEST_F(EtcdRendezvousTest, AnAppendForAGenerationThatIsNoLongerActiveIsRefusedNamingBoth) {
  std::vector<absl::StatusOr<JoinResult>> results = ResumeAfterDeaths({0}, {7, 7, 7});
  ASSERT_EQ(results.size(), 3u);
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  ASSERT_EQ(results[1]->generation, 2u);
  std::shared_ptr<EtcdRendezvous> tuner = NewNode();
  auto value = [](const EtcdConfigEntry& e) { return absl::StrCat("v", e.version); };
  absl::StatusOr<EtcdConfigEntry> stale = tuner->AppendConfig(9, value, /*generation=*/1);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(CodeOf(stale.status()), v1::STATE) << stale.status();
  EXPECT_THAT(stale.status().message(),
              HasSubstr("generation 1 is not the job's active generation in etcd at"));
  EXPECT_THAT(stale.status().message(), HasSubstr("(generation 2 is)"));
  absl::StatusOr<EtcdConfigEntry> current = tuner->AppendConfig(9, value, /*generation=*/2);
  ASSERT_TRUE(current.ok()) << current.status();
  EXPECT_EQ(current->generation, 2u);
  EXPECT_EQ(current->version, 1u);
  EXPECT_EQ(current->at_iteration, 9u);
}

// Version `version` of `generation`'s config log, as every node reads it.
absl::StatusOr<JobConfigChange> ReadConfig(EtcdRendezvous& node, uint64_t generation,
                                           uint64_t version) {
  absl::StatusOr<std::optional<std::string>> stored = node.Get(ConfigKey(generation, version));
  if (!stored.ok()) return stored.status();
  return DecodeConfig(ConfigKey(generation, version), *stored);
}

TEST_F(EtcdRendezvousTest, AChangeMadeWhileNoGenerationRunsBecomesTheNextGenerationsVersionOne) {
  AddNodes(2, kLeaseTtl, /*min_nodes=*/1);
  // Before the job forms: held, the newer change replacing the older.
  absl::StatusOr<std::optional<EtcdConfigEntry>> older = nodes_[1]->AppendOrHoldConfig(5, 50, 1);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_FALSE(older->has_value());
  absl::StatusOr<std::optional<EtcdConfigEntry>> newer = nodes_[0]->AppendOrHoldConfig(5, 25, 2);
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_FALSE(newer->has_value());
  ASSERT_TRUE(FormGeneration());
  absl::StatusOr<JobConfigChange> first = ReadConfig(*nodes_[1], 1, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->generation, 1u);
  EXPECT_EQ(first->at_iteration, kHeldConfigAfter);
  EXPECT_EQ(first->bucket_cap_mb, 25);
  EXPECT_EQ(first->first_bucket_cap_mb, 2);
  absl::StatusOr<HeartbeatResult> beat = Beat(*nodes_[1], 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->config_version, 1u);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = RawClient();
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::optional<EtcdKeyValue>> held = (*client)->Get("gs/job/job1/config_held");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_FALSE(held->has_value()) << "the held change stayed after generation 1 took it";

  // While generation 1 runs a change is appended, not held.
  absl::StatusOr<std::optional<EtcdConfigEntry>> running = nodes_[1]->AppendOrHoldConfig(10, 30, 1);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(running->has_value());
  EXPECT_EQ((*running)->generation, 1u);
  EXPECT_EQ((*running)->version, 2u);
  EXPECT_EQ((*running)->at_iteration, 10u);

  // Node 1 dies; node 0 (--min-nodes 1) re-forms alone from iteration 7,
  // and a change made meanwhile is generation 2's version 1 at 7 + 2.
  // The change goes through node 0's daemon's own session, which lives on
  // while its job's link is replaced (the held key lives under its lease).
  nodes_[1].reset();
  ASSERT_TRUE(Beat(*nodes_[0], 0, 1, absl::UnavailableError("a collective failed")).ok());
  ASSERT_TRUE(nodes_[0]->Leave(0, 1, "re-forming").ok());
  std::shared_ptr<EtcdRendezvous> config_session = NewNode(kLeaseTtl, /*min_nodes=*/1);
  absl::StatusOr<std::optional<EtcdConfigEntry>> reforming =
      config_session->AppendOrHoldConfig(3, 8, 1);
  ASSERT_TRUE(reforming.ok()) << reforming.status();
  EXPECT_FALSE(reforming->has_value());
  nodes_[0] = NewNode(kLeaseTtl, /*min_nodes=*/1);
  JoinParams resume = Node(0, 2);
  resume.resume_generation = 1;
  resume.resume_iteration = 7;
  absl::StatusOr<JoinResult> reformed = nodes_[0]->Join(resume);
  ASSERT_TRUE(reformed.ok()) << reformed.status();
  EXPECT_EQ(reformed->generation, 2u);
  absl::StatusOr<JobConfigChange> second = ReadConfig(*nodes_[0], 2, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->generation, 2u);
  EXPECT_EQ(second->at_iteration, 7 + kHeldConfigAfter);
  EXPECT_EQ(second->bucket_cap_mb, 8);
}

// A held change lives under the lease of the daemon that took it: once that
// daemon is gone (its lease revoked here; expired after a kill), the key is
// gone, and a job formed later under the same job id starts without it.
TEST_F(EtcdRendezvousTest, AHeldChangeGoesWithTheDaemonThatHeldIt) {
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = RawClient();
  ASSERT_TRUE(client.ok()) << client.status();
  {
    std::shared_ptr<EtcdRendezvous> gone = NewNode();
    absl::StatusOr<std::optional<EtcdConfigEntry>> held = gone->AppendOrHoldConfig(5, 50, 1);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_FALSE(held->has_value());
    absl::StatusOr<std::optional<EtcdKeyValue>> key = (*client)->Get("gs/job/job1/config_held");
    ASSERT_TRUE(key.ok()) << key.status();
    ASSERT_TRUE(key->has_value());
    EXPECT_NE((*key)->lease, 0) << "held without a lease: it would outlive every daemon";
  }
  absl::StatusOr<std::optional<EtcdKeyValue>> after = (*client)->Get("gs/job/job1/config_held");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_FALSE(after->has_value()) << "the held change outlived the daemon that took it";
  AddNodes(2);
  ASSERT_TRUE(FormGeneration());
  absl::StatusOr<HeartbeatResult> beat = Beat(*nodes_[1], 1);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->config_version, 0u) << "the new job inherited a gone daemon's change";
}

// What every node of a grown generation must be told alike.
void ExpectGeneration(const absl::StatusOr<JoinResult>& r, uint64_t generation,
                      const std::vector<int>& ranks, uint64_t start_iteration,
                      uint64_t incarnation) {
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generation, generation);
  EXPECT_EQ(r->start_iteration, start_iteration);
  EXPECT_EQ(r->incarnation, incarnation);
  std::vector<int> members;
  int world_size = 0;
  for (const RendezvousPeer& p : r->peers) {
    members.push_back(p.node_rank);
    world_size += p.local_size;
  }
  EXPECT_EQ(members, ranks);
  int expected_world = 0;
  for (int rank : ranks) expected_world += rank + 1;  // Node(): local_size = rank + 1
  EXPECT_EQ(r->world_size, expected_world);
  EXPECT_EQ(world_size, expected_world);
}

// A fresh node 2 of a running elastic job of nodes 0 and 1 (--max-nodes 3)
// is held; node 0's heartbeat (the generation's first member) appends the
// grow entry at its iteration + 2, node 1's does not; the joiner waits
// until both members left generation 1 at that boundary, and all three
// form generation 2 starting there.
TEST_F(EtcdRendezvousTest, ANodeJoiningARunningJobIsHeldUntilItsMembersGrowAtTheBoundary) {
  AddNodes(2, kLeaseTtl, /*min_nodes=*/1, /*max_nodes=*/3);
  ASSERT_TRUE(FormGeneration());
  BackgroundJoin joiner(NewNode(kLeaseTtl, 1, 3), Node(2, 2));
  ASSERT_TRUE(
      testing::WaitUntil([&] { return JobKeyExists("gen/1/joining/2"); }, absl::Seconds(30)));

  absl::StatusOr<HeartbeatResult> second = Beat(*nodes_[1], 1, 1, absl::OkStatus(), 5);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->config_version, 0u);  // node 0's to append
  absl::StatusOr<HeartbeatResult> first = Beat(*nodes_[0], 0, 1, absl::OkStatus(), 5);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->abort);
  EXPECT_EQ(first->config_version, 1u);
  absl::StatusOr<std::optional<std::string>> stored = nodes_[1]->Get(ConfigKey(1, 1));
  ASSERT_TRUE(stored.ok()) << stored.status();
  absl::StatusOr<JobConfigChange> grow = DecodeConfig(ConfigKey(1, 1), *stored);
  ASSERT_TRUE(grow.ok()) << grow.status();
  EXPECT_TRUE(grow->grow);
  EXPECT_EQ(grow->at_iteration, 7u);
  // Heard again: still the one entry.
  absl::StatusOr<HeartbeatResult> again = Beat(*nodes_[0], 0, 1, absl::OkStatus(), 6);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->config_version, 1u);
  EXPECT_FALSE(joiner.done()) << joiner.Result().status();  // no member switched yet

  std::vector<absl::StatusOr<JoinResult>> members =
      SwitchAtTheGrowBoundary({0, 1}, 1, 7, /*num_nodes=*/2, 1, 3);
  absl::StatusOr<JoinResult> joined = joiner.Result();
  ASSERT_TRUE(joined.ok()) << joined.status();
  for (const absl::StatusOr<JoinResult>* r : {&members[0], &members[1], &joined}) {
    ExpectGeneration(*r, 2, {0, 1, 2}, 7, joined->incarnation);
  }
  EXPECT_FALSE(JobKeyExists("gen/1/joining/2"));  // generation 1's keys went with it
}

// Two joiners and three members racing: node 0's heartbeat from two
// threads (each may append) and the others', all at once, leave exactly
// one grow entry; the members switching at once and the joiners all decide
// the same generation 3 of all five.
TEST_F(EtcdRendezvousTest, MembersRacingAtTheGrowBoundaryAgreeOnOneEntryAndOneGeneration) {
  AddNodes(3, kLeaseTtl, /*min_nodes=*/2, /*max_nodes=*/5);
  ASSERT_TRUE(FormGeneration());
  BackgroundJoin joiner3(NewNode(kLeaseTtl, 2, 5), Node(3, 3));
  BackgroundJoin joiner4(NewNode(kLeaseTtl, 2, 5), Node(4, 3));
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return JobKeyExists("gen/1/joining/3") && JobKeyExists("gen/1/joining/4"); },
      absl::Seconds(30)));
  std::vector<std::thread> beats;
  for (int t = 0; t < 4; ++t) {
    beats.emplace_back([&, t] {
      const int rank = t < 2 ? 0 : t - 1;
      for (int i = 0; i < 5; ++i) {
        absl::StatusOr<HeartbeatResult> r = Beat(*nodes_[rank], rank, 1, absl::OkStatus(), 4);
        EXPECT_TRUE(r.ok()) << r.status();
      }
    });
  }
  for (std::thread& t : beats) t.join();
  // Every member then reads the one entry.
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<HeartbeatResult> r = Beat(*nodes_[rank], rank, 1, absl::OkStatus(), 4);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->config_version, 1u) << "node " << rank;
  }
  absl::StatusOr<std::optional<std::string>> second = nodes_[0]->Get(ConfigKey(1, 2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->has_value()) << **second;

  std::vector<absl::StatusOr<JoinResult>> members =
      SwitchAtTheGrowBoundary({0, 1, 2}, 1, 6, /*num_nodes=*/3, 2, 5);
  absl::StatusOr<JoinResult> joined3 = joiner3.Result();
  absl::StatusOr<JoinResult> joined4 = joiner4.Result();
  ASSERT_TRUE(joined3.ok()) << joined3.status();
  for (const absl::StatusOr<JoinResult>* r :
       {&members[0], &members[1], &members[2], &joined3, &joined4}) {
    ExpectGeneration(*r, 2, {0, 1, 2, 3, 4}, 6, joined3->incarnation);
  }
}

// Node 2 dies at the grow boundary (its lease gone) while nodes 0 and 1
// switch: they grow without it, with the joiner, instead of waiting for it.
TEST_F(EtcdRendezvousTest, AMemberDeadAtTheGrowBoundaryIsLeftOutAndTheOthersGrowWithTheJoiner) {
  AddNodes(3, kLeaseTtl, /*min_nodes=*/2, /*max_nodes=*/4);
  ASSERT_TRUE(FormGeneration());
  BackgroundJoin joiner(NewNode(kLeaseTtl, 2, 4), Node(3, 3));
  ASSERT_TRUE(
      testing::WaitUntil([&] { return JobKeyExists("gen/1/joining/3"); }, absl::Seconds(30)));
  absl::StatusOr<HeartbeatResult> first = Beat(*nodes_[0], 0, 1, absl::OkStatus(), 3);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->config_version, 1u);
  nodes_[2].reset();  // its lease revoked: as one that expired
  std::vector<absl::StatusOr<JoinResult>> members =
      SwitchAtTheGrowBoundary({0, 1}, 1, 5, /*num_nodes=*/3, 2, 4);
  absl::StatusOr<JoinResult> joined = joiner.Result();
  ASSERT_TRUE(joined.ok()) << joined.status();
  for (const absl::StatusOr<JoinResult>* r : {&members[0], &members[1], &joined}) {
    ExpectGeneration(*r, 2, {0, 1, 3}, 5, joined->incarnation);
  }
}

// A fresh node 2 while the survivors of node 2's death re-form: it is held
// out of their round, joins the generation they form at its grow boundary.
TEST_F(EtcdRendezvousTest, AJoinerArrivingWhileTheSurvivorsReformJoinsTheGenerationTheyForm) {
  AddNodes(3, kLeaseTtl, /*min_nodes=*/2);
  ASSERT_TRUE(FormGeneration());
  nodes_[2].reset();
  ASSERT_TRUE(Beat(*nodes_[0], 0, 1, absl::UnavailableError("a collective failed")).ok());
  BackgroundJoin joiner(NewNode(kLeaseTtl, 2), Node(2, 3));
  std::vector<absl::StatusOr<JoinResult>> survivors =
      ReformResuming({0, 1}, absl::OkStatus(), {7, 7, 7});
  ASSERT_TRUE(survivors[0].ok()) << survivors[0].status();
  ExpectGeneration(survivors[0], 2, {0, 1}, 7, survivors[0]->incarnation);
  ExpectGeneration(survivors[1], 2, {0, 1}, 7, survivors[0]->incarnation);
  ASSERT_TRUE(
      testing::WaitUntil([&] { return JobKeyExists("gen/2/joining/2"); }, absl::Seconds(30)))
      << joiner.done();
  absl::StatusOr<HeartbeatResult> first = Beat(*nodes_[0], 0, 2, absl::OkStatus(), 8);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->config_version, 1u);
  std::vector<absl::StatusOr<JoinResult>> members =
      SwitchAtTheGrowBoundary({0, 1}, 2, 10, /*num_nodes=*/3, 2, 3);
  absl::StatusOr<JoinResult> joined = joiner.Result();
  ASSERT_TRUE(joined.ok()) << joined.status();
  for (const absl::StatusOr<JoinResult>* r : {&members[0], &members[1], &joined}) {
    ExpectGeneration(*r, 3, {0, 1, 2}, 10, joined->incarnation);
  }
}

TEST_F(EtcdRendezvousTest, ARankAtMaxNodesIsRefusedNamingIt) {
  AddNodes(2, kLeaseTtl, /*min_nodes=*/1, /*max_nodes=*/3);
  ASSERT_TRUE(FormGeneration());
  absl::StatusOr<JoinResult> r = NewNode(kLeaseTtl, 1, 3)->Join(Node(3, 2, absl::Seconds(5)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(CodeOf(r.status()), v1::INVALID_ARGUMENT) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("node_rank=3 is out of range [0, 3)"));
  EXPECT_THAT(r.status().message(), HasSubstr("--max-nodes=3"));
  EXPECT_FALSE(JobKeyExists("gen/1/joining/3"));
}

// Node 0 died and nodes 1 and 2 run on (ranks [1,3) and [3,6) kept): a
// replacement node 0 is held like any joiner, node 1 (the first live member)
// appends the grow entry, and all three form generation 3 with node 0 back
// on rank 0 and marked as joining, so node 1 publishes the running plan
// and the joiners' trainers catch up from its lowest live rank. A new
// node 3 joining at once takes the lowest free range of 4, [6,10).
TEST_F(EtcdRendezvousTest, NodesJoiningWhileNodeZeroIsNoMemberTakeFreeRanksAtTheBoundary) {
  std::vector<absl::StatusOr<JoinResult>> results = ResumeAfterDeaths({0}, {7, 7, 7});
  ASSERT_EQ(results.size(), 3u);
  for (int i : {1, 2}) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    ASSERT_EQ(results[i]->peers.size(), 2u);
    EXPECT_EQ(results[i]->peers[0].rank_offset, 1);
    EXPECT_EQ(results[i]->peers[1].rank_offset, 3);
  }
  BackgroundJoin joiner0(NewNode(kLeaseTtl, 2, 4), Node(0, 3));
  BackgroundJoin joiner3(NewNode(kLeaseTtl, 2, 4), Node(3, 3));
  ASSERT_TRUE(testing::WaitUntil(
      [&] { return JobKeyExists("gen/2/joining/0") && JobKeyExists("gen/2/joining/3"); },
      absl::Seconds(30)));
  absl::StatusOr<HeartbeatResult> first = Beat(*nodes_[1], 1, 2, absl::OkStatus(), 7);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->config_version, 1u);  // node 1 appended the grow entry, at 9
  std::vector<absl::StatusOr<JoinResult>> members =
      SwitchAtTheGrowBoundary({1, 2}, 2, 9, /*num_nodes=*/3, 2, 4);
  absl::StatusOr<JoinResult> joined0 = joiner0.Result();
  absl::StatusOr<JoinResult> joined3 = joiner3.Result();
  for (const absl::StatusOr<JoinResult>* r : {&members[1], &members[2], &joined0, &joined3}) {
    ASSERT_TRUE(r->ok()) << r->status();
    EXPECT_EQ((*r)->generation, 3u);
    EXPECT_EQ((*r)->start_iteration, 9u);
    ASSERT_EQ((*r)->peers.size(), 4u);
    std::vector<int> offsets;
    std::vector<bool> joins;
    for (const RendezvousPeer& p : (*r)->peers) {
      offsets.push_back(p.rank_offset);
      joins.push_back(p.joins_running);
    }
    EXPECT_EQ(offsets, (std::vector<int>{0, 1, 3, 6}));
    EXPECT_EQ(joins, (std::vector<bool>{true, false, false, true}));
  }
}

// Its members never reach a boundary (no heartbeat appends the entry): the
// joiner's Join times out naming etcd, the job and its members, and its
// keys go.
TEST_F(EtcdRendezvousTest, AJoinerWhoseMembersNeverGrowTimesOutNamingThemAndEtcd) {
  AddNodes(2, kLeaseTtl, /*min_nodes=*/1, /*max_nodes=*/3);
  ASSERT_TRUE(FormGeneration());
  absl::StatusOr<JoinResult> r = NewNode(kLeaseTtl, 1, 3)->Join(Node(2, 2, absl::Seconds(2)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(CodeOf(r.status()), v1::TIMEOUT) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("etcd at "));
  EXPECT_THAT(r.status().message(),
              HasSubstr("node_rank=2 waits to join running generation 1 of elastic job 'job1' "
                        "(members: node_rank=0,1)"));
  EXPECT_THAT(r.status().message(), HasSubstr("no member has appended the grow entry"));
  EXPECT_FALSE(JobKeyExists("gen/1/joining/2"));
  EXPECT_FALSE(JobKeyExists("gen/2/join/2"));
}

// A hang would be caught by the test's own timeout (size "medium"); what is
// asserted here is that the join ends with UNAVAILABLE naming the dead etcd.
TEST_F(EtcdRendezvousTest, UnreachableEtcdFailsTheJoinUnavailableNamingEtcd) {
  const std::vector<std::string> endpoints = etcd_.endpoints();
  etcd_.Kill(0);
  std::shared_ptr<EtcdRendezvous> node0 = NewNode();
  absl::StatusOr<JoinResult> r = node0->Join(Node(0, 2, absl::Seconds(4)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("etcd at ", endpoints[0])));
}

// A node whose every etcd call may retry for 10 s, as a daemon's does with
// --timeout-s 10 or more.
std::shared_ptr<EtcdRendezvous> PatientNode(const std::vector<std::string>& endpoints) {
  EtcdRendezvousOptions options;
  options.etcd.endpoints = endpoints;
  options.etcd.call_timeout = absl::Seconds(10);
  options.etcd.attempt_timeout = absl::Milliseconds(1500);
  options.prefix = "gs";
  options.job_id = "job1";
  options.job_token = kToken;
  absl::StatusOr<std::shared_ptr<EtcdRendezvous>> r = EtcdRendezvous::Connect(options);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : nullptr;
}

// The member stopped (it answers nothing), a join of 1 s ends at its own
// deadline, not one call budget (10 s, longer than this test waits) later:
// UNAVAILABLE naming etcd's member and the join.
TEST_F(EtcdRendezvousTest, AJoinAgainstAStoppedEtcdEndsAtItsOwnDeadline) {
  std::shared_ptr<EtcdRendezvous> node = PatientNode(etcd_.endpoints());
  ASSERT_NE(node, nullptr);
  etcd_.Stop(0);
  BackgroundJoin join(node, Node(0, 2, absl::Seconds(1)));
  const bool ended = testing::WaitUntil([&] { return join.done(); }, absl::Seconds(5));
  EXPECT_TRUE(ended) << "the 1 s join still runs 5 s later";
  absl::StatusOr<JoinResult> r = join.Result();
  etcd_.Continue(0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ(CodeOf(r.status()), v1::UNAVAILABLE) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("etcd at ", etcd_.endpoints()[0],
                                                           " did not answer the join")));
  EXPECT_THAT(r.status().message(), HasSubstr("all that was left of the join's 1s deadline"));
  EXPECT_THAT(r.status().message(), HasSubstr(etcd_.endpoints()[0] + ": DEADLINE_EXCEEDED"));
}

// With etcd answering, a wait for a key nobody sets ends TIMEOUT naming
// it: the read that its deadline cut short is not taken for etcd's silence.
TEST_F(EtcdRendezvousTest, AWaitForAKeyNobodySetsTimesOutNamingIt) {
  std::shared_ptr<EtcdRendezvous> node = PatientNode(etcd_.endpoints());
  ASSERT_NE(node, nullptr);
  absl::StatusOr<JoinResult> formed = node->Join(Node(0, 1));
  ASSERT_TRUE(formed.ok()) << formed.status();
  absl::Status waited = node->Wait({"g1/never"}, absl::Seconds(1));
  EXPECT_EQ(CodeOf(waited), v1::TIMEOUT) << waited;
  EXPECT_THAT(waited.message(), HasSubstr("wait timed out after 1000 ms; missing keys: g1/never"));
}

// A wait of 1 s for keys of a formed generation, etcd stopped meanwhile,
// ends at its own deadline too: UNAVAILABLE naming etcd and the wait.
TEST_F(EtcdRendezvousTest, AWaitAgainstAStoppedEtcdEndsAtItsOwnDeadline) {
  std::shared_ptr<EtcdRendezvous> node = PatientNode(etcd_.endpoints());
  ASSERT_NE(node, nullptr);
  absl::StatusOr<JoinResult> formed = node->Join(Node(0, 1));
  ASSERT_TRUE(formed.ok()) << formed.status();
  etcd_.Stop(0);
  absl::Mutex mu;
  bool done = false;
  absl::Status waited;
  std::thread waiter([&] {
    absl::Status r = node->Wait({"g1/never"}, absl::Seconds(1));
    absl::MutexLock lock(&mu);
    waited = r;
    done = true;
  });
  const bool ended = testing::WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return done;
      },
      absl::Seconds(5));
  waiter.join();
  etcd_.Continue(0);
  EXPECT_TRUE(ended) << "the 1 s wait still ran 5 s later";
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(CodeOf(waited), v1::UNAVAILABLE) << waited;
  EXPECT_THAT(waited.message(),
              HasSubstr(absl::StrCat("waiting for keys: etcd at ", etcd_.endpoints()[0])));
  EXPECT_THAT(waited.message(), HasSubstr("all that was left of the wait's 1s deadline"));
}

}  // namespace
}  // namespace gradsync
