// The culprit's error wins on every node even when the rendezvous' abort
// reaches a node before that node looks at its own failed collective.
// Rank 3 (node 1, local 1) writes a NaN into fc1.weight[5] at step 2
// (tests/testing/fault_trainer --poison) under --nonfinite=error; node 0
// runs with GRADSYNC_TEST_DELAY_COLLECTIVE_CHECK_MS, so it explains its own
// non-finite result only four heartbeats later, long after the abort that
// node 1's report caused reached it. Every trainer on every node must exit
// INVALID_ARGUMENT naming the culprit (rank, pid, node, tensor, element,
// value), node 0's through the report the abort carries ("the leader
// reports: node_rank=1 (host=...) reported INVALID_ARGUMENT: ..."), never
// PEER_FAILED. On the embedded leader and on etcd, fixed and elastic.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);
constexpr int kPoisonStep = 2;
constexpr int kCulpritRank = 3;  // node 1, local rank 1
constexpr char kDelayHook[] = "GRADSYNC_TEST_DELAY_COLLECTIVE_CHECK_MS";

#define SKIP_WITHOUT_ETCD()                         \
  do {                                              \
    const std::string reason = EtcdMissingReason(); \
    if (!reason.empty()) GTEST_SKIP() << reason;    \
  } while (0)

// 2 nodes x 2 trainers (3 x 2 when elastic, --min-nodes 2); node 0 looks at
// its failed collective 2 s (four heartbeats) late.
ClusterOptions DelayedNodeZero(const std::string& rendezvous, bool elastic) {
  ClusterOptions options;
  options.nodes = elastic ? 3 : 2;
  options.local_size = 2;
  options.job_id = "culprit-abort";
  options.flags = {"--timeout-s=30", "--nonfinite=error"};
  if (elastic) options.flags.push_back("--min-nodes=2");
  options.node_env = {{{kDelayHook, "2000"}}};
  options.rendezvous = rendezvous;
  return options;
}

// The culprit's node names itself by its host name (gethostname).
std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// Every trainer exits INVALID_ARGUMENT naming the culprit; those of other
// nodes than node 1 name it through `source`'s report of node 1's error.
void ExpectCulpritEverywhere(const std::string& rendezvous, const std::string& source,
                             bool elastic) {
  const ClusterOptions options = DelayedNodeZero(rendezvous, elastic);
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<std::string> outs;
  std::vector<Process> trainers =
      cluster.StartTrainers({"--steps=5", "--batch=60", "--fp64",
                             absl::StrCat("--poison=", kCulpritRank, ":", kPoisonStep, ":nan")},
                            &outs);
  ASSERT_EQ(trainers.size(), static_cast<size_t>(options.nodes * 2));
  const std::string culprit =
      absl::StrCat("iteration ", kPoisonStep, ": non-finite gradient from rank ", kCulpritRank,
                   " (local 1, pid ", trainers[kCulpritRank].pid(), ") on node 1 (host ",
                   HostName(), ")", ": tensor 0 'fc1.weight' element 5 = nan");
  const std::string relayed = absl::StrCat(
      source, " reports: node_rank=1 (host=127.0.0.1) reported INVALID_ARGUMENT: ", culprit);
  for (size_t t = 0; t < trainers.size(); ++t) {
    const ExitStatus st = trainers[t].Wait(kBound);
    const std::string log = trainers[t].Log();
    EXPECT_EQ(st.code, kExitInvalidArgument) << "trainer " << t << "\n"
                                             << log << cluster.DaemonLogs();
    EXPECT_NE(log.find(t / 2 == 1 ? culprit : relayed), std::string::npos)
        << "trainer " << t << " should name: " << (t / 2 == 1 ? culprit : relayed) << "\n"
        << log;
  }
  // The abort came first on node 0: its job failed from the heartbeat's
  // news, while its own look at the collective was held back. (An elastic
  // job's abort asks the scheduler to re-form, which waits for that look.)
  if (elastic) return;
  const std::string node0 = cluster.node(0).process().Log();
  EXPECT_NE(node0.find(absl::StrCat("event=test_hook_armed hook=", kDelayHook, " delay_ms=2000")),
            std::string::npos)
      << node0;
  EXPECT_NE(node0.find(absl::StrCat("code=INVALID_ARGUMENT culprit_local_rank=-1 message=\"the "
                                    "job was aborted by ",
                                    source, "; ", relayed)),
            std::string::npos)
      << node0;
}

TEST(CulpritAbortFirst, EveryTrainerGetsTheCulpritsErrorOnTheLeader) {
  ExpectCulpritEverywhere("", "the leader", /*elastic=*/false);
}

TEST(CulpritAbortFirst, EveryTrainerGetsTheCulpritsErrorOnEtcd) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  ExpectCulpritEverywhere(absl::StrCat("etcd://", etcd.endpoints()[0], "/culprit-abort"), "etcd",
                          /*elastic=*/false);
}

// Elastic: the culprit's error is no death, so nothing re-forms; the job
// fails on every node with it.
TEST(CulpritAbortFirst, AnElasticJobFailsWithTheCulpritsErrorOnTheLeader) {
  ExpectCulpritEverywhere("", "the leader", /*elastic=*/true);
}

TEST(CulpritAbortFirst, AnElasticJobFailsWithTheCulpritsErrorOnEtcd) {
  SKIP_WITHOUT_ETCD();
  EtcdCluster etcd(1);
  ASSERT_TRUE(etcd.Start().ok()) << etcd.Logs();
  ExpectCulpritEverywhere(absl::StrCat("etcd://", etcd.endpoints()[0], "/culprit-abort"), "etcd",
                          /*elastic=*/true);
}

}  // namespace
}  // namespace gradsync::testing
