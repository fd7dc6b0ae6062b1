// ConfigLogFollower against a real leader's config log over gRPC: every
// version reaches the job's listener exactly once, in order, including the
// versions read before the job listened.
#include "daemon/cluster/config_log_follower.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/status_code.h"
#include "daemon/cluster/rendezvous_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "daemon/cluster/rendezvous_service.h"
#include "tests/multinode/test_leader.h"

namespace gradsync::testing {
namespace {

constexpr char kJob[] = "job";
constexpr char kToken[] = "token";

struct Delivered {
  uint64_t version;
  uint64_t at_iteration;
  uint64_t cap_bytes;
};

class ConfigLogFollowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    leader_ = std::make_unique<TestLeader>(kJob, kToken, /*num_nodes=*/1, absl::Seconds(20),
                                           absl::Minutes(10));
    RendezvousClientOptions options;
    options.leader = leader_->address();
    options.job_id = kJob;
    options.job_token = kToken;
    options.rpc_timeout = absl::Seconds(5);
    client_ = RendezvousClient::Connect(options);
    JoinParams join;
    join.host = "127.0.0.1";
    join.timeout = absl::Seconds(20);
    absl::StatusOr<JoinResult> joined = client_->Join(join);
    ASSERT_TRUE(joined.ok()) << joined.status();
    generation_ = joined->generation;
  }

  // Appends a version switching at `at` with a bucket cap of `cap_mb`.
  uint64_t Append(uint64_t at, double cap_mb) {
    auto entry = leader_->service().AppendConfig(at, [&](const RendezvousService::ConfigEntry& e) {
      return std::make_pair(ConfigKey(e.generation, e.version),
                            EncodeConfig(e.generation, e.at_iteration, cap_mb, cap_mb / 4));
    });
    EXPECT_TRUE(entry.ok()) << entry.status();
    return entry.ok() ? entry->version : 0;
  }

  ConfigLogFollower Follower() {
    return ConfigLogFollower(generation_, /*node_rank=*/1,
                             [this](const std::string& key) { return client_->Get(key); });
  }

  std::unique_ptr<TestLeader> leader_;
  std::unique_ptr<RendezvousClient> client_;
  uint64_t generation_ = 0;
};

// The log grew while the node formed the world, and its first heartbeat
// came back before its job listened: those versions still reach the job,
// first and in order, then the later ones.
TEST_F(ConfigLogFollowerTest, VersionsReadBeforeTheJobListensReachItInOrder) {
  Append(2, 25);
  Append(3, 1);
  const uint64_t newest = Append(4, 25);
  ConfigLogFollower follower = Follower();
  ASSERT_TRUE(follower.CatchUp(newest).ok());

  std::vector<Delivered> got;
  follower.SetListener([&](const BucketCaps& caps, uint64_t at, uint64_t version, bool) {
    got.push_back({version, at, caps.cap_bytes});
  });
  const uint64_t later = Append(5, 1);
  ASSERT_TRUE(follower.CatchUp(later).ok());
  ASSERT_TRUE(follower.CatchUp(later).ok());  // nothing new: nothing again

  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].version, i + 1);
    EXPECT_EQ(got[i].at_iteration, i + 2);
  }
  EXPECT_EQ(got[0].cap_bytes, 25u << 20);
  EXPECT_EQ(got[1].cap_bytes, 1u << 20);
}

// A version the leader's log no longer holds cannot be followed: STATE
// naming the version and how far this node got, never a silent gap.
TEST_F(ConfigLogFollowerTest, AVersionGoneFromTheLogFailsWithStateNamingIt) {
  uint64_t newest = 0;
  for (size_t i = 0; i < kConfigLogKeep + 1; ++i) newest = Append(0, 25);
  ConfigLogFollower follower = Follower();
  const absl::Status st = follower.CatchUp(newest);
  EXPECT_EQ(CodeOf(st), v1::STATE) << st;
  EXPECT_NE(st.message().find("config version 1 of generation"), std::string::npos) << st;
  EXPECT_NE(st.message().find("node_rank=1 applied up to version 0"), std::string::npos) << st;
}

}  // namespace
}  // namespace gradsync::testing
