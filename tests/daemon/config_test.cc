// ValidateConfig: every contradiction among gradsyncd's flags is refused at
// start with INVALID_ARGUMENT and a message naming the flags and values.
#include "daemon/config.h"

#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// A valid follower (node 1 of 3) to break one flag at a time.
DaemonConfig Follower() {
  DaemonConfig c;
  c.num_nodes = 3;
  c.node_rank = 1;
  c.leader = "10.0.0.1:7000";
  c.listen = "";
  c.job_token = "t0ken";
  return c;
}

DaemonConfig Leader() {
  DaemonConfig c;
  c.num_nodes = 3;
  c.node_rank = 0;
  c.listen = "0.0.0.0:7000";
  c.job_token = "t0ken";
  return c;
}

// Expects INVALID_ARGUMENT with every piece of `parts` in the message.
void ExpectRefused(const DaemonConfig& c, std::initializer_list<std::string> parts) {
  const absl::Status st = ValidateConfig(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(st.message()), HasSubstr(part));
  }
}

TEST(ValidateConfig, DefaultsLeaderAndFollowerAreValid) {
  EXPECT_TRUE(ValidateConfig(DaemonConfig{}).ok()) << ValidateConfig(DaemonConfig{});
  EXPECT_TRUE(ValidateConfig(Leader()).ok()) << ValidateConfig(Leader());
  EXPECT_TRUE(ValidateConfig(Follower()).ok()) << ValidateConfig(Follower());
}

TEST(ValidateConfig, NonZeroRankWithoutLeaderIsRefused) {
  DaemonConfig c = Follower();
  c.leader.clear();
  c.listen = "0.0.0.0:7000";
  const absl::Status st = ValidateConfig(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "--node-rank 1 of --num-nodes 3 needs --leader HOST:PORT (only node 0 hosts the "
            "rendezvous)");
}

TEST(ValidateConfig, RankZeroWithLeaderIsRefused) {
  DaemonConfig c = Leader();
  c.leader = "10.0.0.1:7000";
  ExpectRefused(c, {"--node-rank 0", "--num-nodes 3", "--leader 10.0.0.1:7000"});
}

TEST(ValidateConfig, LeaderWithASingleNodeIsRefused) {
  DaemonConfig c;
  c.leader = "10.0.0.1:7000";
  ExpectRefused(c, {"--leader 10.0.0.1:7000", "--num-nodes"});
}

TEST(ValidateConfig, LeaderWithoutPortIsRefused) {
  DaemonConfig c = Follower();
  c.leader = "10.0.0.1";
  ExpectRefused(c, {"--leader 10.0.0.1", "HOST:PORT"});
}

// Node 1 of 3 meeting the others in etcd: no --leader, no node leads.
DaemonConfig OnEtcd() {
  DaemonConfig c = Follower();
  c.leader.clear();
  c.rendezvous = "etcd://10.0.0.5:2379,etcd-1.example:2379/gradsync";
  return c;
}

TEST(ValidateConfig, EveryNodeOfAnEtcdJobIsValidWithoutALeader) {
  DaemonConfig c = OnEtcd();
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  EXPECT_FALSE(c.is_leader());
  c.node_rank = 0;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  EXPECT_FALSE(c.is_leader());  // node 0 hosts nothing either
  c.min_nodes = 1;              // elastic: node 0 may die too
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(ValidateConfig, AMalformedRendezvousIsRefusedNamingIt) {
  DaemonConfig c = OnEtcd();
  c.rendezvous = "http://10.0.0.5:2379/gradsync";
  ExpectRefused(c, {"--rendezvous http://10.0.0.5:2379/gradsync", "etcd://"});
  c.rendezvous = "etcd://10.0.0.5:2379";
  ExpectRefused(c, {"--rendezvous etcd://10.0.0.5:2379", "names no PREFIX"});
  c.rendezvous = "etcd://10.0.0.5/gradsync";
  ExpectRefused(c, {"--rendezvous", "10.0.0.5"});
}

TEST(ValidateConfig, EtcdWithALeaderOrASingleNodeIsRefused) {
  DaemonConfig c = OnEtcd();
  c.leader = "10.0.0.1:7000";
  ExpectRefused(c, {"--rendezvous etcd://", "drop --leader 10.0.0.1:7000"});
  c = OnEtcd();
  c.num_nodes = 1;
  c.node_rank = 0;
  ExpectRefused(c, {"--rendezvous etcd://", "--num-nodes > 1"});
}

TEST(ValidateConfig, EtcdCredentialsComeInPairsAndOnlyWithEtcd) {
  DaemonConfig c = OnEtcd();
  c.etcd_cert = "/etc/etcd/client.crt";
  ExpectRefused(c, {"--etcd-cert and --etcd-key"});
  c = OnEtcd();
  c.etcd_user = "gradsync";
  ExpectRefused(c, {"--etcd-user and --etcd-password-file"});
  c = Follower();
  c.etcd_ca = "/etc/etcd/ca.crt";
  ExpectRefused(c, {"--etcd-ca", "need --rendezvous etcd://"});
}

// The generation's first member tunes on etcd as node 0 does on the leader.
TEST(ValidateConfig, AutotuneIsAcceptedOnEveryNodeOfAnEtcdRendezvous) {
  for (int rank : {0, 1, 2}) {
    DaemonConfig c = OnEtcd();
    c.node_rank = rank;
    c.autotune = true;
    EXPECT_TRUE(ValidateConfig(c).ok()) << "node " << rank << ": " << ValidateConfig(c);
  }
}

TEST(ValidateConfig, RankAtOrAboveNumNodesIsRefused) {
  for (int rank : {3, 7, -1}) {
    DaemonConfig c = Follower();
    c.node_rank = rank;
    ExpectRefused(c, {"--node-rank " + std::to_string(rank), "--num-nodes 3"});
  }
}

// An elastic job's node ranks stay below --max-nodes (= --num-nodes): a
// node started beyond it is refused naming both.
TEST(ValidateConfig, AnElasticJobsNodeRankAtOrAboveMaxNodesIsRefusedNamingMaxNodes) {
  DaemonConfig c = Follower();
  c.min_nodes = 2;
  c.max_nodes = 3;
  c.node_rank = 3;
  ExpectRefused(c, {"--node-rank 3 is not in [0, 3)", "--num-nodes 3", "--max-nodes 3"});
}

TEST(ValidateConfig, NumNodesOutOfRangeIsRefused) {
  for (int n : {0, -2, 4097}) {
    DaemonConfig c;
    c.num_nodes = n;
    ExpectRefused(c, {"--num-nodes " + std::to_string(n)});
  }
}

// A fixed job: unset (0) or equal to --num-nodes on every node.
TEST(ValidateConfig, MinAndMaxNodesDefaultToNumNodes) {
  DaemonConfig c = Follower();
  EXPECT_EQ(c.min_nodes_or_num(), 3);
  EXPECT_EQ(c.max_nodes_or_num(), 3);
  c.min_nodes = 3;
  c.max_nodes = 3;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  DaemonConfig one;
  one.min_nodes = 1;
  one.max_nodes = 1;
  EXPECT_TRUE(ValidateConfig(one).ok()) << ValidateConfig(one);
}

TEST(ValidateConfig, MinAndMaxNodesOutOfRangeAreRefused) {
  for (int n : {-1, 4}) {
    DaemonConfig c = Leader();
    c.min_nodes = n;
    ExpectRefused(c, {"--min-nodes " + std::to_string(n), "[1, 3]", "--num-nodes 3"});
  }
  for (int n : {-1, 2, 4097}) {
    DaemonConfig c = Leader();
    c.max_nodes = n;
    ExpectRefused(c, {"--max-nodes " + std::to_string(n), "[3, 4096]", "--num-nodes 3"});
  }
}

// Elastic jobs: --min-nodes below --num-nodes is accepted.
TEST(ValidateConfig, AMinNodesBelowNumNodesIsAccepted) {
  DaemonConfig c = Follower();
  c.min_nodes = 2;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.max_nodes = 3;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.min_nodes = 1;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

// Nodes join a running elastic job on the embedded leader and on etcd:
// --max-nodes above --num-nodes is accepted there (a node rank up to it
// too), refused for a fixed job, naming the flags.
TEST(ValidateConfig, AMaxNodesAboveNumNodesIsAcceptedForAnElasticJobOnEitherRendezvous) {
  DaemonConfig c = Follower();
  c.max_nodes = 5;
  ExpectRefused(c, {"--max-nodes 5 above --num-nodes 3", "--min-nodes below --num-nodes"});
  c.min_nodes = 2;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.node_rank = 4;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.node_rank = 5;
  ExpectRefused(c, {"--node-rank 5 is not in [0, 5)", "--max-nodes 5"});
  c.node_rank = 1;
  c.leader.clear();
  c.rendezvous = "etcd://127.0.0.1:2379/job";
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(ValidateConfig, AnElasticJobOnTheNcclBackendIsAccepted) {
  DaemonConfig c = Follower();
  c.min_nodes = 2;
  c.backend = "nccl";
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

TEST(ValidateConfig, MultiNodeLeaderWithoutListenIsRefused) {
  DaemonConfig c = Leader();
  c.listen.clear();
  ExpectRefused(c, {"--node-rank 0", "--num-nodes 3", "--listen"});
}

TEST(ValidateConfig, LocalSizeOutOfRangeIsRefused) {
  for (int n : {0, -1, 257}) {
    DaemonConfig c;
    c.local_size = n;
    ExpectRefused(c, {"--local-size " + std::to_string(n)});
  }
}

TEST(ValidateConfig, StragglerSettingsOutOfRangeAreRefusedNamingTheFlag) {
  for (int window : {0, -5, 100001}) {
    DaemonConfig c;
    c.straggler_window = window;
    ExpectRefused(c, {"--straggler-window " + std::to_string(window)});
  }
  for (double share : {-0.1, 1.0, 2.0}) {
    DaemonConfig c;
    c.straggler_share = share;
    ExpectRefused(c, {"--straggler-share"});
  }
  DaemonConfig late;
  late.straggler_late_ms = -1;
  ExpectRefused(late, {"--straggler-late-ms -1"});
  DaemonConfig edges;
  edges.straggler_window = 1;
  edges.straggler_share = 0;
  edges.straggler_late_ms = 0;
  EXPECT_TRUE(ValidateConfig(edges).ok()) << ValidateConfig(edges);
}

TEST(ValidateConfig, NonPositiveOrHugeTimeoutIsRefused) {
  for (int64_t ms : {int64_t{0}, int64_t{-1000}, int64_t{99}, int64_t{86400001}}) {
    DaemonConfig c;
    c.timeout_ms = ms;
    ExpectRefused(c, {"--timeout-s "});
  }
  DaemonConfig c;
  c.timeout_ms = -5000;
  ExpectRefused(c, {"--timeout-s -5 "});
}

TEST(ValidateConfig, BadBucketCapsAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double mb : {0.0, -1.0, 4097.0, nan}) {
    DaemonConfig c;
    c.bucket_cap_mb = mb;
    ExpectRefused(c, {"--bucket-cap-mb "});
    DaemonConfig f;
    f.first_bucket_cap_mb = mb;
    ExpectRefused(f, {"--first-bucket-cap-mb "});
  }
  DaemonConfig c;
  c.bucket_cap_mb = -1;
  ExpectRefused(c, {"--bucket-cap-mb -1 is not in (0, 4096]"});
}

TEST(ValidateConfig, LocalBackendWithSeveralNodesIsRefused) {
  DaemonConfig c = Follower();
  c.backend = "local";
  ExpectRefused(c, {"--backend local", "--num-nodes 1", "3"});
  c.backend = "mpi";
  ExpectRefused(c, {"--backend mpi"});
}

TEST(ValidateConfig, StallThresholdSocketAndShmPrefixAreChecked) {
  DaemonConfig c;
  c.stall_threshold_s = 0;
  ExpectRefused(c, {"--stall-threshold-s 0"});
  c = DaemonConfig{};
  c.socket_path = "";
  ExpectRefused(c, {"--socket"});
  c = DaemonConfig{};
  c.shm_prefix = "a/b";
  ExpectRefused(c, {"--shm-prefix 'a/b'"});
}

// A stranger who reaches the rendezvous could join the job, read
// its layouts and abort it; said at start, not at the first trainer.
TEST(ValidateConfig, SeveralNodesWithoutATokenAreRefusedUnlessInsecure) {
  for (DaemonConfig c : {Leader(), Follower()}) {
    c.job_token.clear();
    const absl::Status st = ValidateConfig(c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(),
              "--num-nodes 3 needs --job-token-file (mode 0600, the same on every node); "
              "--insecure runs the job without one");
    c.insecure = true;
    EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  }
}

TEST(ValidateConfig, ASingleNodeWithoutATokenListensOnLoopbackOnly) {
  DaemonConfig c;  // 127.0.0.1:7250
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.listen = "0.0.0.0:7250";
  ExpectRefused(
      c, {"--listen 0.0.0.0:7250 is reachable from other hosts", "--job-token-file", "--insecure"});
  c.listen = "10.1.2.3:7250";
  ExpectRefused(c, {"--listen 10.1.2.3:7250"});
  for (const char* fine : {"[::1]:7250", "localhost:7250", "127.0.0.2:7250", ""}) {
    c.listen = fine;
    EXPECT_TRUE(ValidateConfig(c).ok()) << fine << ": " << ValidateConfig(c);
  }
  c.listen = "0.0.0.0:7250";
  c.insecure = true;
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.insecure = false;
  c.job_token = "t0ken";
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.job_token.clear();
  c.tls_cert = "cert.pem";  // mutual TLS authenticates every caller
  c.tls_key = "key.pem";
  c.tls_ca = "ca.pem";
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.tls_ca.clear();  // server-only TLS proves nothing about the caller
  ExpectRefused(c, {"--listen 0.0.0.0:7250"});
}

TEST(ValidateConfig, TlsFlagsComeInWorkingCombinations) {
  DaemonConfig c;
  c.tls_cert = "cert.pem";
  ExpectRefused(c, {"--tls-cert cert.pem needs --tls-key"});
  c = DaemonConfig{};
  c.tls_key = "key.pem";
  ExpectRefused(c, {"--tls-key key.pem needs --tls-cert"});
  c = DaemonConfig{};
  c.tls_ca = "ca.pem";
  ExpectRefused(c, {"--tls-ca ca.pem needs --tls-cert and --tls-key"});
}

// /metrics has no token check: with --require-auth-for-reads, loopback only.
TEST(ValidateConfig, MetricsListenIsCheckedAndKeptLocalWhenReadsNeedAuth) {
  DaemonConfig c;
  c.metrics_listen = "127.0.0.1:http";
  ExpectRefused(c, {"--metrics-listen 127.0.0.1:http", "HOST:PORT"});
  c.metrics_listen = "0.0.0.0:9250";
  EXPECT_TRUE(ValidateConfig(c).ok());
  c.require_auth_for_reads = true;
  c.job_token = "secret";
  ExpectRefused(c, {"--metrics-listen 0.0.0.0:9250", "--require-auth-for-reads"});
  c.metrics_listen = "127.0.0.1:9250";
  EXPECT_TRUE(ValidateConfig(c).ok());
}

// --check-replicas-every: 0 (off) by default; negative is refused naming
// the flag; across nodes it works, except with --uneven-inputs (a node
// whose trainers all joined would never compare), refused at start.
TEST(ValidateConfig, CheckReplicasEveryIsNotNegativeNorUnevenAcrossNodes) {
  EXPECT_EQ(DaemonConfig{}.check_replicas_every, 0);
  DaemonConfig one;
  one.check_replicas_every = 5;
  EXPECT_TRUE(ValidateConfig(one).ok()) << ValidateConfig(one);
  one.uneven_inputs = true;
  EXPECT_TRUE(ValidateConfig(one).ok()) << ValidateConfig(one);
  one.check_replicas_every = -1;
  ExpectRefused(one, {"--check-replicas-every -1", ">= 0"});
  DaemonConfig leader = Leader();
  leader.check_replicas_every = 5;
  EXPECT_TRUE(ValidateConfig(leader).ok()) << ValidateConfig(leader);
  leader.uneven_inputs = true;
  ExpectRefused(leader,
                {"--check-replicas-every 5", "--uneven-inputs", "one node only", "--num-nodes 3"});
  DaemonConfig follower = Follower();
  follower.check_replicas_every = 5;
  EXPECT_TRUE(ValidateConfig(follower).ok()) << ValidateConfig(follower);
  follower.uneven_inputs = true;
  ExpectRefused(follower, {"--check-replicas-every 5", "--uneven-inputs", "one node only"});
}

}  // namespace
}  // namespace gradsync
