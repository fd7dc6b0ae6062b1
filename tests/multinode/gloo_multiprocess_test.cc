// Multi-process tests of the cross-node path: this process hosts the leader
// (RendezvousService on 127.0.0.1), every node is a separate multinode_node
// process with its own RendezvousClient, GlooStore and GlooBackend, talking
// over loopback TCP. Nothing here asserts timings: every wait has a generous
// deadline, past which the children are killed and the test fails.
#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/multinode/exit_codes.h"
#include "tests/multinode/test_leader.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "mp-job";
constexpr char kToken[] = "mp-secret-token";
constexpr auto kChildDeadline = std::chrono::seconds(90);

class GlooMultiprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty()) << "mkdtemp failed";
    helper_ = Runfile("tests/multinode/multinode_node");
  }

  // A leader whose heartbeat timeout never fires during a test: aborts come
  // from reported errors only.
  std::unique_ptr<TestLeader> StartLeader(int num_nodes) {
    auto leader =
        std::make_unique<TestLeader>(kJob, kToken, num_nodes, absl::Seconds(30), absl::Minutes(10));
    EXPECT_FALSE(leader->address().empty()) << "leader did not start";
    return leader;
  }

  std::unique_ptr<Process> StartNode(const TestLeader& leader, int rank, int num_nodes,
                                     const std::string& scenario,
                                     std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {helper_,
                                     "--leader=" + leader.address(),
                                     "--job_id=" + std::string(kJob),
                                     "--job_token=" + std::string(kToken),
                                     absl::StrCat("--node_rank=", rank),
                                     absl::StrCat("--num_nodes=", num_nodes),
                                     absl::StrCat("--local_size=", rank + 1),
                                     "--scenario=" + scenario};
    args.insert(args.end(), extra.begin(), extra.end());
    auto child = std::make_unique<Process>(
        Process::Spawn(args, dir_.File(absl::StrCat("node", rank, "-", next_log_++, ".log"))));
    EXPECT_TRUE(child->started()) << "could not start " << helper_;
    return child;
  }

  static std::vector<Process*> Ptrs(const std::vector<std::unique_ptr<Process>>& children) {
    std::vector<Process*> out;
    for (const auto& c : children) out.push_back(c.get());
    return out;
  }

  static std::string Logs(const std::vector<Process*>& children) {
    std::string out;
    for (const Process* c : children) {
      const std::optional<ExitStatus> status = c->exit_status();
      absl::StrAppend(&out, "---- ", c->log_path(), " (", status ? status->ToString() : "running",
                      ")\n", c->Log());
    }
    return out;
  }

  // Waits for all children and expects each to exit with `code`.
  void ExpectAllExit(const std::vector<Process*>& children, ExitCode code) {
    ASSERT_TRUE(WaitAll(children, kChildDeadline)) << "children did not finish (killed)\n"
                                                   << Logs(children);
    for (Process* c : children) {
      const ExitStatus status = c->Wait(kChildDeadline);  // reaped: returns at once
      EXPECT_TRUE(status.exited && status.code == static_cast<int>(code))
          << status.ToString() << "\n"
          << Logs(children);
    }
  }

  // Three nodes in back-to-back allreduces of `loop_elements` float32; one
  // is killed: the other two fail (not hang) and it died of the signal.
  void ExpectKilledNodeFailsItsPeers(int64_t loop_elements);

  ScratchDir dir_{"gsmn"};
  std::string helper_;
  int next_log_ = 0;
};

TEST_F(GlooMultiprocessTest, TwoNodesAllreduceExactSums) {
  auto leader = StartLeader(2);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int r = 0; r < 2; ++r) nodes.push_back(StartNode(*leader, r, 2, "allreduce"));
  ExpectAllExit(Ptrs(nodes), ExitCode::kOk);
  const RendezvousStatus status = leader->service().GetStatus();
  EXPECT_EQ(status.generation, 1u);
  EXPECT_EQ(status.world_size, 1 + 2);
}

TEST_F(GlooMultiprocessTest, ThreeNodesAllreduceExactSums) {
  auto leader = StartLeader(3);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int r = 0; r < 3; ++r) nodes.push_back(StartNode(*leader, r, 3, "allreduce"));
  ExpectAllExit(Ptrs(nodes), ExitCode::kOk);
  EXPECT_EQ(leader->service().GetStatus().world_size, 1 + 2 + 3);
}

// Every pair of a six-node mesh connects at once (each node's pairs from
// threads of their own) and carries data: each node broadcasts to all.
TEST_F(GlooMultiprocessTest, SixNodesConnectEveryPairAndSumAndBroadcastExactly) {
  auto leader = StartLeader(6);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int r = 0; r < 6; ++r) nodes.push_back(StartNode(*leader, r, 6, "mesh"));
  ExpectAllExit(Ptrs(nodes), ExitCode::kOk);
  for (const auto& node : nodes) {
    EXPECT_THAT(node->Log(), HasSubstr("verified a broadcast from each of 6 nodes")) << node->Log();
  }
}

TEST_F(GlooMultiprocessTest, JoinTimesOutWhenANodeNeverComes) {
  auto leader = StartLeader(3);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int r = 0; r < 2; ++r) {
    nodes.push_back(StartNode(*leader, r, 3, "allreduce", {"--join_timeout_ms=1500"}));
  }
  ExpectAllExit(Ptrs(nodes), ExitCode::kJoinFailed);
  for (const auto& node : nodes) {
    EXPECT_THAT(node->Log(), HasSubstr("DEADLINE_EXCEEDED"));
    EXPECT_THAT(node->Log(),
                ::testing::ContainsRegex(
                    "missing node ranks: (node_rank=[01] \\([^,]*\\), )?node_rank=2 \\("));
  }
  EXPECT_EQ(leader->service().GetStatus().generation, 0u);
  EXPECT_TRUE(leader->service().GetStatus().pending_node_ranks.empty());
}

TEST_F(GlooMultiprocessTest, RefusedNodesExitWithClearErrors) {
  auto leader = StartLeader(2);
  std::vector<std::unique_ptr<Process>> nodes;
  nodes.push_back(StartNode(*leader, 0, 2, "allreduce", {"--job_token=wrong-token"}));
  nodes.push_back(StartNode(*leader, 1, 3, "allreduce"));  // disagrees on num_nodes
  nodes.push_back(StartNode(*leader, 7, 2, "allreduce"));  // rank out of range
  ExpectAllExit(Ptrs(nodes), ExitCode::kJoinFailed);
  EXPECT_THAT(nodes[0]->Log(), HasSubstr("Rendezvous.Join refused: the job token does not match"));
  EXPECT_THAT(nodes[1]->Log(), HasSubstr("num_nodes=3"));
  EXPECT_THAT(nodes[1]->Log(), HasSubstr("num_nodes=2"));
  EXPECT_THAT(nodes[2]->Log(), HasSubstr("node_rank=7 is out of range"));
  EXPECT_EQ(leader->service().GetStatus().generation, 0u);
}

TEST_F(GlooMultiprocessTest, KilledNodeFailsPeersInsteadOfHanging) {
  ExpectKilledNodeFailsItsPeers(512 * 1024);  // 2 MB: Gloo's ring allreduce
}

TEST_F(GlooMultiprocessTest, KilledNodeFailsPeersOfASmallBufferGatherInsteadOfHanging) {
  ExpectKilledNodeFailsItsPeers(1024);  // 4 KB: gathered, then added (gather_sum.h)
}

void GlooMultiprocessTest::ExpectKilledNodeFailsItsPeers(int64_t loop_elements) {
  auto leader = StartLeader(3);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int r = 0; r < 3; ++r) {
    nodes.push_back(StartNode(*leader, r, 3, "until_failure",
                              {"--ready_file=" + dir_.File(absl::StrCat("ready", r)),
                               absl::StrCat("--loop_elements=", loop_elements)}));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(WaitForFile(dir_.File(absl::StrCat("ready", r)), kChildDeadline))
        << Logs(Ptrs(nodes));
  }
  // Each ready file is written after the node's first allreduce of the
  // loop: every node is now in its back-to-back allreduces, so the
  // kill lands inside one (or between two: the next then fails the same).
  nodes[2]->Signal(SIGKILL);
  ExpectAllExit({nodes[0].get(), nodes[1].get()}, ExitCode::kFailedAsExpected);
  ASSERT_TRUE(WaitAll({nodes[2].get()}, kChildDeadline));
  const ExitStatus killed = nodes[2]->Wait(kChildDeadline);
  EXPECT_TRUE(!killed.exited && killed.code == SIGKILL) << killed.ToString();
}

TEST_F(GlooMultiprocessTest, SurvivorsAndARestartedNodeFormTheNextGeneration) {
  auto leader = StartLeader(3);
  std::vector<std::unique_ptr<Process>> nodes;
  for (int r = 0; r < 3; ++r) {
    nodes.push_back(StartNode(*leader, r, 3, "until_failure",
                              {"--rejoin", "--expect_generation=1",
                               "--ready_file=" + dir_.File(absl::StrCat("ready", r))}));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(WaitForFile(dir_.File(absl::StrCat("ready", r)), kChildDeadline))
        << Logs(Ptrs(nodes));
  }
  nodes[2]->Signal(SIGKILL);  // in the allreduce loop, as above
  ASSERT_TRUE(WaitAll({nodes[2].get()}, kChildDeadline));
  // The replacement joins (retrying while generation 1 is still active)
  // together with the survivors, who report the failure and re-join.
  auto replacement = StartNode(*leader, 2, 3, "allreduce", {"--expect_generation=2"});
  ExpectAllExit({nodes[0].get(), nodes[1].get(), replacement.get()}, ExitCode::kOk);
  const RendezvousStatus status = leader->service().GetStatus();
  EXPECT_EQ(status.generation, 2u);
  EXPECT_FALSE(status.aborted);
  EXPECT_THAT(nodes[0]->Log(), HasSubstr("ok generation=2"));
}

TEST_F(GlooMultiprocessTest, AbortEndsAnInFlightAllreduce) {
  auto leader = StartLeader(2);
  const std::string done = dir_.File("aborted");
  // A 10-minute Gloo timeout: only Abort can end node 0's allreduce in time.
  std::vector<std::unique_ptr<Process>> nodes;
  nodes.push_back(
      StartNode(*leader, 0, 2, "abort_self", {"--timeout_ms=600000", "--ready_file=" + done}));
  nodes.push_back(StartNode(*leader, 1, 2, "wait_then_allreduce",
                            {"--timeout_ms=600000", "--go_file=" + done}));
  ExpectAllExit(Ptrs(nodes), ExitCode::kOk);
  EXPECT_THAT(nodes[0]->Log(), HasSubstr("test abort from the node itself"));
}

}  // namespace
}  // namespace gradsync::testing
