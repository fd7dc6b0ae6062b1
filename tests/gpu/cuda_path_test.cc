// The GPU data path on a real GPU: the release gradsyncd (CUDA + NCCL) and
// cuda_trainer processes through the exported C ABI — 1, 2 and 4 trainers
// sharing one GPU (the device-side local sum, then one NCCL rank), the
// flat-buffer and user-pointer modes, fp32 and bf16; a trainer SIGKILLed
// mid-iteration, reported to its peers by name; an Inf from one trainer,
// named to every trainer (the local-sum kernel's non-finite check). Then two gradsyncd
// "nodes" on the one GPU: NCCL tells hosts apart by NCCL_HOSTID, so two
// daemons with distinct values (over NCCL_SOCKET_IFNAME=lo) are two ranks
// with real kernels on both — the cross-node path, a node that stops
// answering, and a node that skips a collective. Skips (saying why) where no
// GPU is visible; on simulated devices the same path is gpu_path_test.
// Daemon timeouts are short: scripts/gpu-check.sh runs all of this in a
// few minutes of borrowed GPU time. Last, an elastic job of three such
// nodes: one SIGKILLed while the others wait inside a collective for it;
// the survivors abort their communicators, create new ones and redo the
// step; a trainer's death taking its node out; a node joining the running
// job of two, catching up by gs_broadcast of device memory; and a restarted
// trainer taking back its local rank and catching up the same way.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/gpu/gpu_presence.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

std::vector<Process> StartTrainers(const Daemon& daemon, int trainers,
                                   const std::vector<std::string>& flags) {
  std::vector<Process> ps;
  for (int r = 0; r < trainers; ++r) {
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", std::to_string(r)}};
    std::vector<std::string> argv = {Runfile("tests/gpu/cuda_trainer"),
                                     "--socket=" + daemon.socket()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ps.push_back(Process::Spawn(argv, absl::StrCat(daemon.dir(), "/trainer", r, ".log"), options));
  }
  return ps;
}

const std::vector<std::string> kGpuDaemonArgs = {"--backend=nccl", "--bucket-cap-mb=0.5",
                                                 "--first-bucket-cap-mb=0.1"};

Daemon GpuDaemon(int trainers) {
  std::vector<std::string> args = kGpuDaemonArgs;
  args.push_back("--timeout-s=20");
  return Daemon(trainers, args);
}

// (trainers sharing the GPU, "flat" | "user", "fp32" | "bf16")
class CudaPathTest : public ::testing::TestWithParam<std::tuple<int, std::string, std::string>> {};

TEST_P(CudaPathTest, EveryTrainerHoldsTheAverageAfterEveryStep) {
  GS_SKIP_UNLESS_GPU();
  const auto& [trainers, mode, dtype] = GetParam();
  Daemon daemon = GpuDaemon(trainers);
  ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
  std::vector<Process> ps = StartTrainers(daemon, trainers, {"--mode=" + mode, "--dtype=" + dtype});
  for (int r = 0; r < trainers; ++r) {
    ExitStatus st = ps[r].Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << "trainer " << r << "\n"
                                           << ps[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
    EXPECT_NE(ps[r].Log().find(absl::StrCat("world ", trainers)), std::string::npos) << ps[r].Log();
  }
  EXPECT_NE(daemon.process().Log().find("backend=gpu-cuda"), std::string::npos)
      << daemon.process().Log();
}

INSTANTIATE_TEST_SUITE_P(SharingOneGpu, CudaPathTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values("flat", "user"),
                                            ::testing::Values("fp32", "bf16")),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "Trainers_",
                                               std::get<1>(info.param), "_",
                                               std::get<2>(info.param));
                         });

// Readiness events are pooled (256 per trainer): 4 trainers x 5,000 tensors
// train exactly and the daemon opens 1,024 IPC events, not 20,000; and a
// pooled event re-recorded on a second stream (600 tensors, switched after
// 300 marks) still orders the daemon after the first stream's writes.
TEST(CudaPathPoolTest, FiveThousandTensorsFourTrainersShareAPoolOfEvents) {
  GS_SKIP_UNLESS_GPU();
  Daemon daemon = GpuDaemon(4);
  ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
  std::vector<Process> ps = StartTrainers(daemon, 4, {"--tensors=5000", "--steps=3"});
  for (int r = 0; r < 4; ++r) {
    ExitStatus st = ps[r].Wait(seconds(90));
    EXPECT_TRUE(st.exited && st.code == 0) << "trainer " << r << "\n"
                                           << ps[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
  }
  EXPECT_NE(daemon.process().Log().find("tensors=5000 events_opened=1024"), std::string::npos)
      << daemon.process().Log();
}

TEST(CudaPathPoolTest, EventReRecordedOnASecondStreamWaitsForTheFirst) {
  GS_SKIP_UNLESS_GPU();
  for (const std::string mode : {"flat", "user"}) {
    Daemon daemon = GpuDaemon(2);
    ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
    std::vector<Process> ps = StartTrainers(
        daemon, 2, {"--mode=" + mode, "--tensors=600", "--switch-stream-at=300", "--steps=3"});
    for (int r = 0; r < 2; ++r) {
      ExitStatus st = ps[r].Wait(seconds(60));
      EXPECT_TRUE(st.exited && st.code == 0) << mode << " trainer " << r << "\n"
                                             << ps[r].Log() << "\ndaemon:\n"
                                             << daemon.process().Log();
    }
  }
}

// The local-sum kernel's non-finite check on the real GPU: rank 1's +Inf
// at the last element of fc1.weight (summed in place into rank 0's memory,
// sharing the GPU) fails both trainers' gs_wait with INVALID_ARGUMENT
// naming rank 1, the tensor, the element and the value (--nonfinite=error,
// the default).
TEST(CudaPathFaultTest, InfFromOneTrainerFailsEveryTrainerNamingIt) {
  GS_SKIP_UNLESS_GPU();
  Daemon daemon = GpuDaemon(2);
  ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
  std::vector<Process> ps =
      StartTrainers(daemon, 2, {"--steps=3", "--dtype=bf16", "--inf-at=1:1:1:262143"});
  for (int r = 0; r < 2; ++r) {
    ExitStatus st = ps[r].Wait(seconds(60));
    const std::string log = ps[r].Log();
    ASSERT_TRUE(st.exited && st.code == 2) << log << "\ndaemon:\n" << daemon.process().Log();
    EXPECT_NE(log.find("error code=1:"), std::string::npos) << log;  // INVALID_ARGUMENT
    EXPECT_NE(log.find(absl::StrCat("non-finite gradient from rank 1 (local 1, pid ", ps[1].pid(),
                                    ") on node 0 (host ")),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("tensor 1 'fc1.weight' element 262143 = inf"), std::string::npos) << log;
  }
}

TEST(CudaPathFaultTest, TrainerKilledMidIterationIsReportedToItsPeerByName) {
  GS_SKIP_UNLESS_GPU();
  Daemon daemon = GpuDaemon(2);
  ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
  std::vector<Process> ps;
  {
    std::vector<Process> survivor = StartTrainers(daemon, 1, {"--steps=5"});
    ps.push_back(std::move(survivor[0]));
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", "1"}};
    ps.push_back(Process::Spawn({Runfile("tests/gpu/cuda_trainer"), "--socket=" + daemon.socket(),
                                 "--steps=5", "--die-at-step=2"},
                                absl::StrCat(daemon.dir(), "/trainer1.log"), options));
  }
  ExitStatus dead = ps[1].Wait(seconds(120));
  EXPECT_TRUE(!dead.exited && !dead.timed_out && dead.code == SIGKILL) << dead.ToString() << "\n"
                                                                       << ps[1].Log();
  ExitStatus st = ps[0].Wait(seconds(120));
  ASSERT_TRUE(st.exited) << ps[0].Log();
  EXPECT_EQ(st.code, 2) << ps[0].Log();                                           // a call failed
  EXPECT_NE(ps[0].Log().find("error code=4"), std::string::npos) << ps[0].Log();  // PEER_FAILED
  EXPECT_NE(ps[0].Log().find("rank 1 (local 1"), std::string::npos) << ps[0].Log();
  // The daemon keeps serving: a fresh job on the same GPU trains.
  std::vector<Process> next = StartTrainers(daemon, 2, {"--steps=2"});
  for (int r = 0; r < 2; ++r) {
    ExitStatus s = next[r].Wait(seconds(120));
    EXPECT_TRUE(s.exited && s.code == 0) << next[r].Log() << "\ndaemon:\n"
                                         << daemon.process().Log();
  }
}

// ---- Two nodes on the one GPU ---------------------------------------------

// Node n's daemon environment: its own NCCL host identity, loopback only.
std::map<std::string, std::string> NodeEnv(int n) {
  return {{"NCCL_HOSTID", absl::StrCat("gradsync-check-node", n)}, {"NCCL_SOCKET_IFNAME", "lo"}};
}

class TwoNodes {
 public:
  // Fatal failures end the calling test.
  void Start(const std::string& job, double timeout_s) {
    ASSERT_TRUE(WriteTokenFile(secrets_.File("token"), "cuda-path-token"));
    common_ = kGpuDaemonArgs;
    common_.insert(common_.end(),
                   {absl::StrCat("--timeout-s=", timeout_s),
                    absl::StrCat("--stall-threshold-s=", timeout_s / 3), "--num-nodes=2",
                    "--job-id=" + job, "--job-token-file=" + secrets_.File("token")});
    std::vector<std::string> lead = common_;
    lead.push_back("--node-rank=0");
    nodes_[0] = std::make_unique<Daemon>(2, lead, NodeEnv(0));
    ASSERT_TRUE(nodes_[0]->WaitReady(seconds(30))) << nodes_[0]->process().Log();
    port_ = nodes_[0]->ListenPort(seconds(10));
    ASSERT_GT(port_, 0) << nodes_[0]->process().Log();
    ASSERT_NO_FATAL_FAILURE(StartFollower());
  }
  // (Re)starts node 1, replacing the daemon there.
  void StartFollower() {
    nodes_[1].reset();
    std::vector<std::string> follow = common_;
    follow.insert(follow.end(), {"--node-rank=1", absl::StrCat("--leader=127.0.0.1:", port_)});
    nodes_[1] = std::make_unique<Daemon>(2, follow, NodeEnv(1));
    ASSERT_TRUE(nodes_[1]->WaitReady(seconds(30))) << nodes_[1]->process().Log();
  }
  Daemon& node(int n) { return *nodes_[n]; }
  std::string Logs() const {
    return absl::StrCat("\nnode 0 daemon:\n", nodes_[0]->process().Log(), "\nnode 1 daemon:\n",
                        nodes_[1] ? nodes_[1]->process().Log() : "(none)");
  }

 private:
  ScratchDir secrets_;  // read at start only
  std::vector<std::string> common_;
  int port_ = 0;
  std::unique_ptr<Daemon> nodes_[2];
};

// (flat | user, fp32 | bf16): 2 nodes x 2 trainers, every step the average
// over all 4 trainers to the dtype's tolerance.
class CudaTwoNodesTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(CudaTwoNodesTest, EveryTrainerHoldsTheAverageOverBothNodes) {
  GS_SKIP_UNLESS_GPU();
  const auto& [mode, dtype] = GetParam();
  TwoNodes nodes;
  ASSERT_NO_FATAL_FAILURE(nodes.Start("two-" + mode + "-" + dtype, 20));
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    for (Process& p : StartTrainers(nodes.node(n), 2, {"--mode=" + mode, "--dtype=" + dtype})) {
      ps.push_back(std::move(p));
    }
  }
  for (Process& p : ps) {
    ExitStatus st = p.Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << p.Log() << nodes.Logs();
    EXPECT_NE(p.Log().find("world 4"), std::string::npos) << p.Log();
  }
  EXPECT_NE(nodes.node(1).process().Log().find("first_rank=1 nranks=2"), std::string::npos)
      << nodes.Logs();
}

INSTANTIATE_TEST_SUITE_P(OneGpu, CudaTwoNodesTest,
                         ::testing::Combine(::testing::Values("flat", "user"),
                                            ::testing::Values("fp32", "bf16")),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param), "_",
                                               std::get<1>(info.param));
                         });

// gs_broadcast of device buffers on a real GPU, through the C ABI: 64 MiB
// + 3 bytes (17 pieces) from rank 1 to 2 trainers sharing the GPU (one
// device staging), then from rank 3 across two nodes (ncclBroadcast over
// 2 real NCCL ranks); every byte the root's, every step still averaged.
TEST(CudaBroadcastTest, DeviceBuffersReachEveryTrainerOnOneGpuAndAcrossTwoNodes) {
  GS_SKIP_UNLESS_GPU();
  const std::string bytes = "--broadcast-bytes=67108867";
  {
    Daemon daemon = GpuDaemon(2);
    ASSERT_TRUE(daemon.WaitReady(seconds(30))) << daemon.process().Log();
    std::vector<Process> ps = StartTrainers(daemon, 2, {"--broadcast-root=1", bytes, "--steps=2"});
    for (int r = 0; r < 2; ++r) {
      ExitStatus st = ps[r].Wait(seconds(60));
      EXPECT_TRUE(st.exited && st.code == 0) << ps[r].Log() << "\ndaemon:\n"
                                             << daemon.process().Log();
      EXPECT_NE(ps[r].Log().find(absl::StrCat("broadcast ok rank ", r, " device 67108867")),
                std::string::npos)
          << ps[r].Log();
    }
  }
  TwoNodes nodes;
  ASSERT_NO_FATAL_FAILURE(nodes.Start("two-broadcast", 20));
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    for (Process& p : StartTrainers(nodes.node(n), 2, {"--broadcast-root=3", bytes, "--steps=2"})) {
      ps.push_back(std::move(p));
    }
  }
  for (size_t r = 0; r < ps.size(); ++r) {
    ExitStatus st = ps[r].Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << ps[r].Log() << nodes.Logs();
    EXPECT_NE(ps[r].Log().find(absl::StrCat("broadcast ok rank ", r, " device 67108867")),
              std::string::npos)
        << ps[r].Log();
  }
}

// Node 1's daemon stops (SIGSTOP) once both its trainers registered:
// wherever that catches it — forming the job, NCCL init, or its warm-up —
// node 0's trainers get TIMEOUT within the timeout (plus the abort), and
// once node 1 is replaced a fresh generation trains on both nodes.
TEST(CudaTwoNodesFaultTest, NodeThatNeverJoinsTimesOutThenAFreshGenerationTrains) {
  GS_SKIP_UNLESS_GPU();
  constexpr double kTimeoutS = 6;
  TwoNodes nodes;
  ASSERT_NO_FATAL_FAILURE(nodes.Start("never-joins", kTimeoutS));
  std::vector<Process> waiting = StartTrainers(nodes.node(0), 2, {"--steps=3"});
  std::vector<Process> lost = StartTrainers(nodes.node(1), 2, {"--steps=3"});
  // Both of its trainers registered: the job forms across nodes next, then
  // NCCL init; a node stopped now is most likely caught in either.
  ASSERT_TRUE(WaitForLog(nodes.node(1).process(), "local_rank=1 tensors=", seconds(30)))
      << nodes.Logs();
  nodes.node(1).process().Signal(SIGSTOP);
  const auto start = std::chrono::steady_clock::now();
  for (Process& p : waiting) {
    // Registration and forming each have the timeout; then the abort.
    ExitStatus st = p.Wait(seconds(static_cast<int>(3 * kTimeoutS + 30)));
    ASSERT_TRUE(st.exited) << st.ToString() << "\n" << p.Log() << nodes.Logs();
    EXPECT_EQ(st.code, 2) << p.Log();
    EXPECT_NE(p.Log().find("error code=5"), std::string::npos) << p.Log() << nodes.Logs();
  }
  std::printf("node 0's trainers timed out %.1f s after node 1 stopped (timeout %.0f s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              kTimeoutS);
  nodes.node(1).process().Signal(SIGKILL);
  for (Process& p : lost) p.Signal(SIGKILL);
  ASSERT_NO_FATAL_FAILURE(nodes.StartFollower());
  std::vector<Process> next;
  for (int n = 0; n < 2; ++n) {
    for (Process& p : StartTrainers(nodes.node(n), 2, {"--steps=2"})) next.push_back(std::move(p));
  }
  for (Process& p : next) {
    ExitStatus st = p.Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << p.Log() << nodes.Logs();
  }
}

// Node 1's trainer 0 never marks fc1.weight after step 0, so node 1 never
// launches that bucket's collective while node 0's NCCL kernel for it
// spins: the timeout aborts the spinning kernel, every trainer on both
// nodes gets TIMEOUT or PEER_FAILED, and the leader's stall report names
// the node, the trainer and the tensor.
TEST(CudaTwoNodesFaultTest, NodeSkippingACollectiveFailsBothNodesNamingTheCulprit) {
  GS_SKIP_UNLESS_GPU();
  constexpr double kTimeoutS = 6;
  TwoNodes nodes;
  ASSERT_NO_FATAL_FAILURE(nodes.Start("skips", kTimeoutS));
  std::vector<Process> ps = StartTrainers(nodes.node(0), 2, {"--steps=4"});
  {
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", "0"}};
    ps.push_back(Process::Spawn({Runfile("tests/gpu/cuda_trainer"),
                                 "--socket=" + nodes.node(1).socket(), "--steps=4", "--withhold=1"},
                                nodes.node(1).dir() + "/trainer0.log", options));
    options.env = {{"LOCAL_RANK", "1"}};
    ps.push_back(Process::Spawn(
        {Runfile("tests/gpu/cuda_trainer"), "--socket=" + nodes.node(1).socket(), "--steps=4"},
        nodes.node(1).dir() + "/trainer1.log", options));
  }
  for (Process& p : ps) {
    ExitStatus st = p.Wait(seconds(static_cast<int>(3 * kTimeoutS + 30)));
    ASSERT_TRUE(st.exited) << st.ToString() << "\n" << p.Log() << nodes.Logs();
    EXPECT_EQ(st.code, 2) << p.Log() << nodes.Logs();
    EXPECT_TRUE(p.Log().find("error code=5") != std::string::npos ||
                p.Log().find("error code=4") != std::string::npos)
        << p.Log();
  }
  const std::string leader = nodes.node(0).process().Log();
  const size_t at = leader.find("event=job_stall");
  ASSERT_NE(at, std::string::npos) << nodes.Logs();
  const std::string line = leader.substr(at, leader.find('\n', at) - at);
  EXPECT_NE(line.find("node_rank=1"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 2 (local 0"), std::string::npos) << line;
  EXPECT_NE(line.find("fc1.weight"), std::string::npos) << line;
  // The daemons stay up (an aborted kernel is not a lost context).
  EXPECT_TRUE(nodes.node(0).process().Running()) << nodes.Logs();
}

// An elastic job (--min-nodes 2) of kElasticNodes "nodes" x 2 trainers on
// the one GPU. Fatal failures end the calling test.
constexpr int kElasticNodes = 3, kElasticStep = 2;

// Node n (2 trainers) of an elastic job on the one GPU whose leader, node
// 0, listens on `leader_port`; `args` are the job's flags, `extra_env` its
// daemon's additions.
void StartElasticNode(int n, int leader_port, std::vector<std::string> args,
                      std::vector<std::unique_ptr<Daemon>>* nodes,
                      const std::map<std::string, std::string>& extra_env = {}) {
  args.push_back(absl::StrCat("--node-rank=", n));
  if (n > 0) args.push_back(absl::StrCat("--leader=127.0.0.1:", leader_port));
  std::map<std::string, std::string> env = NodeEnv(n);
  env.insert(extra_env.begin(), extra_env.end());
  nodes->push_back(std::make_unique<Daemon>(2, args, env));
  ASSERT_TRUE(nodes->back()->WaitReady(seconds(30))) << nodes->back()->process().Log();
}

void StartElasticNodes(const std::string& job, ScratchDir& secrets,
                       std::vector<std::unique_ptr<Daemon>>* nodes,
                       const std::map<int, std::map<std::string, std::string>>& node_env = {}) {
  ASSERT_TRUE(WriteTokenFile(secrets.File("token"), "cuda-path-token"));
  const std::vector<std::string> args = {
      "--backend=nccl", "--bucket-cap-mb=0.5",   "--first-bucket-cap-mb=0.000001",
      "--timeout-s=10", "--stall-threshold-s=1", "--num-nodes=3",
      "--min-nodes=2",  "--job-id=" + job,       "--job-token-file=" + secrets.File("token")};
  int port = 0;
  for (int n = 0; n < kElasticNodes; ++n) {
    const auto own = node_env.find(n);
    ASSERT_NO_FATAL_FAILURE(StartElasticNode(
        n, port, args, nodes,
        own != node_env.end() ? own->second : std::map<std::string, std::string>{}));
    if (n == 0) port = nodes->back()->ListenPort(seconds(10));
    ASSERT_GT(port, 0) << (*nodes)[0]->process().Log();
  }
}

std::string ElasticLogs(const std::vector<std::unique_ptr<Daemon>>& nodes) {
  std::string out;
  for (size_t n = 0; n < nodes.size(); ++n) {
    out += absl::StrCat("\nnode ", n, " daemon:\n", nodes[n]->process().Log());
  }
  return out;
}

// Waits for trainer `p` to end with exit 0; *weights is its "weights ..."
// line (the state it ended with), *log its whole log.
void EndedWithWeights(Process& p, const std::vector<std::unique_ptr<Daemon>>& nodes,
                      std::string* weights, std::string* log) {
  const ExitStatus st = p.Wait(seconds(60));
  *log = p.Log();
  ASSERT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << *log << ElasticLogs(nodes);
  const size_t at = log->find("weights ");
  ASSERT_NE(at, std::string::npos) << *log;
  *weights = log->substr(at, log->find('\n', at) - at);
}

// In step 2 node 2's trainers stop after their first mark (the first
// bucket, fc2.bias alone, is averaged over 6 and written back everywhere)
// while the survivors' trainers mark everything, so the survivors' NCCL
// kernels wait for node 2 in the next bucket's collective. Node 2 is
// SIGKILLed: the survivors abort those kernels, re-form as generation 2
// with new communicators (2 NCCL ranks, a fresh unique id) and redo step 2
// from the local sums kept in device memory; every survivor ends with
// GS_OK, steps 0-1 averaged over ranks 0-5 and 2 on over ranks 0-3.
TEST(CudaElasticTest, SurvivorsOfAKilledNodeReCreateTheirCommunicatorsAndRedoTheStep) {
  GS_SKIP_UNLESS_GPU();
  constexpr int kNodes = kElasticNodes, kStep = kElasticStep;
  ScratchDir secrets;
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartElasticNodes("elastic", secrets, &nodes));
  auto logs = [&nodes] { return ElasticLogs(nodes); };
  std::vector<std::vector<Process>> trainers;
  for (int n = 0; n < kNodes; ++n) {
    const int marks = n == 2 ? 1 : 5;  // cuda_trainer's 5 tensors
    trainers.push_back(StartTrainers(*nodes[n], 2,
                                     {"--steps=4", absl::StrCat("--pause-at=", kStep, ":", marks),
                                      absl::StrCat("--members-from=", kStep, ":0,1,2,3")}));
  }
  for (auto& on_node : trainers) {
    for (Process& p : on_node) {
      ASSERT_TRUE(WaitForLog(p, absl::StrCat("paused at step ", kStep), seconds(60)) &&
                  WaitStopped(p, seconds(30)))
          << p.Log() << logs();
    }
  }
  // Node 2 waits for its stopped trainers; the survivors wait inside NCCL.
  ASSERT_TRUE(WaitForLog(nodes[2]->process(), "event=stall", seconds(30))) << logs();
  nodes[2]->process().Signal(SIGKILL);
  for (Process& p : trainers[2]) p.Signal(SIGKILL);
  for (int n = 0; n < 2; ++n) {
    for (Process& p : trainers[n]) p.Signal(SIGCONT);
  }
  for (int n = 0; n < 2; ++n) {
    for (Process& p : trainers[n]) {
      ExitStatus st = p.Wait(seconds(60));
      EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << p.Log() << logs();
    }
    const std::string log = nodes[n]->process().Log();
    EXPECT_NE(log.find(absl::StrCat("event=gpu_session_reformed generation=2 gpus=1 first_rank=", n,
                                    " nranks=2")),
              std::string::npos)
        << logs();
    EXPECT_NE(log.find(absl::StrCat("event=iteration_redo iteration=", kStep, " world_size=4")),
              std::string::npos)
        << logs();
  }
  for (Process& p : trainers[2]) p.Wait(seconds(10));
}

// The split-iteration commit on real GPUs (gpu_path_test's
// GpuSplitIterationTest): node 1's daemon withholds step 2's last bucket
// (the test hook writes a NaN over it in its trainers' device memory and
// fails its collective once the release file exists); node 0 completes
// step 2 and its trainers stop at the start of step 3; node 2 is
// SIGKILLed and reaped, then node 1 released. The survivors re-form one
// step apart, node 0 ncclBroadcasts step 2's result from its device copy,
// node 1 writes it into its trainers' gradients and completes step 2 over
// 6; every survivor ends with GS_OK (each step checked against its
// members' average: ranks 0-5 up to step 2, 0-3 after) and the same
// weights.
TEST(CudaElasticTest, ANodeKilledInTheLastCollectiveAfterOneSurvivorCompletedItIsCommitted) {
  GS_SKIP_UNLESS_GPU();
  constexpr int kStep = kElasticStep;
  ScratchDir secrets;
  const std::string release = secrets.File("release");
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(
      StartElasticNodes("elasticsplit", secrets, &nodes,
                        {{1,
                          {{"GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_AT", absl::StrCat(kStep)},
                           {"GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_UNTIL", release}}}}));
  std::vector<std::vector<Process>> trainers;
  for (int n = 0; n < kElasticNodes; ++n) {
    std::vector<std::string> flags = {"--steps=5",
                                      absl::StrCat("--members-from=", kStep + 1, ":0,1,2,3")};
    if (n == 0) flags.push_back(absl::StrCat("--pause-at=", kStep + 1, ":0"));
    trainers.push_back(StartTrainers(*nodes[n], 2, flags));
  }
  ASSERT_TRUE(WaitForLog(nodes[1]->process(),
                         absl::StrCat("event=test_final_result_withheld iteration=", kStep),
                         seconds(60)))
      << ElasticLogs(nodes);
  for (Process& p : trainers[0]) {
    ASSERT_TRUE(WaitForLog(p, absl::StrCat("paused at step ", kStep + 1), seconds(60)) &&
                WaitStopped(p, seconds(30)))
        << p.Log() << ElasticLogs(nodes);
  }
  nodes[2]->process().Signal(SIGKILL);
  for (Process& p : trainers[2]) p.Signal(SIGKILL);
  nodes[2]->process().Wait(seconds(30));
  std::FILE* go = std::fopen(release.c_str(), "w");  // node 1's collective fails now
  ASSERT_NE(go, nullptr) << release;
  std::fclose(go);
  for (Process& p : trainers[0]) p.Signal(SIGCONT);
  std::string weights;
  for (int n = 0; n < 2; ++n) {
    for (Process& p : trainers[n]) {
      std::string mine, log;
      ASSERT_NO_FATAL_FAILURE(EndedWithWeights(p, nodes, &mine, &log));
      if (weights.empty()) weights = mine;
      EXPECT_EQ(mine, weights) << "node " << n << " ended with other weights";
    }
  }
  EXPECT_NE(nodes[0]->process().Log().find(absl::StrCat(
                "event=split_iteration_commit iteration=", kStep, " from_node_rank=0")),
            std::string::npos)
      << ElasticLogs(nodes);
  EXPECT_NE(nodes[1]->process().Log().find(
                absl::StrCat("event=split_iteration_committed iteration=", kStep, " divisor=6")),
            std::string::npos)
      << ElasticLogs(nodes);
  for (Process& p : trainers[2]) p.Wait(seconds(10));
}

// A trainer that dies mid-backward leaves its node in an elastic GPU job:
// rank 3 (node 1, local rank 1) SIGKILLs itself after 2 marks of step 2.
// Node 1 counts it out mid-iteration (restoring rank 2's inputs of the
// buckets summed so far from its device copies) and every node redoes step
// 2 without it: all 5 others end with GS_OK, averaged over ranks 0, 1, 2,
// 4, 5 from step 2 on; nobody departs or re-forms.
TEST(CudaElasticTest, ATrainerKilledMidBackwardLeavesItsNodeInAndEveryNodeRedoesTheStep) {
  GS_SKIP_UNLESS_GPU();
  ScratchDir secrets;
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartElasticNodes("elastictrainer", secrets, &nodes));
  const std::vector<std::string> flags = {
      "--steps=4", absl::StrCat("--members-from=", kElasticStep, ":0,1,2,4,5")};
  std::vector<std::vector<Process>> trainers;
  for (int n = 0; n < kElasticNodes; ++n) {
    if (n != 1) {
      trainers.push_back(StartTrainers(*nodes[n], 2, flags));
      continue;
    }
    std::vector<Process> on_node = StartTrainers(*nodes[n], 1, flags);
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", "1"}};
    std::vector<std::string> argv = {Runfile("tests/gpu/cuda_trainer"),
                                     "--socket=" + nodes[n]->socket(),
                                     absl::StrCat("--die-at-step=", kElasticStep)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    on_node.push_back(
        Process::Spawn(argv, absl::StrCat(nodes[n]->dir(), "/trainer1.log"), options));
    trainers.push_back(std::move(on_node));
  }
  Process& victim = trainers[1][1];
  const ExitStatus died = victim.Wait(seconds(60));
  EXPECT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim.Log();
  for (int n = 0; n < kElasticNodes; ++n) {
    for (size_t r = 0; r < trainers[n].size(); ++r) {
      if (n == 1 && r == 1) continue;
      Process& p = trainers[n][r];
      const ExitStatus st = p.Wait(seconds(120));
      EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n"
                                             << p.Log() << ElasticLogs(nodes);
    }
    const std::string log = nodes[n]->process().Log();
    for (const char* needle : {"event=node_departed", "event=job_reformed", "event=job_failed"}) {
      EXPECT_EQ(log.find(needle), std::string::npos)
          << needle << " on node " << n << ElasticLogs(nodes);
    }
  }
  EXPECT_NE(nodes[1]->process().Log().find(
                absl::StrCat("event=trainer_lost_mid_iteration iteration=", kElasticStep,
                             " trainer=\"rank 3 (local 1, pid ", victim.pid(), ")\"")),
            std::string::npos)
      << ElasticLogs(nodes);
}

// A node joining a running elastic GPU job: nodes 0 and 1 (--num-nodes 2
// --max-nodes 3 --min-nodes 1, 2 trainers each on the one GPU) train; node
// 0's trainers stop at the start of step 2 while node 2, a new rank, starts
// with 2 trainers (--catch-up). Once both members read the leader's grow
// entry node 0's trainers go on and all switch at its iteration m: the
// members re-create their communicators with node 2 (3 NCCL ranks, a fresh
// unique id), node 2 opens its session at NCCL rank 2, and every trainer
// gs_broadcasts the job's state (iteration count and fp64 weights, in a
// device buffer) from rank 0 after step m-1. The joiners receive it at m;
// every step is the average over its members (ranks 0-3 before m, 0-5 from
// m on) and all six end with the same weights.
TEST(CudaElasticTest, ANewNodeJoinsTheRunningJobAndCatchesUpFromDeviceMemory) {
  GS_SKIP_UNLESS_GPU();
  constexpr int kSteps = 6;
  ScratchDir secrets;
  ASSERT_TRUE(WriteTokenFile(secrets.File("token"), "cuda-path-token"));
  const std::vector<std::string> args = {
      "--backend=nccl", "--bucket-cap-mb=0.5",  "--first-bucket-cap-mb=0.000001",
      "--timeout-s=20", "--num-nodes=2",        "--max-nodes=3",
      "--min-nodes=1",  "--job-id=elasticjoin", "--job-token-file=" + secrets.File("token")};
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartElasticNode(0, 0, args, &nodes));
  const int port = nodes[0]->ListenPort(seconds(10));
  ASSERT_GT(port, 0) << ElasticLogs(nodes);
  ASSERT_NO_FATAL_FAILURE(StartElasticNode(1, port, args, &nodes));
  const std::vector<std::string> flags = {absl::StrCat("--steps=", kSteps), "--catch-up",
                                          "--members-before-join=0,1,2,3",
                                          "--members-after-join=0,1,2,3,4,5"};
  std::vector<std::string> paused = flags;
  paused.push_back(absl::StrCat("--pause-at=", kElasticStep, ":0"));
  std::vector<std::vector<Process>> trainers;
  trainers.push_back(StartTrainers(*nodes[0], 2, paused));
  trainers.push_back(StartTrainers(*nodes[1], 2, flags));
  for (Process& p : trainers[0]) {
    ASSERT_TRUE(WaitForLog(p, absl::StrCat("paused at step ", kElasticStep), seconds(60)) &&
                WaitStopped(p, seconds(30)))
        << p.Log() << ElasticLogs(nodes);
  }
  ASSERT_NO_FATAL_FAILURE(StartElasticNode(2, port, args, &nodes));
  trainers.push_back(StartTrainers(*nodes[2], 2, flags));
  ASSERT_TRUE(WaitForLog(nodes[0]->process(), "event=job_grow_published", seconds(30)))
      << ElasticLogs(nodes);
  for (int n : {0, 1}) {
    ASSERT_TRUE(WaitForLog(nodes[n]->process(), "event=job_grow_read", seconds(30)))
        << ElasticLogs(nodes);
  }
  for (Process& p : trainers[0]) p.Signal(SIGCONT);
  const std::string joined = "rank 4 joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog(trainers[2][0], joined, seconds(60)))
      << trainers[2][0].Log() << ElasticLogs(nodes);
  const std::string log = trainers[2][0].Log();
  const int m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(m, kElasticStep);
  ASSERT_LT(m, kSteps) << "the members finished before node 2 joined";
  std::string weights;
  for (int n = 0; n < 3; ++n) {
    for (Process& p : trainers[n]) {
      std::string mine, out;
      ASSERT_NO_FATAL_FAILURE(EndedWithWeights(p, nodes, &mine, &out));
      if (weights.empty()) weights = mine;
      EXPECT_EQ(mine, weights) << "node " << n << " ended with other weights";
      const std::string needle =
          n < 2 ? absl::StrCat("nodes joined after iteration ", m, ": state sent from rank 0")
                : absl::StrCat("joined the running job at iteration ", m,
                               ": state from rank 0, world size 6");
      EXPECT_NE(out.find(needle), std::string::npos) << needle << " in " << out;
    }
  }
  for (int n = 0; n < 2; ++n) {
    EXPECT_NE(nodes[n]->process().Log().find(absl::StrCat(
                  "event=gpu_session_reformed generation=2 gpus=1 first_rank=", n, " nranks=3")),
              std::string::npos)
        << ElasticLogs(nodes);
  }
  EXPECT_NE(nodes[2]->process().Log().find("first_rank=2 nranks=3"), std::string::npos)
      << ElasticLogs(nodes);
}

// A trainer's death before its first or after its last mark of an
// iteration leaves its node in an elastic GPU job: rank 3 (node 1, local
// rank 1) SIGKILLs itself in step 2 after `marks` marks (after all of them
// with its stream synchronized), the others held at the start of step 2
// until node 1 counted the death. Nobody re-forms; the five others end with
// GS_OK, each step the average over its members (ranks 0, 1, 2, 4, 5 from
// step 2, or from step 3 when the dead trainer's gradients counted in 2).
void RunUntilATrainerDiesAndExpectItsNodeStays(const std::string& job, int marks) {
  constexpr int kTensors = 5;  // cuda_trainer's
  ScratchDir secrets;
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartElasticNodes(job, secrets, &nodes));
  const int from = marks == 0 ? kElasticStep : kElasticStep + 1;
  const std::vector<std::string> flags = {"--steps=5",
                                          absl::StrCat("--members-from=", from, ":0,1,2,4,5")};
  std::vector<std::string> held = flags;
  held.push_back(absl::StrCat("--pause-at=", kElasticStep, ":0"));
  std::vector<Process> others;
  Process victim;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = {Runfile("tests/gpu/cuda_trainer"),
                                       "--socket=" + nodes[n]->socket()};
      const bool dies = n == 1 && r == 1;
      const std::vector<std::string>& mine = dies ? flags : held;
      args.insert(args.end(), mine.begin(), mine.end());
      if (dies) {
        args.insert(args.end(), {absl::StrCat("--die-at-step=", kElasticStep),
                                 absl::StrCat("--die-after-marks=", marks)});
      }
      SpawnOptions options;
      options.env = {{"LOCAL_RANK", std::to_string(r)}};
      Process p =
          Process::Spawn(args, absl::StrCat(nodes[n]->dir(), "/trainer", r, ".log"), options);
      if (dies) {
        victim = std::move(p);
      } else {
        others.push_back(std::move(p));
      }
    }
  }
  const ExitStatus died = victim.Wait(seconds(90));
  EXPECT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim.Log();
  const std::string departed = absl::StrCat("event=trainer_departed iteration=", kElasticStep,
                                            " trainer=\"rank 3 (local 1, pid ", victim.pid(),
                                            ")\" marked=", marks, "/", kTensors);
  ASSERT_TRUE(WaitForLog(nodes[1]->process(), departed, seconds(30)))
      << departed << ElasticLogs(nodes);
  for (Process& p : others) {
    ASSERT_TRUE(WaitStopped(p, seconds(30))) << p.Log() << ElasticLogs(nodes);
    p.Signal(SIGCONT);
  }
  for (Process& p : others) {
    const ExitStatus st = p.Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n"
                                           << p.Log() << ElasticLogs(nodes);
  }
  for (int n = 0; n < kElasticNodes; ++n) {
    const std::string log = nodes[n]->process().Log();
    for (const char* needle : {"event=job_reformed", "event=node_departed", "event=job_failed"}) {
      EXPECT_EQ(log.find(needle), std::string::npos)
          << needle << " on node " << n << ElasticLogs(nodes);
    }
  }
}

TEST(CudaElasticTest, ATrainerDeadBeforeItsFirstMarkLeavesItsNodeIn) {
  GS_SKIP_UNLESS_GPU();
  RunUntilATrainerDiesAndExpectItsNodeStays("elasticbefore", 0);
}

TEST(CudaElasticTest, ATrainerDeadAfterItsLastMarkLeavesItsNodeIn) {
  GS_SKIP_UNLESS_GPU();
  RunUntilATrainerDiesAndExpectItsNodeStays("elasticafter", 5);
}

// A restarted trainer rejoins its node of an elastic GPU job (the twin of
// gpu_path_test's GpuTrainerRejoinTest, flat buffers): rank 3 (node 1,
// local rank 1) SIGKILLs itself at the start of step 2 before any mark,
// the others held there until node 1 counted it out; a replacement with
// LOCAL_RANK 1 (--catch-up) starts on node 1 and, once node 1's scheduler
// holds its request, the others go on over ranks 0, 1, 2, 4, 5. At the
// boundary after the agreement that announced it node 1 opens its readiness
// events (its predecessor's daemon-owned flat buffer again, the dead one's
// events closed) between iterations, and it starts at m with rank 3 and rank
// 0's state by gs_broadcast of a device buffer; every step is the average
// over its members (all 6, then the five from step 2, all 6 from m) and all
// six end with the same weights. Nobody re-forms or fails.
TEST(CudaElasticTest, ARestartedTrainerRejoinsItsNodeAndCatchesUpFromDeviceMemory) {
  GS_SKIP_UNLESS_GPU();
  constexpr int kSteps = 6;
  ScratchDir secrets;
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartElasticNodes("elasticrejoin", secrets, &nodes));
  const std::vector<std::string> flags = {
      absl::StrCat("--steps=", kSteps), "--catch-up",
      absl::StrCat("--members-from=", kElasticStep, ":0,1,2,4,5"),
      "--members-after-join=0,1,2,3,4,5"};
  std::vector<std::string> held = flags;
  held.push_back(absl::StrCat("--pause-at=", kElasticStep, ":0"));
  auto spawn = [&nodes](int n, int r, const std::vector<std::string>& mine, const char* name) {
    std::vector<std::string> args = {Runfile("tests/gpu/cuda_trainer"),
                                     "--socket=" + nodes[n]->socket()};
    args.insert(args.end(), mine.begin(), mine.end());
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", std::to_string(r)}};
    return Process::Spawn(args, absl::StrCat(nodes[n]->dir(), "/", name, r, ".log"), options);
  };
  std::vector<Process> others;
  Process victim;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      if (n == 1 && r == 1) {
        std::vector<std::string> dies = flags;
        dies.insert(dies.end(),
                    {absl::StrCat("--die-at-step=", kElasticStep), "--die-after-marks=0"});
        victim = spawn(n, r, dies, "trainer");
      } else {
        others.push_back(spawn(n, r, held, "trainer"));
      }
    }
  }
  const ExitStatus died = victim.Wait(seconds(90));
  ASSERT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim.Log();
  const std::string departed =
      absl::StrCat("event=trainer_departed iteration=", kElasticStep,
                   " trainer=\"rank 3 (local 1, pid ", victim.pid(), ")\" marked=0/5");
  ASSERT_TRUE(WaitForLog(nodes[1]->process(), departed, seconds(30)))
      << departed << ElasticLogs(nodes);
  for (Process& p : others) {
    ASSERT_TRUE(WaitStopped(p, seconds(30))) << p.Log() << ElasticLogs(nodes);
  }
  others.push_back(spawn(1, 1, flags, "restarted"));
  Process& fresh = others.back();
  ASSERT_TRUE(WaitForLog(nodes[1]->process(), "event=trainer_rejoin_pending", seconds(60)))
      << fresh.Log() << ElasticLogs(nodes);
  for (size_t i = 0; i + 1 < others.size(); ++i) others[i].Signal(SIGCONT);
  const std::string joined = "rank 3 joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog(fresh, joined, seconds(60))) << fresh.Log() << ElasticLogs(nodes);
  const std::string log = fresh.Log();
  const int m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(m, kElasticStep);
  ASSERT_LT(m, kSteps) << "the others finished before the replacement rejoined";
  std::string weights;
  for (size_t i = 0; i < others.size(); ++i) {
    Process& p = others[i];
    std::string mine, out;
    ASSERT_NO_FATAL_FAILURE(EndedWithWeights(p, nodes, &mine, &out));
    if (weights.empty()) weights = mine;
    EXPECT_EQ(mine, weights) << "trainer " << i << " ended with other weights";
    const std::string needle =
        i + 1 < others.size()
            ? absl::StrCat("trainers joined after iteration ", m, ": state sent from rank 0")
            : absl::StrCat(joined, m, ": state from rank 0, world size 6");
    EXPECT_NE(out.find(needle), std::string::npos) << needle << " in " << out;
  }
  EXPECT_NE(nodes[1]->process().Log().find(absl::StrCat("event=trainer_rejoined iteration=", m)),
            std::string::npos)
      << ElasticLogs(nodes);
  for (int n = 0; n < kElasticNodes; ++n) {
    const std::string daemon = nodes[n]->process().Log();
    for (const char* needle : {"event=job_reformed", "event=node_departed", "event=job_failed",
                               "event=trainer_rejoin_refused"}) {
      EXPECT_EQ(daemon.find(needle), std::string::npos)
          << needle << " on node " << n << ElasticLogs(nodes);
    }
  }
}

}  // namespace
}  // namespace gradsync::testing
