// The job's rendezvous kept in etcd (EtcdRendezvous), against real etcd
// members on loopback ports: daemons racing to form a generation agree on
// it, the job token never reaches etcd in plain text and a wrong one is
// refused, a missing node is named when a join times out, a member whose
// lease is gone aborts the generation naming it, a wait on an aborted
// generation's keys ends, a config change made while no generation runs
// becomes the next one's version 1, and an unreachable etcd is named within
// the timeout.
#include "daemon/cluster/etcd_rendezvous.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_code.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/testing/loopback_port.h"

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

std::shared_ptr<EtcdRendezvous> Rendezvous(const std::vector<std::string>& endpoints,
                                           const std::string& token = kToken,
                                           absl::Duration lease_ttl = absl::Seconds(10),
                                           int min_nodes = 0) {
  EtcdRendezvousOptions options;
  options.etcd.endpoints = endpoints;
  options.etcd.call_timeout = absl::Seconds(3);
  options.etcd.attempt_timeout = absl::Seconds(1);
  options.prefix = "gs";
  options.job_id = "job1";
  options.job_token = token;
  options.lease_ttl = lease_ttl;
  options.min_nodes = min_nodes;
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

TEST(EtcdRendezvousTest, NodesRacingToFormAGenerationAllGetTheSameOne) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes;
  for (int i = 0; i < 4; ++i) nodes.push_back(Rendezvous(etcd.endpoints()));
  std::vector<absl::StatusOr<JoinResult>> results = JoinAll(nodes);
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
  ASSERT_TRUE(nodes[3]->Set("g1/layout/3", "L3").ok());
  absl::StatusOr<std::map<std::string, std::string>> values =
      nodes[0]->WaitForValues({"g1/layout/3"}, absl::Seconds(10));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->at("g1/layout/3"), "L3");
}

TEST(EtcdRendezvousTest, TheJobTokenNeverReachesEtcdAndAnotherTokenIsRefused) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes = {Rendezvous(etcd.endpoints()),
                                                        Rendezvous(etcd.endpoints())};
  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes)) ASSERT_TRUE(r.ok()) << r.status();

  EtcdClientOptions raw;
  raw.endpoints = etcd.endpoints();
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(raw);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<EtcdRange> all = (*client)->GetPrefix("gs/");
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_FALSE(all->kvs.empty());
  for (const EtcdKeyValue& kv : all->kvs) {
    EXPECT_THAT(kv.value, Not(HasSubstr(kToken))) << kv.key;
  }

  std::shared_ptr<EtcdRendezvous> intruder = Rendezvous(etcd.endpoints(), "another-token");
  absl::StatusOr<JoinResult> refused = intruder->Join(Node(0, 2, absl::Seconds(5)));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("gs/job/job1/token_proof"));
  EXPECT_THAT(refused.status().message(), HasSubstr("another job token"));
}

TEST(EtcdRendezvousTest, AJoinTimeoutNamesTheNodeThatNeverJoined) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::shared_ptr<EtcdRendezvous> node0 = Rendezvous(etcd.endpoints());
  ASSERT_TRUE(node0->Set("forming/node2", "waiting for local_rank=1").ok());
  absl::StatusOr<JoinResult> r = node0->Join(Node(0, 3, absl::Seconds(2)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(CodeOf(r.status()), v1::TIMEOUT) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("1 of 3 nodes joined"));
  EXPECT_THAT(r.status().message(), HasSubstr("node_rank=1 (no report from it"));
  EXPECT_THAT(r.status().message(), HasSubstr("node_rank=2 (waiting for local_rank=1)"));
}

TEST(EtcdRendezvousTest, AMemberWhoseLeaseIsGoneAbortsTheGenerationNamingIt) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes = {Rendezvous(etcd.endpoints()),
                                                        Rendezvous(etcd.endpoints())};
  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes)) ASSERT_TRUE(r.ok()) << r.status();
  HeartbeatParams hb;
  hb.node_rank = 0;
  hb.generation = 1;
  absl::StatusOr<HeartbeatResult> before = nodes[0]->Heartbeat(hb);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->abort);

  // A wait on generation 1's keys is under way when node 1 goes.
  absl::StatusOr<std::map<std::string, std::string>> waited;
  std::thread waiter([&] { waited = nodes[0]->WaitForValues({"g1/never"}, absl::Seconds(30)); });
  nodes[1].reset();  // its lease is revoked: as a lease that expired
  absl::StatusOr<HeartbeatResult> after = nodes[0]->Heartbeat(hb);
  waiter.join();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->abort);
  EXPECT_THAT(after->abort_reason, HasSubstr("node_rank=1 (host=10.0.0.2) is dead"));
  EXPECT_THAT(after->abort_reason, HasSubstr("lease"));
  ASSERT_EQ(after->silent_members.size(), 1u);
  EXPECT_EQ(after->silent_members[0].node_rank, 1);
  EXPECT_GE(after->silent_members[0].silent, absl::Seconds(2));  // presumed dead at once
  ASSERT_FALSE(waited.ok());
  EXPECT_EQ(CodeOf(waited.status()), v1::PEER_FAILED) << waited.status();
  EXPECT_THAT(waited.status().message(), HasSubstr("node_rank=1 (host=10.0.0.2) is dead"));

  // The next generation forms with a new daemon for node 1.
  nodes[1] = Rendezvous(etcd.endpoints());
  std::vector<absl::StatusOr<JoinResult>> again = JoinAll(nodes);
  for (const absl::StatusOr<JoinResult>& r : again) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 2u);
  }
}

TEST(EtcdRendezvousTest, ANodeErrorAbortsTheGenerationForEveryMember) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes = {Rendezvous(etcd.endpoints()),
                                                        Rendezvous(etcd.endpoints())};
  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes)) ASSERT_TRUE(r.ok()) << r.status();
  HeartbeatParams report;
  report.node_rank = 1;
  report.generation = 1;
  report.node_error = absl::DataLossError("trainer 3 stopped");
  ASSERT_TRUE(nodes[1]->Heartbeat(report).ok());
  HeartbeatParams hb;
  hb.node_rank = 0;
  hb.generation = 1;
  absl::StatusOr<HeartbeatResult> r = nodes[0]->Heartbeat(hb);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->abort);
  EXPECT_THAT(r->abort_reason, HasSubstr("node_rank=1 (host=10.0.0.2) reported"));
  EXPECT_THAT(r->abort_reason, HasSubstr("trainer 3 stopped"));
  EXPECT_TRUE(r->silent_members.empty());  // node 1 acknowledged its own abort
}

// Three nodes of an elastic job (--min-nodes 2) formed generation 1; each
// node in `dead` is gone (its lease revoked, as one that expired, never
// having heard of the abort); the others report a failure and join again to
// resume generation 1 at `iterations[rank]`.
std::vector<absl::StatusOr<JoinResult>> ResumeAfterDeaths(const std::vector<std::string>& endpoints,
                                                          const std::vector<int>& dead,
                                                          const std::vector<uint64_t>& iterations) {
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(Rendezvous(endpoints, kToken, absl::Seconds(10), /*min_nodes=*/2));
  }
  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes)) {
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
  }
  for (int d : dead) nodes[d].reset();
  std::vector<absl::StatusOr<JoinResult>> results(3, absl::UnknownError("dead"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    if (!nodes[i]) continue;
    threads.emplace_back([&, i] {
      HeartbeatParams report;
      report.node_rank = i;
      report.generation = 1;
      report.node_error = absl::UnavailableError("a collective failed");
      EXPECT_TRUE(nodes[i]->Heartbeat(report).ok());
      // The survivor's link leaves; a new one joins (as job_reform does).
      EXPECT_TRUE(nodes[i]->Leave(i, 1, "re-forming").ok());
      nodes[i] = Rendezvous(endpoints, kToken, absl::Seconds(10), /*min_nodes=*/2);
      JoinParams p = Node(i, 3);
      p.resume_generation = 1;
      p.resume_iteration = iterations[i];
      results[i] = nodes[i]->Join(p);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST(EtcdRendezvousTest, SurvivorsReformWithoutADeadNodeZero) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<absl::StatusOr<JoinResult>> results =
      ResumeAfterDeaths(etcd.endpoints(), {0}, {7, 7, 7});
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
TEST(EtcdRendezvousTest, ADepartedNodeIsNamedSoAndTheSurvivorsReformWithoutItAtOnce) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  const absl::Duration ttl = absl::Seconds(60);
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(Rendezvous(etcd.endpoints(), kToken, ttl, 2));
  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes)) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(nodes[2]->Depart(2, 1, "gradsyncd is shutting down (SIGTERM)").ok());
  HeartbeatParams hb;
  hb.node_rank = 0;
  hb.generation = 1;
  const absl::StatusOr<HeartbeatResult> beat = nodes[0]->Heartbeat(hb);
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
  std::vector<absl::StatusOr<JoinResult>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i : {0, 1}) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(nodes[i]->Leave(i, 1, "re-forming").ok());
      nodes[i] = Rendezvous(etcd.endpoints(), kToken, ttl, /*min_nodes=*/2);
      JoinParams p = Node(i, 3, absl::Seconds(20));
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
    EXPECT_EQ(r->peers[0].node_rank, 0);
    EXPECT_EQ(r->peers[1].node_rank, 1);
    EXPECT_EQ(r->world_size, 1 + 2);
  }
}

// Node 2's lease lives on (a 60 s TTL) but its daemon's port refuses
// connections: the survivors' probe names it dead at once, records it for
// every survivor, and the round counts it out.
TEST(EtcdRendezvousTest, ANodeWhoseDaemonRefusesConnectionsIsNamedSoAndTheSurvivorsReform) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  const absl::Duration ttl = absl::Seconds(60);
  const std::vector<testing::LoopbackPort> ports = [] {
    std::vector<testing::LoopbackPort> p;
    p.push_back(testing::LoopbackPort::Listening());
    p.push_back(testing::LoopbackPort::Listening());
    p.push_back(testing::LoopbackPort::Refusing());
    return p;
  }();
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(Rendezvous(etcd.endpoints(), kToken, ttl, 2));
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
    if (m.node_rank == 2) EXPECT_EQ(m.listen_address, ports[2].address());
    named |= m.node_rank == 2;
  }
  EXPECT_TRUE(named) << "node 2 missing from the silent members";
  std::vector<absl::StatusOr<JoinResult>> results(2, absl::UnknownError("not run"));
  threads.clear();
  for (int i : {0, 1}) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(nodes[i]->Leave(i, 1, "re-forming").ok());
      nodes[i] = Rendezvous(etcd.endpoints(), kToken, ttl, /*min_nodes=*/2);
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

TEST(EtcdRendezvousTest, FewerSurvivorsThanMinNodesFailNamingMinNodesAndTheDead) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<absl::StatusOr<JoinResult>> results =
      ResumeAfterDeaths(etcd.endpoints(), {1, 2}, {7, 7, 7});
  ASSERT_EQ(results.size(), 3u);
  ASSERT_FALSE(results[0].ok());
  EXPECT_EQ(CodeOf(results[0].status()), v1::PEER_FAILED) << results[0].status();
  EXPECT_THAT(results[0].status().message(),
              HasSubstr("only 1 node(s) survive generation 1, fewer than --min-nodes=2"));
  EXPECT_THAT(results[0].status().message(), HasSubstr("node_rank=1 (host=10.0.0.2"));
  EXPECT_THAT(results[0].status().message(), HasSubstr("node_rank=2 (host=10.0.0.3"));

  // The failed round does not stand in the way of the next job: three
  // fresh daemons form the generation after it.
  std::vector<std::shared_ptr<EtcdRendezvous>> fresh;
  for (int i = 0; i < 3; ++i) {
    fresh.push_back(Rendezvous(etcd.endpoints(), kToken, absl::Seconds(10), /*min_nodes=*/2));
  }
  for (const absl::StatusOr<JoinResult>& r : JoinAll(fresh)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->generation, 3u);
    EXPECT_EQ(r->peers.size(), 3u);
  }
}

TEST(EtcdRendezvousTest, SurvivorsInDifferentIterationsAllFailNamingBoth) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<absl::StatusOr<JoinResult>> results =
      ResumeAfterDeaths(etcd.endpoints(), {2}, {4, 5, 0});
  ASSERT_EQ(results.size(), 3u);
  for (int i : {0, 1}) {
    ASSERT_FALSE(results[i].ok()) << "node " << i;
    EXPECT_EQ(CodeOf(results[i].status()), v1::PEER_FAILED) << results[i].status();
    EXPECT_THAT(results[i].status().message(),
                HasSubstr("stopped in different iterations (node_rank=0 in 4, node_rank=1 in 5)"));
  }
}

TEST(EtcdRendezvousTest, TheConfigLogGrowsInOrderAndHeartbeatsAnswerItsNewestVersion) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes = {Rendezvous(etcd.endpoints()),
                                                        Rendezvous(etcd.endpoints())};
  auto value = [](const EtcdConfigEntry& e) { return absl::StrCat("v", e.version); };
  // No generation yet: nothing to change (AppendOrHoldConfig holds it).
  absl::StatusOr<EtcdConfigEntry> early = nodes[1]->AppendConfig(5, value);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(CodeOf(early.status()), v1::STATE) << early.status();
  EXPECT_THAT(early.status().message(), HasSubstr("no active generation"));

  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes)) ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<EtcdConfigEntry> first = nodes[1]->AppendConfig(10, value);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->generation, 1u);
  EXPECT_EQ(first->version, 1u);
  EXPECT_EQ(first->at_iteration, 10u);
  // Asked for an earlier switch: still after the previous version's.
  absl::StatusOr<EtcdConfigEntry> second = nodes[0]->AppendConfig(3, value);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->version, 2u);
  EXPECT_EQ(second->at_iteration, 11u);
  absl::StatusOr<std::optional<std::string>> stored = nodes[0]->Get("g1/config/2");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->value_or("none"), "v2");
  HeartbeatParams hb;
  hb.node_rank = 0;
  hb.generation = 1;
  absl::StatusOr<HeartbeatResult> r = nodes[0]->Heartbeat(hb);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config_version, 2u);
}

// Version `version` of `generation`'s config log, as every node reads it.
absl::StatusOr<JobConfigChange> ReadConfig(EtcdRendezvous& node, uint64_t generation,
                                           uint64_t version) {
  absl::StatusOr<std::optional<std::string>> stored = node.Get(ConfigKey(generation, version));
  if (!stored.ok()) return stored.status();
  return DecodeConfig(ConfigKey(generation, version), *stored);
}

TEST(EtcdRendezvousTest, AChangeMadeWhileNoGenerationRunsBecomesTheNextGenerationsVersionOne) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  auto node = [&] { return Rendezvous(etcd.endpoints(), kToken, absl::Seconds(10), 1); };
  std::vector<std::shared_ptr<EtcdRendezvous>> nodes = {node(), node()};
  // Before the job forms: held, the newer change replacing the older.
  absl::StatusOr<std::optional<EtcdConfigEntry>> older = nodes[1]->AppendOrHoldConfig(5, 50, 1);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_FALSE(older->has_value());
  absl::StatusOr<std::optional<EtcdConfigEntry>> newer = nodes[0]->AppendOrHoldConfig(5, 25, 2);
  ASSERT_TRUE(newer.ok()) << newer.status();
  EXPECT_FALSE(newer->has_value());
  for (const absl::StatusOr<JoinResult>& r : JoinAll(nodes)) ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<JobConfigChange> first = ReadConfig(*nodes[1], 1, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->generation, 1u);
  EXPECT_EQ(first->at_iteration, kHeldConfigAfter);
  EXPECT_EQ(first->bucket_cap_mb, 25);
  EXPECT_EQ(first->first_bucket_cap_mb, 2);
  HeartbeatParams hb;
  hb.node_rank = 1;
  hb.generation = 1;
  absl::StatusOr<HeartbeatResult> beat = nodes[1]->Heartbeat(hb);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->config_version, 1u);
  EtcdClientOptions raw;
  raw.endpoints = etcd.endpoints();
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect(raw);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::optional<EtcdKeyValue>> held = (*client)->Get("gs/job/job1/config_held");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_FALSE(held->has_value()) << "the held change stayed after generation 1 took it";

  // While generation 1 runs a change is appended, not held.
  absl::StatusOr<std::optional<EtcdConfigEntry>> running = nodes[1]->AppendOrHoldConfig(10, 30, 1);
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(running->has_value());
  EXPECT_EQ((*running)->generation, 1u);
  EXPECT_EQ((*running)->version, 2u);
  EXPECT_EQ((*running)->at_iteration, 10u);

  // Node 1 dies; node 0 (--min-nodes 1) re-forms alone from iteration 7,
  // and a change made meanwhile is generation 2's version 1 at 7 + 2.
  nodes[1].reset();
  HeartbeatParams report;
  report.node_rank = 0;
  report.generation = 1;
  report.node_error = absl::UnavailableError("a collective failed");
  ASSERT_TRUE(nodes[0]->Heartbeat(report).ok());
  ASSERT_TRUE(nodes[0]->Leave(0, 1, "re-forming").ok());
  absl::StatusOr<std::optional<EtcdConfigEntry>> reforming = nodes[0]->AppendOrHoldConfig(3, 8, 1);
  ASSERT_TRUE(reforming.ok()) << reforming.status();
  EXPECT_FALSE(reforming->has_value());
  nodes[0] = node();
  JoinParams resume = Node(0, 2);
  resume.resume_generation = 1;
  resume.resume_iteration = 7;
  absl::StatusOr<JoinResult> reformed = nodes[0]->Join(resume);
  ASSERT_TRUE(reformed.ok()) << reformed.status();
  EXPECT_EQ(reformed->generation, 2u);
  absl::StatusOr<JobConfigChange> second = ReadConfig(*nodes[0], 2, 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->generation, 2u);
  EXPECT_EQ(second->at_iteration, 7 + kHeldConfigAfter);
  EXPECT_EQ(second->bucket_cap_mb, 8);
}

TEST(EtcdRendezvousTest, UnreachableEtcdFailsTheJoinWithinItsTimeoutNamingEtcd) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  const std::vector<std::string> endpoints = etcd.endpoints();
  etcd.Kill(0);
  std::shared_ptr<EtcdRendezvous> node0 = Rendezvous(endpoints);
  const absl::Time start = absl::Now();
  absl::StatusOr<JoinResult> r = node0->Join(Node(0, 2, absl::Seconds(4)));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("etcd at ", endpoints[0])));
  // Bounded: the join's timeout plus one etcd call's, never a hang.
  EXPECT_LT(took, absl::Seconds(30));
}

}  // namespace
}  // namespace gradsync
