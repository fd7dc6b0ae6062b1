// The GPU data path end to end on the simulated device: a real
// gradsyncd_sim and real trainer processes (sim_trainer) with CUDA
// gradients, each checking every synced step against the sum over all
// trainers divided by the world size. Trainers mark gradients ready right
// after queueing their writes (no synchronize) in shuffled orders, so the
// plan is rebuilt after iteration 0 and later buckets are staged.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/harness.h"
#include "tests/testing/shm_entries.h"
#include "tests/testing/sim_segment_prefix.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

const std::vector<std::string> kDaemonArgs = {"--bucket-cap-mb=0.004",
                                              "--first-bucket-cap-mb=0.001", "--timeout-s=20"};

struct Case {
  std::string name;
  int trainers;
  int gpus;
  std::vector<std::string> args;  // sim_trainer flags
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::map<std::string, std::string> SimEnv(int gpus) {
  return {{"GRADSYNC_SIM_GPUS", std::to_string(gpus)}};
}

Process StartSimTrainer(const Daemon& daemon, int local_rank, int gpus,
                        const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& extra_env = {}) {
  std::vector<std::string> argv = {Runfile("tests/gpu/sim_trainer"), "--socket=" + daemon.socket(),
                                   absl::StrCat("--shuffle-seed=", 7 + local_rank)};
  argv.insert(argv.end(), args.begin(), args.end());
  std::map<std::string, std::string> env = SimEnv(gpus);
  for (const auto& [k, v] : extra_env) env[k] = v;
  env["LOCAL_RANK"] = std::to_string(local_rank);
  SpawnOptions options;
  options.env = env;
  return Process::Spawn(
      argv, absl::StrCat(daemon.dir(), "/trainer", local_rank, ".", rand() % 1000000, ".log"),
      options);
}

std::vector<Process> StartAll(const Daemon& daemon, const Case& c) {
  std::vector<Process> out;
  for (int r = 0; r < c.trainers; ++r) out.push_back(StartSimTrainer(daemon, r, c.gpus, c.args));
  return out;
}

class GpuEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuEquivalenceTest, EveryStepIsTheAverageOverAllTrainers) {
  const Case& c = GetParam();
  Daemon daemon(c.trainers, kDaemonArgs, SimEnv(c.gpus), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers = StartAll(daemon, c);
  for (int r = 0; r < c.trainers; ++r) {
    ExitStatus st = trainers[r].Wait(seconds(90));
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " code " << st.code << "\n"
                                           << trainers[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
    EXPECT_NE(trainers[r].Log().find("OK rank"), std::string::npos) << trainers[r].Log();
  }
  const std::string log = daemon.process().Log();
  EXPECT_NE(log.find("backend=gpu-sim"), std::string::npos) << log;
  EXPECT_EQ(log.find("buckets=1 "), std::string::npos) << log;
  // Shuffled ready orders: rebuilt after iteration 0, so buckets are no
  // longer one range (flat mode) and go through staging.
  EXPECT_NE(log.find("event=plan_rebuilt iteration=1"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(
    Sim, GpuEquivalenceTest,
    ::testing::Values(
        Case{"one_flat_fp32", 1, 1, {"--mode=flat"}},
        Case{"two_same_gpu_flat_fp32", 2, 1, {"--mode=flat"}},
        Case{"two_gpus_flat_fp32", 2, 2, {"--mode=flat"}},
        Case{"four_on_two_gpus_flat_bf16", 4, 2, {"--mode=flat", "--dtype=bf16"}},
        Case{"four_gpus_user_fp32", 4, 4, {"--mode=user"}},
        Case{"two_same_gpu_user_bf16", 2, 1, {"--mode=user", "--dtype=bf16"}},
        Case{"four_on_two_gpus_user_fp32_held", 4, 2, {"--mode=user", "--hold-stream-ms=20"}},
        Case{"no_sync_unused_two_gpus_flat",
             2,
             2,
             {"--mode=flat", "--accumulate=3", "--unused-every=2"}},
        Case{"no_sync_unused_four_on_two_user_bf16",
             4,
             2,
             {"--mode=user", "--dtype=bf16", "--accumulate=2", "--unused-every=3"}},
        Case{"unused_four_gpus_flat", 4, 4, {"--mode=flat", "--unused-every=2"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Readiness events are pooled per trainer: 5,000 tensors x 4 trainers
// train exactly, and the daemon opens at most the client's pool size
// (256) of interprocess events per trainer, not one per tensor — a
// process opening tens of thousands of them fails on a real GPU.
TEST(GpuPath, FiveThousandTensorsShareEachTrainersPoolOfEvents) {
  // Short simulated kernel delays: 5,000 writes and marks per iteration.
  std::map<std::string, std::string> env = SimEnv(2);
  env["GRADSYNC_SIM_MAX_DELAY_US"] = "20";
  for (const std::string mode : {"flat", "user"}) {
    Daemon daemon(4, kDaemonArgs, env, "tests/gpu/gradsyncd_sim");
    ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
    std::vector<Process> trainers;
    for (int r = 0; r < 4; ++r) {
      trainers.push_back(
          StartSimTrainer(daemon, r, 2, {"--mode=" + mode, "--tensors=5000", "--steps=3"}, env));
    }
    for (int r = 0; r < 4; ++r) {
      ExitStatus st = trainers[r].Wait(seconds(100));
      ASSERT_TRUE(st.exited && st.code == 0)
          << mode << " trainer " << r << " code " << st.code << "\n"
          << trainers[r].Log() << "\ndaemon:\n"
          << daemon.process().Log();
      EXPECT_NE(trainers[r].Log().find("OK rank"), std::string::npos) << trainers[r].Log();
    }
    const std::string log = daemon.process().Log();
    const size_t at = log.find("event=gpu_session_open");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find("tensors=5000 "), std::string::npos) << line;
    EXPECT_NE(line.find("events_opened=1024"), std::string::npos)
        << mode << ": 4 trainers x 256 pooled events expected, not one per tensor: " << line;
  }
}

// A pooled readiness event re-recorded for a later mark on another stream
// must not complete before its earlier recording: here every slot is
// recorded first on a held stream and then again on a running one (600
// tensors, 256 events, the stream switched after 300 marks). Were the
// second recording unordered, the daemon would see it complete and read
// the held stream's gradients before they are written.
TEST(GpuPath, PooledEventReRecordedOnAnotherStreamWaitsForItsEarlierRecording) {
  // Short simulated kernel delays: the running stream gets through its
  // writes and recordings well within the other one's hold.
  std::map<std::string, std::string> env = SimEnv(1);
  env["GRADSYNC_SIM_MAX_DELAY_US"] = "20";
  for (const std::string mode : {"flat", "user"}) {
    Daemon daemon(2, kDaemonArgs, env, "tests/gpu/gradsyncd_sim");
    ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
    std::vector<Process> trainers;
    for (int r = 0; r < 2; ++r) {
      trainers.push_back(
          StartSimTrainer(daemon, r, 1,
                          {"--mode=" + mode, "--tensors=600", "--switch-stream-at=300",
                           "--hold-stream-ms=500", "--steps=3"},
                          env));
    }
    for (auto& t : trainers) {
      ExitStatus st = t.Wait(seconds(90));
      ASSERT_TRUE(st.exited && st.code == 0) << mode << " code " << st.code << "\n"
                                             << t.Log() << "\ndaemon:\n"
                                             << daemon.process().Log();
    }
  }
}

// A job that fails while its communicators are being created (here a
// simulated init whose peer never joins) is answered at once: the failure
// cancels the init instead of waiting out the timeout (300 s; the test
// gives the surviving trainer 60).
TEST(GpuPath, JobFailingDuringCommunicatorInitIsAnsweredBeforeTheTimeout) {
  std::map<std::string, std::string> env = SimEnv(1);
  env["GRADSYNC_SIM_STALL_AT"] = "create_collectives";
  Daemon daemon(2, {"--timeout-s=300"}, env, "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  Process victim = StartSimTrainer(daemon, 0, 1, {"--mode=flat"}, env);
  Process peer = StartSimTrainer(daemon, 1, 1, {"--mode=flat"}, env);
  ASSERT_TRUE(
      WaitUntil([&] { return daemon.process().Log().find("event=sim_stall") != std::string::npos; },
                seconds(30)))
      << daemon.process().Log();
  const std::string victim_name = absl::StrCat("(local 0, pid ", victim.pid(), ")");
  victim.Signal(SIGKILL);
  ExitStatus st = peer.Wait(seconds(60));
  const std::string log = peer.Log();
  ASSERT_TRUE(st.exited && st.code == 2) << "code " << st.code << "\n"
                                         << log << "\ndaemon:\n"
                                         << daemon.process().Log();
  EXPECT_NE(log.find("error code=4"), std::string::npos) << log;  // PEER_FAILED
  EXPECT_NE(log.find(victim_name), std::string::npos) << log;
  victim.Wait(seconds(10));
}

// gs_close drains the trainer's stream and unmaps the daemon's gradient
// buffer before it detaches, so the daemon (which frees the buffer once the
// trainers left) never frees memory a live trainer still maps: undefined
// behaviour in CUDA, reported by the simulation and logged by the daemon.
TEST(GpuPath, TrainersUnmapTheirBufferBeforeTheDaemonFreesIt) {
  for (int n : {1, 2}) {
    Daemon daemon(n, kDaemonArgs, SimEnv(1), "tests/gpu/gradsyncd_sim");
    ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
    std::vector<Process> trainers = StartAll(daemon, Case{"release", n, 1, {"--steps=2"}});
    for (auto& t : trainers) {
      ExitStatus st = t.Wait(seconds(60));
      ASSERT_TRUE(st.exited && st.code == 0) << t.Log() << "\ndaemon:\n" << daemon.process().Log();
    }
    ASSERT_TRUE(WaitForLog(daemon.process(), "event=job_released", seconds(30)))
        << daemon.process().Log();
    const std::string log = daemon.process().Log();
    EXPECT_EQ(log.find("freed while mapped"), std::string::npos) << n << " trainers\n" << log;
    EXPECT_EQ(log.find("event=gpu_release_failed"), std::string::npos) << log;
  }
}

// User-pointer mode: a trainer frees its gradient memory right after
// gs_close, so its Detach must not be answered while the daemon still maps
// that memory — here the last trainer's release of the whole session, which
// took the session before the first trainer looked for it (a test-only
// flag of gradsyncd_sim holds both departures open so this order is
// certain, as heavy load makes it likely).
TEST(GpuPath, DetachWaitsForTheLastTrainersReleaseOfItsMemory) {
  Daemon daemon(2, {"--timeout-s=20", "--test-departure-race"}, SimEnv(1),
                "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers =
      StartAll(daemon, Case{"race", 2, 1, {"--mode=user", "--steps=2"}});
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(seconds(90));
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << "\ndaemon:\n" << daemon.process().Log();
    EXPECT_EQ(t.Log().find("freed while mapped"), std::string::npos) << t.Log();
  }
  ASSERT_TRUE(WaitForLog(daemon.process(), "event=job_released", seconds(30)))
      << daemon.process().Log();
  const std::string log = daemon.process().Log();
  EXPECT_EQ(log.find("event=gpu_release_failed"), std::string::npos) << log;
  EXPECT_EQ(log.find("event=departure_release_overdue"), std::string::npos) << log;
}

// Two simulated nodes of 2 trainers each on 2 GPUs: node 0 the leader,
// node 1 joining it. Fatal failures end the calling test.
void StartTwoSimNodes(std::vector<std::string> common, std::unique_ptr<Daemon>* leader,
                      std::unique_ptr<Daemon>* follower) {
  // Read at start: the directory may go once both daemons are up.
  ScratchDir secrets;
  ASSERT_TRUE(WriteTokenFile(secrets.File("token"), "gpu-path-token"));
  common.push_back("--job-token-file=" + secrets.File("token"));
  std::vector<std::string> lead = common;
  lead.push_back("--node-rank=0");
  // One host per node, as NCCL_HOSTID makes two nodes of one machine.
  std::map<std::string, std::string> env = SimEnv(2);
  env["NCCL_HOSTID"] = "sim-node-0";
  *leader = std::make_unique<Daemon>(2, lead, env, "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE((*leader)->WaitReady(seconds(10))) << (*leader)->process().Log();
  const int port = (*leader)->ListenPort(seconds(10));
  ASSERT_GT(port, 0) << (*leader)->process().Log();
  std::vector<std::string> follow = common;
  follow.insert(follow.end(), {"--node-rank=1", absl::StrCat("--leader=127.0.0.1:", port)});
  env["NCCL_HOSTID"] = "sim-node-1";
  *follower = std::make_unique<Daemon>(2, follow, env, "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE((*follower)->WaitReady(seconds(10))) << (*follower)->process().Log();
}

// Two nodes (two daemons), two trainers each on two GPUs: one NCCL rank per
// GPU of the job (4), the GPU counts and the unique id exchanged through the
// leader's rendezvous store; every step is the average over all 4 trainers.
TEST(GpuPath, TwoNodesAverageOverEveryTrainer) {
  for (const std::string mode : {"flat", "user"}) {
    std::vector<std::string> common = kDaemonArgs;
    common.insert(common.end(), {"--num-nodes=2", "--job-id=gpujob-" + mode});
    std::unique_ptr<Daemon> leader_node, follower_node;
    ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader_node, &follower_node));
    Daemon& leader = *leader_node;
    Daemon& follower = *follower_node;

    std::vector<Process> trainers;
    for (Daemon* d : {&leader, &follower}) {
      for (int r = 0; r < 2; ++r) {
        trainers.push_back(StartSimTrainer(*d, r, 2, {"--mode=" + mode, "--steps=4"}));
      }
    }
    for (auto& t : trainers) {
      ExitStatus st = t.Wait(seconds(90));
      EXPECT_TRUE(st.exited && st.code == 0) << mode << "\n"
                                             << t.Log() << "\nleader:\n"
                                             << leader.process().Log() << "\nfollower:\n"
                                             << follower.process().Log();
      EXPECT_NE(t.Log().find("world 4"), std::string::npos) << t.Log();
    }
    EXPECT_NE(follower.process().Log().find("first_rank=2 nranks=4"), std::string::npos)
        << follower.process().Log();
  }
}

// Node 0's trainers register flat buffers, node 1's their own allocations:
// each bucket's collective would span different sizes on the two nodes.
// Both nodes fail MISMATCH naming both ways before any communicator
// exists. Nothing hangs.
TEST(GpuPath, NodesRegisteringCudaGradientsDifferentlyAreAMismatchNamingBoth) {
  std::vector<std::string> common = kDaemonArgs;
  common.insert(common.end(), {"--num-nodes=2", "--job-id=gpujob-mixed", "--timeout-s=30"});
  std::unique_ptr<Daemon> leader, follower;
  ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader, &follower));
  std::vector<Process> trainers;
  for (Daemon* d : {leader.get(), follower.get()}) {
    const std::string mode = d == leader.get() ? "--mode=flat" : "--mode=user";
    for (int r = 0; r < 2; ++r) trainers.push_back(StartSimTrainer(*d, r, 2, {mode, "--steps=2"}));
  }
  const std::string named =
      "node 1's trainers registered their CUDA gradients as their own allocations (every "
      "cuda_ptr set) but node 0's as the daemon's flat buffer (every cuda_ptr NULL)";
  for (size_t t = 0; t < trainers.size(); ++t) {
    const ExitStatus st = trainers[t].Wait(seconds(60));
    const std::string log = trainers[t].Log();
    const std::string logs =
        log + "\nleader:\n" + leader->process().Log() + "\nfollower:\n" + follower->process().Log();
    ASSERT_TRUE(st.exited && st.code == 2) << "trainer " << t << "\n" << logs;
    EXPECT_NE(log.find(named), std::string::npos) << "trainer " << t << "\n" << logs;
    EXPECT_NE(log.find("error code=3"), std::string::npos) << log;  // MISMATCH
  }
  for (Daemon* d : {leader.get(), follower.get()}) {
    EXPECT_EQ(d->process().Log().find("event=gpu_session_open"), std::string::npos)
        << d->process().Log();
  }
}

// gradsyncd --check-replicas-every in a job with CUDA gradients on two
// nodes: the fingerprints are host values, compared across nodes through
// the Gloo worker while the gradients go through the device's collectives.
// Equal replicas pass every check; rank 3 (node 1) drifting after step
// index 2 (iteration 3) is named on both nodes at the check after
// iteration 4.
TEST(GpuPath, TwoNodesCheckReplicasAndNameADriftedOne) {
  for (const bool drift : {false, true}) {
    std::vector<std::string> common = kDaemonArgs;
    common.insert(common.end(), {"--num-nodes=2", "--check-replicas-every=2",
                                 absl::StrCat("--job-id=gpucheck-", drift)});
    std::unique_ptr<Daemon> leader, follower;
    ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader, &follower));
    std::vector<std::string> args = {"--steps=6", "--check-replicas"};
    if (drift) args.insert(args.end(), {"--drift-rank=3", "--drift-at=2"});
    std::vector<Process> trainers;
    for (Daemon* d : {leader.get(), follower.get()}) {
      for (int r = 0; r < 2; ++r) trainers.push_back(StartSimTrainer(*d, r, 2, args));
    }
    for (size_t rank = 0; rank < trainers.size(); ++rank) {
      const ExitStatus st = trainers[rank].Wait(seconds(90));
      const std::string log = trainers[rank].Log();
      const std::string daemons =
          "\nleader:\n" + leader->process().Log() + "\nfollower:\n" + follower->process().Log();
      ASSERT_TRUE(st.exited) << st.ToString() << "\n" << log;
      EXPECT_NE(log.find(absl::StrCat("check ok rank ", rank, " iteration 2\n")), std::string::npos)
          << log;
      if (!drift) {
        EXPECT_EQ(st.code, 0) << log << daemons;
        EXPECT_NE(log.find(absl::StrCat("check ok rank ", rank, " iteration 6\n")),
                  std::string::npos)
            << log;
        continue;
      }
      EXPECT_EQ(st.code, 2) << log << daemons;
      EXPECT_NE(log.find("error code=3: replicas differ after iteration 4: tensor 'fc1.weight' "
                         "(index 1)"),
                std::string::npos)
          << log;
      EXPECT_NE(log.find(") on node 0 but "), std::string::npos) << log;
      EXPECT_NE(log.find(" on rank 3 (local 1, pid "), std::string::npos) << log;
      EXPECT_EQ(log.find("iteration 4\n"), std::string::npos) << log;
    }
  }
}

// gs_broadcast of a host buffer (two pieces and a tail) in a job with CUDA
// gradients on two nodes, from a root on either node, before the first
// step and between steps: every trainer of both nodes gets the root's
// bytes, and every step still averages over all 4 trainers.
TEST(GpuPath, TwoNodesBroadcastHostBuffersFromARootOnEitherNode) {
  for (const int root : {3, 0}) {
    std::vector<std::string> common = kDaemonArgs;
    common.insert(common.end(), {"--num-nodes=2", absl::StrCat("--job-id=gpubcast-", root)});
    std::unique_ptr<Daemon> leader, follower;
    ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader, &follower));
    std::vector<Process> trainers;
    for (Daemon* d : {leader.get(), follower.get()}) {
      for (int r = 0; r < 2; ++r) {
        trainers.push_back(
            StartSimTrainer(*d, r, 2, {"--steps=3", absl::StrCat("--broadcast-root=", root)}));
      }
    }
    for (size_t rank = 0; rank < trainers.size(); ++rank) {
      const ExitStatus st = trainers[rank].Wait(seconds(90));
      const std::string log = trainers[rank].Log();
      EXPECT_TRUE(st.exited && st.code == 0) << "root " << root << "\n"
                                             << log << "\nleader:\n"
                                             << leader->process().Log() << "\nfollower:\n"
                                             << follower->process().Log();
      for (const char* when : {"at start", "between steps"}) {
        EXPECT_NE(log.find(absl::StrCat("broadcast ok rank ", rank, " ", when, "\n")),
                  std::string::npos)
            << log;
      }
      EXPECT_NE(log.find("OK rank " + std::to_string(rank) + " world 4 steps 3"), std::string::npos)
          << log;
    }
  }
}

// gs_broadcast of device buffers (each trainer's own allocation on its
// GPU, written on its stream just before the call, never synchronized by
// the trainer): 0 B, 1 B, an odd size and 64 MiB + 3 (17 pieces), before
// the first step and between steps. One GPU: both trainers share the
// root's device staging; two GPUs: each piece crosses with the simulated
// ncclBroadcast. Every byte is the root's, and every step still averages.
TEST(GpuPath, OneNodeBroadcastsDeviceBuffersOfEverySizeToEveryTrainer) {
  for (const int gpus : {1, 2}) {
    Daemon daemon(2, kDaemonArgs, SimEnv(gpus), "tests/gpu/gradsyncd_sim");
    ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
    const int root = gpus - 1;
    std::vector<Process> trainers;
    for (int r = 0; r < 2; ++r) {
      trainers.push_back(
          StartSimTrainer(daemon, r, gpus,
                          {"--steps=2", absl::StrCat("--broadcast-root=", root),
                           "--broadcast-memory=device", "--broadcast-sizes=0,1,4099,67108867"}));
    }
    for (int rank = 0; rank < 2; ++rank) {
      const ExitStatus st = trainers[rank].Wait(seconds(120));
      const std::string log = trainers[rank].Log();
      ASSERT_TRUE(st.exited && st.code == 0) << "gpus " << gpus << "\n"
                                             << log << "\ndaemon:\n"
                                             << daemon.process().Log();
      for (const char* when : {"at start", "between steps"}) {
        for (const char* size : {"0", "1", "4099", "67108867"}) {
          EXPECT_NE(
              log.find(absl::StrCat("broadcast ok rank ", rank, " ", when, " device ", size, "\n")),
              std::string::npos)
              << log;
        }
      }
      EXPECT_NE(log.find(absl::StrCat("OK rank ", rank, " world 2 steps 2")), std::string::npos)
          << log;
    }
    // The trainers unmapped the staging before the daemon freed it.
    EXPECT_EQ(daemon.process().Log().find("event=gpu_release_failed"), std::string::npos)
        << daemon.process().Log();
    // Through the device staging, not host memory.
    EXPECT_NE(daemon.process().Log().find(absl::StrCat("event=gpu_broadcast_staging gpus=", gpus,
                                                       " bytes_per_gpu=8388608")),
              std::string::npos)
        << daemon.process().Log();
  }
}

// Host and device broadcasts in turn in one job with CUDA gradients
// (user-pointer gradients, 3 trainers on 2 GPUs): each kind through its own
// staging, every byte the root's.
TEST(GpuPath, HostAndDeviceBroadcastsMixInOneJob) {
  Daemon daemon(3, kDaemonArgs, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 3; ++r) {
    trainers.push_back(StartSimTrainer(daemon, r, 2,
                                       {"--mode=user", "--steps=2", "--broadcast-root=2",
                                        "--broadcast-memory=mix", "--broadcast-sizes=1,5242883"}));
  }
  for (int rank = 0; rank < 3; ++rank) {
    const ExitStatus st = trainers[rank].Wait(seconds(90));
    const std::string log = trainers[rank].Log();
    ASSERT_TRUE(st.exited && st.code == 0) << log << "\ndaemon:\n" << daemon.process().Log();
    for (const char* kind : {"host", "device"}) {
      EXPECT_NE(
          log.find(absl::StrCat("broadcast ok rank ", rank, " between steps ", kind, " 5242883\n")),
          std::string::npos)
          << log;
    }
  }
}

// Device buffers across two nodes of 2 trainers on 2 GPUs each: every
// piece crosses with one ncclBroadcast over the job's 4 NCCL ranks, from
// the root's GPU on either node.
TEST(GpuPath, TwoNodesBroadcastDeviceBuffersFromARootOnEitherNode) {
  for (const int root : {3, 0}) {
    std::vector<std::string> common = kDaemonArgs;
    common.insert(common.end(), {"--num-nodes=2", absl::StrCat("--job-id=gpudevbcast-", root)});
    std::unique_ptr<Daemon> leader, follower;
    ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader, &follower));
    const std::string sizes = root == 3 ? "0,1,4099,67108867" : "1,4099";
    std::vector<Process> trainers;
    for (Daemon* d : {leader.get(), follower.get()}) {
      for (int r = 0; r < 2; ++r) {
        trainers.push_back(
            StartSimTrainer(*d, r, 2,
                            {"--steps=2", absl::StrCat("--broadcast-root=", root),
                             "--broadcast-memory=device", "--broadcast-sizes=" + sizes}));
      }
    }
    for (size_t rank = 0; rank < trainers.size(); ++rank) {
      const ExitStatus st = trainers[rank].Wait(seconds(180));
      const std::string log = trainers[rank].Log();
      ASSERT_TRUE(st.exited && st.code == 0) << "root " << root << "\n"
                                             << log << "\nleader:\n"
                                             << leader->process().Log() << "\nfollower:\n"
                                             << follower->process().Log();
      for (const char* when : {"at start", "between steps"}) {
        EXPECT_NE(log.find(absl::StrCat("broadcast ok rank ", rank, " ", when, " device 4099\n")),
                  std::string::npos)
            << log;
      }
      EXPECT_NE(log.find(absl::StrCat("OK rank ", rank, " world 4 steps 2")), std::string::npos)
          << log;
    }
  }
}

// One trainer broadcasts a host buffer, the other a device buffer of the
// same size: the job fails with MISMATCH naming both and each one's kind.
TEST(GpuPath, HostAndDeviceBuffersInOneBroadcastAreAMismatchNamingBoth) {
  Daemon daemon(2, kDaemonArgs, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(
        StartSimTrainer(daemon, r, 2,
                        {"--steps=1", "--broadcast-root=0", "--broadcast-sizes=4099",
                         r == 0 ? "--broadcast-memory=host" : "--broadcast-memory=device"}));
  }
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(60));
    const std::string log = trainers[r].Log();
    ASSERT_TRUE(st.exited && st.code == 2) << log << "\ndaemon:\n" << daemon.process().Log();
    EXPECT_NE(log.find("error code=3"), std::string::npos) << log;  // MISMATCH
    EXPECT_NE(log.find("trainers called gs_broadcast differently"), std::string::npos) << log;
    EXPECT_NE(log.find("(host memory)"), std::string::npos) << log;
    EXPECT_NE(log.find("(device memory)"), std::string::npos) << log;
  }
}

// The root of a device broadcast dies mid-broadcast (its copy of the first
// piece held on its stream): the others, waiting for that piece, get
// PEER_FAILED naming it, long before the timeout.
TEST(GpuPath, TrainerKilledMidDeviceBroadcastFailsItsPeersNamingIt) {
  Daemon daemon(3, {"--timeout-s=120"}, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> args = {"--steps=2", "--broadcast-root=1", "--broadcast-memory=device",
                                     "--broadcast-sizes=16777216"};
    if (r == 1) args.push_back("--die-in-broadcast");
    trainers.push_back(StartSimTrainer(daemon, r, 2, args));
  }
  const ExitStatus victim = trainers[1].Wait(seconds(60));
  EXPECT_FALSE(victim.exited) << trainers[1].Log();
  EXPECT_EQ(victim.code, SIGKILL);
  EXPECT_NE(trainers[1].Log().find("dying in the broadcast"), std::string::npos)
      << trainers[1].Log();
  for (int r : {0, 2}) {
    const ExitStatus st = trainers[r].Wait(seconds(60));
    const std::string log = trainers[r].Log();
    ASSERT_TRUE(st.exited && st.code == 2) << "trainer " << r << "\n" << log;
    EXPECT_NE(log.find("error code=4"), std::string::npos) << log;  // PEER_FAILED
    EXPECT_NE(log.find(absl::StrCat("rank 1 (local 1, pid ", trainers[1].pid(), ")")),
              std::string::npos)
        << log;
  }
}

// The processes this test binary spawns name their simulated device memory
// and events with its own prefix (tests/testing/sim_segment_prefix.h), so
// what a SIGKILLed daemon and its trainers leave is removed after the last
// test, and nothing lands under the shared default "gssim".
TEST(GpuPath, SegmentsOfASigkilledDaemonAndItsTrainersCarryThisTestBinarysPrefix) {
  Daemon daemon(2, kDaemonArgs, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(StartSimTrainer(
        daemon, r, 2, {"--mode=flat", "--steps=3", "--pause-at-step=1", "--pause-after-marks=1"}));
  }
  for (Process& p : trainers) {
    ASSERT_TRUE(WaitForLog(p, "paused at step", seconds(60)) && WaitStopped(p, seconds(30)))
        << p.Log() << daemon.process().Log();
  }
  const std::vector<pid_t> pids = {daemon.process().pid(), trainers[0].pid(), trainers[1].pid()};
  daemon.process().Signal(SIGKILL);
  for (Process& p : trainers) p.Signal(SIGKILL);
  for (Process* p : {&daemon.process(), &trainers[0], &trainers[1]}) p->Wait(seconds(30));
  for (size_t i = 1; i < pids.size(); ++i) {  // each trainer allocated its gradients
    EXPECT_FALSE(ShmEntriesOfPrefix(absl::StrCat(SimSegmentPrefix(), ".", pids[i])).empty())
        << "trainer pid " << pids[i];
  }
  for (pid_t pid : pids) {
    EXPECT_TRUE(ShmEntriesOfPrefix(absl::StrCat("gssim.", pid)).empty()) << "pid " << pid;
  }
}

// A node dies mid-job (its daemon SIGKILLed): the surviving node's
// collective fails or times out, the group is aborted, and its trainers get
// PEER_FAILED (or TIMEOUT) within the timeout — no hang.
TEST(GpuPath, NodeKilledMidJobFailsTheOtherNodesTrainers) {
  std::vector<std::string> common = {"--timeout-s=10", "--num-nodes=2", "--job-id=gpukill"};
  std::unique_ptr<Daemon> leader_node, follower_node;
  ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader_node, &follower_node));
  Daemon& leader = *leader_node;
  Daemon& follower = *follower_node;
  std::vector<Process> survivors, doomed;
  for (int r = 0; r < 2; ++r) {
    survivors.push_back(StartSimTrainer(leader, r, 2, {"--mode=flat", "--steps=100000"}));
    doomed.push_back(StartSimTrainer(follower, r, 2, {"--mode=flat", "--steps=100000"}));
  }
  ASSERT_TRUE(WaitForLog(leader.process(), "event=job_running", seconds(30)))
      << leader.process().Log();
  // The follower finished iteration 0 and planned the next: the job is mid-run.
  ASSERT_TRUE(WaitForLog(follower.process(), "event=plan_decided", seconds(30)))
      << follower.process().Log();
  follower.process().Signal(SIGKILL);
  for (auto& t : survivors) {
    ExitStatus st = t.Wait(seconds(40));
    const std::string log = t.Log();
    ASSERT_TRUE(st.exited && st.code == 2) << log << "\nleader:\n" << leader.process().Log();
    EXPECT_TRUE(log.find("error code=4") != std::string::npos ||
                log.find("error code=5") != std::string::npos)
        << log;
  }
  for (auto& t : doomed) t.Wait(seconds(40));
}

// An elastic GPU job (docs/DESIGN.md "Elastic jobs"): 3 simulated nodes x
// 2 trainers on 2 GPUs each, fp64 (user-pointer mode in one case, flat
// buffers in the others), --min-nodes 2; node 2 (its daemon and
// its trainers) SIGKILLed in step 2. The survivors abort their
// communicators, re-form as generation 2, create new ones among their 4
// GPUs and redo step 2 from the local sums kept in device memory; every
// survivor ends with GS_OK, each step within 1e-12 of the average over
// that step's members (steps 0-1: all 6 ranks; 2 on: ranks 0-3, which
// gs_get_job_info's world size must say) and with the same weights.
constexpr int kElasticNodes = 3, kElasticStep = 2, kElasticSteps = 5;
constexpr int kAllMarks = 6;   // sim_trainer's tensor count
constexpr int kJoinSteps = 8;  // the joining tests' steps: room for the join

// The flags of a 3-node elastic job (--min-nodes 2) whose first bucket
// holds the 1-element gate alone, with a 10 s timeout.
std::vector<std::string> ElasticJobFlags(const std::string& job) {
  return {"--bucket-cap-mb=0.004", "--first-bucket-cap-mb=0.000001",
          "--timeout-s=10",        "--num-nodes=3",
          "--min-nodes=2",         "--job-id=" + job};
}

// sim_trainer in `mode` (flat, user), fp64, marking in order, each step
// from `from` on checked against the average over `members`' ranks.
std::vector<std::string> InOrderElasticArgs(const std::string& mode, int from,
                                            const std::string& members) {
  return {"--mode=" + mode,
          "--dtype=fp64",
          "--in-order",
          absl::StrCat("--steps=", kElasticSteps),
          absl::StrCat("--members-from-step=", from),
          "--members=" + members};
}

// Where node 2 dies. kBackward: every trainer marked the first gradient
// (its bucket, the 1-element gate alone, may be averaged over 6 already). kVictimInCollective: node
// 2's trainers marked everything, so its daemon waits inside the second bucket's collective for the
// others, which marked only the first gradient. kSurvivorsInCollective: the survivors marked
// everything and node 2 the first gradient, so the survivors averaged the first bucket over 6,
// wrote it back and wait inside the next bucket's collective: the redo must come from the kept sums
// (summing their memory again would be off).
enum class ElasticStage { kBackward, kVictimInCollective, kSurvivorsInCollective };

int MarksBeforePause(ElasticStage stage, bool victim) {
  switch (stage) {
    case ElasticStage::kBackward:
      return 1;
    case ElasticStage::kVictimInCollective:
      return victim ? kAllMarks : 1;
    case ElasticStage::kSurvivorsInCollective:
      return victim ? 1 : kAllMarks;
  }
  return 0;
}

// Simulated node `n` (2 GPUs, `local_size` trainers) of a job whose
// leader, node 0, listens on `leader_port` (unused for node 0 itself);
// appended to `nodes`. `common` holds the job's flags and token file.
void StartSimNode(int n, int local_size, int leader_port, std::vector<std::string> args,
                  const std::map<std::string, std::string>& extra_env,
                  std::vector<std::unique_ptr<Daemon>>* nodes) {
  args.push_back(absl::StrCat("--node-rank=", n));
  if (n > 0) args.push_back(absl::StrCat("--leader=127.0.0.1:", leader_port));
  std::map<std::string, std::string> env = SimEnv(2);
  env["NCCL_HOSTID"] = absl::StrCat("sim-node-", n);  // one host per node
  env.insert(extra_env.begin(), extra_env.end());
  nodes->push_back(std::make_unique<Daemon>(local_size, args, env, "tests/gpu/gradsyncd_sim"));
  ASSERT_TRUE(nodes->back()->WaitReady(seconds(10))) << nodes->back()->process().Log();
}

// The job's shared token file, its path appended to `common`.
void AddTokenFile(const ScratchDir& secrets, std::vector<std::string>* common) {
  ASSERT_TRUE(WriteTokenFile(secrets.File("token"), "gpu-path-token"));
  common->push_back("--job-token-file=" + secrets.File("token"));
}

// kElasticNodes simulated nodes (node 0 leads), `local_sizes[n]` trainers
// on node n, `survivors_env` added to nodes 0 and 1 (`node_env[n]` to node
// n); fatal failures end the test.
void StartSimNodes(std::vector<std::string> common, std::vector<std::unique_ptr<Daemon>>* nodes,
                   const std::vector<int>& local_sizes = {2, 2, 2},
                   const std::map<std::string, std::string>& survivors_env = {},
                   const std::map<int, std::vector<std::string>>& node_args = {},
                   const std::map<int, std::map<std::string, std::string>>& node_env = {}) {
  ScratchDir secrets;
  ASSERT_NO_FATAL_FAILURE(AddTokenFile(secrets, &common));
  int port = 0;
  for (int n = 0; n < kElasticNodes; ++n) {
    std::vector<std::string> args = common;
    if (const auto own = node_args.find(n); own != node_args.end()) {
      args.insert(args.end(), own->second.begin(), own->second.end());  // the last one wins
    }
    std::map<std::string, std::string> env =
        n < 2 ? survivors_env : std::map<std::string, std::string>{};
    if (const auto own = node_env.find(n); own != node_env.end()) {
      env.insert(own->second.begin(), own->second.end());
    }
    ASSERT_NO_FATAL_FAILURE(StartSimNode(n, local_sizes[n], port, args, env, nodes));
    if (n == 0) {
      port = nodes->back()->ListenPort(seconds(10));
      ASSERT_GT(port, 0) << nodes->back()->process().Log();
    }
  }
}

std::string Logs(const std::vector<std::unique_ptr<Daemon>>& nodes) {
  std::string out;
  for (size_t n = 0; n < nodes.size(); ++n) {
    out += absl::StrCat("\nnode ", n, ":\n", nodes[n]->process().Log());
  }
  return out;
}

struct ElasticRun {
  int node;
  Process process;
};

// Every trainer not on `gone_node` ends with GS_OK (each step checked
// against its members' average by sim_trainer) and the same weights.
void ExpectSurvivorsEndAlike(std::vector<ElasticRun>& runs,
                             const std::vector<std::unique_ptr<Daemon>>& nodes, int gone_node) {
  std::string weights;
  for (ElasticRun& run : runs) {
    if (run.node == gone_node) continue;
    const ExitStatus st = run.process.Wait(seconds(60));
    const std::string log = run.process.Log();
    ASSERT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << log << Logs(nodes);
    EXPECT_NE(log.find("OK rank"), std::string::npos) << log;
    const size_t at = log.find("weights ");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string mine = log.substr(at, log.find('\n', at) - at);
    if (weights.empty()) weights = mine;
    EXPECT_EQ(mine, weights) << "node " << run.node << " ended with other weights";
  }
}

// `sigterm`: node 2's daemon is stopped with SIGTERM instead (its trainers
// resume and get the shutdown error): it leaves the job, and the survivors
// count it out without waiting for its silence.
void RunUntilNodeTwoGoesAndExpectSurvivorsFinish(ElasticStage stage, bool sigterm) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartSimNodes(
      {"--bucket-cap-mb=0.004", "--first-bucket-cap-mb=0.000001", "--timeout-s=10",
       "--stall-threshold-s=1", "--num-nodes=3", "--min-nodes=2", "--job-id=gpuelastic"},
      &nodes));
  std::vector<ElasticRun> runs;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      const int marks = MarksBeforePause(stage, n == 2);
      // Both registration modes: the trainers' own allocations there.
      const std::string mode =
          stage == ElasticStage::kVictimInCollective ? "--mode=user" : "--mode=flat";
      runs.push_back(
          {n, StartSimTrainer(
                  *nodes[n], r, 2,
                  {mode, "--dtype=fp64", "--in-order", absl::StrCat("--steps=", kElasticSteps),
                   absl::StrCat("--pause-at-step=", kElasticStep),
                   absl::StrCat("--pause-after-marks=", marks),
                   absl::StrCat("--members-from-step=", kElasticStep), "--members=0,1,2,3"})});
    }
  }
  for (ElasticRun& run : runs) {
    ASSERT_TRUE(
        WaitForLog(run.process, absl::StrCat("paused at step ", kElasticStep), seconds(60)) &&
        WaitStopped(run.process, seconds(30)))
        << run.process.Log() << Logs(nodes);
  }
  // Only a daemon still waiting for its paused trainers reports a stall:
  // the other side then waits inside a collective.
  if (stage == ElasticStage::kVictimInCollective) {
    ASSERT_TRUE(WaitForLog(nodes[0]->process(), "event=stall", seconds(30))) << Logs(nodes);
  } else if (stage == ElasticStage::kSurvivorsInCollective) {
    ASSERT_TRUE(WaitForLog(nodes[2]->process(), "event=stall", seconds(30))) << Logs(nodes);
  }
  const auto killed_at = std::chrono::steady_clock::now();
  nodes[2]->process().Signal(sigterm ? SIGTERM : SIGKILL);
  if (sigterm) {
    // Resumed earlier, the trainers could finish the step before the
    // daemon's shutdown reached its job.
    ASSERT_TRUE(
        WaitForLog(nodes[2]->process(), "event=job_failed job=1 code=UNAVAILABLE", seconds(30)))
        << Logs(nodes);
  }
  for (ElasticRun& run : runs) {
    if (run.node == 2) run.process.Signal(sigterm ? SIGCONT : SIGKILL);
  }
  for (ElasticRun& run : runs) {
    if (run.node != 2) run.process.Signal(SIGCONT);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/2));
  // Detection (the 2 s of silence that prove a death), re-formation, the
  // redone step and the 2 after it; for the record, not a bound.
  std::printf("gpu_elastic: the survivors finished %.1f s after the kill\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
  for (int n = 0; n < 2; ++n) {
    const std::string log = nodes[n]->process().Log();
    EXPECT_NE(log.find("event=gpu_session_reformed generation=2 gpus=2"), std::string::npos) << log;
    EXPECT_NE(log.find(absl::StrCat("first_rank=", 2 * n, " nranks=4")), std::string::npos) << log;
    EXPECT_NE(log.find(absl::StrCat("event=iteration_redo iteration=", kElasticStep,
                                    " world_size=4 nodes=2")),
              std::string::npos)
        << log;
    if (stage == ElasticStage::kSurvivorsInCollective) {
      // The first bucket was written back before the death: kept.
      EXPECT_EQ(log.find("kept_buckets=0"), std::string::npos) << log;
    }
  }
  for (ElasticRun& run : runs) {
    if (run.node != 2) continue;
    const ExitStatus st = run.process.Wait(seconds(sigterm ? 60 : 10));
    if (!sigterm) continue;
    const std::string log = run.process.Log();
    EXPECT_TRUE(st.exited && st.code != 0) << st.ToString() << "\n" << log;
    EXPECT_NE(log.find("gradsyncd is shutting down (SIGTERM)"), std::string::npos) << log;
  }
  for (int n = 0; sigterm && n < 2; ++n) {
    const std::string log = nodes[n]->process().Log();
    EXPECT_NE(log.find("event=node_departed generation=1 node_rank=2"), std::string::npos) << log;
    EXPECT_EQ(log.find("event=node_presumed_dead"), std::string::npos) << log;
  }
}

class GpuElasticTest : public ::testing::TestWithParam<ElasticStage> {};

TEST_P(GpuElasticTest, SurvivorsOfAKilledNodeRedoTheStepOverTheirTrainersAndFinish) {
  RunUntilNodeTwoGoesAndExpectSurvivorsFinish(GetParam(), /*sigterm=*/false);
}

TEST(GpuElasticJob, ANodeStoppedWithSigtermLeavesAndTheSurvivorsRedoTheStepWithoutIt) {
  RunUntilNodeTwoGoesAndExpectSurvivorsFinish(ElasticStage::kBackward, /*sigterm=*/true);
}

INSTANTIATE_TEST_SUITE_P(Sim, GpuElasticTest,
                         ::testing::Values(ElasticStage::kBackward,
                                           ElasticStage::kVictimInCollective,
                                           ElasticStage::kSurvivorsInCollective),
                         [](const ::testing::TestParamInfo<ElasticStage>& info) {
                           switch (info.param) {
                             case ElasticStage::kBackward:
                               return "mid_backward";
                             case ElasticStage::kVictimInCollective:
                               return "victim_mid_collective";
                             case ElasticStage::kSurvivorsInCollective:
                               return "survivors_mid_collective";
                           }
                           return "unknown";
                         });

// Node 2 dies inside step 2's last collective after node 0 completed the
// step and before node 1 did: node 1's daemon is given the test hook that
// withholds the last bucket's result (all-ones bytes, a NaN, written over
// it in its trainers' GPU memory; its collective fails) until node 2 is
// dead and reaped. The survivors stopped one step apart; they form the next
// generation anyway, node 0 broadcasts step 2's result, kept in its device
// memory, over the new communicators, node 1 writes it into its trainers'
// gradients and completes step 2 with its divisor (6, as node 0's trainers
// got it), and both train on over ranks 0-3: every survivor ends GS_OK,
// each step within 1e-12 of its members' average (fp64; steps 0-2 over all
// 6), with the same weights. Both registration modes (flat buffers, the
// trainers' own allocations).
class GpuSplitIterationTest : public ::testing::TestWithParam<std::string> {};

constexpr int kSplitStep = 2;

TEST_P(GpuSplitIterationTest,
       ANodeKilledInTheLastCollectiveAfterOneSurvivorCompletedItIsCommitted) {
  ScratchDir scratch;
  const std::string release = scratch.File("release");
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(
      StartSimNodes(ElasticJobFlags("gpu-split-commit"), &nodes, {2, 2, 2}, {}, {},
                    {{1,
                      {{"GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_AT", absl::StrCat(kSplitStep)},
                       {"GRADSYNC_TEST_WITHHOLD_FINAL_RESULT_UNTIL", release}}}}));
  std::vector<ElasticRun> runs;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = InOrderElasticArgs(GetParam(), kSplitStep + 1, "0,1,2,3");
      if (n == 0) {
        // Held once step 2 completed on node 0: proof that it is past it.
        args.push_back(absl::StrCat("--pause-at-step=", kSplitStep + 1));
        args.push_back("--pause-after-marks=0");
      }
      runs.push_back({n, StartSimTrainer(*nodes[n], r, 2, args)});
    }
  }
  ASSERT_TRUE(WaitForLog(nodes[1]->process(),
                         absl::StrCat("event=test_final_result_withheld iteration=", kSplitStep),
                         seconds(60)))
      << Logs(nodes);
  for (ElasticRun& run : runs) {
    if (run.node != 0) continue;
    ASSERT_TRUE(
        WaitForLog(run.process, absl::StrCat("paused at step ", kSplitStep + 1), seconds(60)) &&
        WaitStopped(run.process, seconds(30)))
        << run.process.Log() << Logs(nodes);
  }
  const auto killed_at = std::chrono::steady_clock::now();
  nodes[2]->process().Signal(SIGKILL);
  for (ElasticRun& run : runs) {
    if (run.node == 2) run.process.Signal(SIGKILL);
  }
  nodes[2]->process().Wait(seconds(30));
  std::FILE* go = std::fopen(release.c_str(), "w");  // node 1's collective fails now
  ASSERT_NE(go, nullptr) << release;
  std::fclose(go);
  for (ElasticRun& run : runs) {
    if (run.node == 0) run.process.Signal(SIGCONT);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/2));
  // Detection, re-formation, the commit and the steps after it; for the
  // record, not a bound.
  std::printf("gpu_split_iteration %s: the survivors finished %.1f s after the kill\n",
              GetParam().c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count());
  const std::string node0 = nodes[0]->process().Log(), node1 = nodes[1]->process().Log();
  EXPECT_NE(node0.find(absl::StrCat("event=split_iteration_commit iteration=", kSplitStep,
                                    " from_node_rank=0")),
            std::string::npos)
      << Logs(nodes);
  EXPECT_NE(node1.find(absl::StrCat("event=split_iteration_committed iteration=", kSplitStep,
                                    " divisor=6")),
            std::string::npos)
      << Logs(nodes);
  for (const std::string* log : {&node0, &node1}) {
    EXPECT_NE(log->find("event=gpu_session_reformed generation=2 gpus=2"), std::string::npos)
        << *log;
  }
  for (ElasticRun& run : runs) {
    if (run.node == 2) run.process.Wait(seconds(10));
  }
}

INSTANTIATE_TEST_SUITE_P(Sim, GpuSplitIterationTest, ::testing::Values("flat", "user"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Nodes 1 and 2 SIGKILLed mid-backward: one node is left, below
// --min-nodes 2, and its trainers fail with PEER_FAILED naming the flag and
// both dead nodes (the leader's verdict, as on the CPU path).
TEST(GpuElasticJob, BelowMinNodesTheSurvivorFailsNamingMinNodesAndTheDeadNodes) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartSimNodes(
      {"--timeout-s=10", "--num-nodes=3", "--min-nodes=2", "--job-id=gpubelowmin"}, &nodes));
  std::vector<std::vector<Process>> trainers(kElasticNodes);
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      trainers[n].push_back(StartSimTrainer(
          *nodes[n], r, 2,
          {"--mode=flat", "--steps=5", absl::StrCat("--pause-at-step=", kElasticStep),
           "--pause-after-marks=1"}));
    }
  }
  for (auto& on_node : trainers) {
    for (Process& p : on_node) {
      ASSERT_TRUE(WaitForLog(p, "paused at step", seconds(60)) && WaitStopped(p, seconds(30)))
          << p.Log() << Logs(nodes);
    }
  }
  for (int n : {1, 2}) {
    nodes[n]->process().Signal(SIGKILL);
    for (Process& p : trainers[n]) p.Signal(SIGKILL);
  }
  for (Process& p : trainers[0]) p.Signal(SIGCONT);
  for (Process& p : trainers[0]) {
    const ExitStatus st = p.Wait(seconds(60));
    const std::string log = p.Log();
    ASSERT_TRUE(st.exited && st.code == 2) << st.ToString() << "\n" << log << Logs(nodes);
    for (const char* needle : {"error code=4", "--min-nodes=2", "node_rank=1", "node_rank=2"}) {
      EXPECT_NE(log.find(needle), std::string::npos) << needle << " in " << log;
    }
  }
  EXPECT_TRUE(nodes[0]->process().Running()) << Logs(nodes);
  for (int n : {1, 2}) {
    for (Process& p : trainers[n]) p.Wait(seconds(10));
  }
}

// The survivors of node `gone` (generation 1's node_rank) re-formed as
// generation 2 on their 2 GPUs each and redid step kElasticStep over 4 ranks.
void ExpectSurvivorsReformedWithout(const std::vector<std::unique_ptr<Daemon>>& nodes, int gone) {
  for (int n = 0; n < kElasticNodes; ++n) {
    if (n == gone) continue;
    const std::string log = nodes[n]->process().Log();
    for (const std::string& needle :
         {absl::StrCat("event=node_departed generation=1 node_rank=", gone),
          std::string("event=gpu_session_reformed generation=2 gpus=2"),
          absl::StrCat("event=iteration_redo iteration=", kElasticStep, " world_size=4 nodes=2")}) {
      EXPECT_NE(log.find(needle), std::string::npos) << needle << " on node " << n << Logs(nodes);
    }
    EXPECT_EQ(log.find("event=node_presumed_dead"), std::string::npos) << log;
  }
}

// A GPU trainer that dies mid-backward leaves its node in the elastic job,
// as on the CPU path: rank 3 (node 1, local rank 1) marks in order and, in
// step 2, once its first marked tensor holds the average over all 6 (its
// bucket summed and written back), SIGKILLs itself after 2 of its 6 marks.
// Node 1 counts it out mid-iteration, writes rank 2's input of the buckets
// summed so far back from the device copy its sum kept (over the average
// the write-back left there: the flat buffer or the trainer's own
// allocations), and every node redoes step 2 over the other 5 (nodes 0
// and 2 from their kept sums). All 5 end with GS_OK and the same weights,
// each step within 1e-12 of its members' average (fp64): all 6 before
// step 2, the 5 from step 2 on. Nobody re-forms, departs or fails.
class GpuMidBackwardDeathTest : public ::testing::TestWithParam<std::string> {};  // --mode

TEST_P(GpuMidBackwardDeathTest, LeavesItsNodeInAndEveryNodeRedoesTheIterationWithoutIt) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartSimNodes(ElasticJobFlags("gpumidbackward"), &nodes));
  std::vector<ElasticRun> runs;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = InOrderElasticArgs(GetParam(), kElasticStep, "0,1,2,4,5");
      if (n == 1 && r == 1) {
        args.insert(args.end(), {absl::StrCat("--die-at-step=", kElasticStep),
                                 "--die-after-marks=2", "--die-once-averaged"});
      }
      runs.push_back({n, StartSimTrainer(*nodes[n], r, 2, args)});
    }
  }
  Process victim = std::move(runs[3].process);
  runs.erase(runs.begin() + 3);
  const ExitStatus died = victim.Wait(seconds(60));
  EXPECT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim.Log();
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/-1));
  const std::string node1 = nodes[1]->process().Log();
  EXPECT_NE(node1.find(absl::StrCat("event=trainer_lost_mid_iteration iteration=", kElasticStep,
                                    " trainer=\"rank 3 (local 1, pid ", victim.pid(),
                                    ")\" marked=2/", kAllMarks)),
            std::string::npos)
      << Logs(nodes);
  const std::string restored =
      absl::StrCat("event=trainer_inputs_restored iteration=", kElasticStep, " buckets=");
  const size_t at = node1.find(restored);
  ASSERT_NE(at, std::string::npos) << restored << Logs(nodes);
  EXPECT_GE(std::atoi(node1.c_str() + at + restored.size()), 1) << Logs(nodes);
  for (int n = 0; n < kElasticNodes; ++n) {
    const std::string log = nodes[n]->process().Log();
    EXPECT_NE(log.find(absl::StrCat("event=iteration_redo_for_lost_trainer iteration=",
                                    kElasticStep, " nodes_that_lost_one=1")),
              std::string::npos)
        << "node " << n << Logs(nodes);
    for (const char* needle : {"event=job_reformed", "event=node_departed", "event=job_failed"}) {
      EXPECT_EQ(log.find(needle), std::string::npos) << needle << " on node " << n << Logs(nodes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sim, GpuMidBackwardDeathTest, ::testing::Values("flat", "user"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// A GPU trainer's death before its first or after its last mark of an
// iteration leaves its node in the elastic job, as on the CPU path: rank 3
// (node 1, local rank 1, alone on its node's second GPU) SIGKILLs itself in
// step 2 before marking anything, or after marking everything with its
// stream drained (then with the trainers' own allocations: user pointers).
// Node 1 counts it out (event=trainer_departed ... marked=0/6 or 6/6);
// the per-iteration agreement divides by the 5 trainers left from step 2
// (before) or step 3 (after) on, and node 1's second GPU, with no active
// trainer, adds zeros to the collective. Nobody re-forms: the five others,
// rank 2 too, end with GS_OK, each step within 1e-12 of its members'
// average (fp64), and the same weights bit for bit. The others are held
// at the start of step 2 until node 1 counted the death, so that it comes
// in step 2 whatever the machine's speed.
// 3 nodes x 2 trainers on 2 simulated GPUs each (fp64): rank 3 (node 1,
// local rank 1) SIGKILLs itself in step 2 after `marks` marks, with
// `victim_args` too; the others are held at the start of step 2 until node
// 1 logged the death (`event=trainer_departed iteration=2 ... marked=K/6`),
// then resumed. Each checks its steps against `members` from step `from`.
void RunUntilRankThreeDiesInStepTwo(const std::string& job, int marks,
                                    const std::vector<std::string>& victim_args, int from,
                                    const std::string& members,
                                    std::vector<std::unique_ptr<Daemon>>* nodes,
                                    std::vector<ElasticRun>* runs, Process* victim) {
  ASSERT_NO_FATAL_FAILURE(StartSimNodes(ElasticJobFlags(job), nodes));
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = {marks == 0 ? "--mode=flat" : "--mode=user", "--dtype=fp64",
                                       absl::StrCat("--steps=", kElasticSteps),
                                       absl::StrCat("--members-from-step=", from),
                                       "--members=" + members};
      if (n == 1 && r == 1) {
        args.insert(args.end(), {absl::StrCat("--die-at-step=", kElasticStep),
                                 absl::StrCat("--die-after-marks=", marks)});
        args.insert(args.end(), victim_args.begin(), victim_args.end());
      } else {
        // Held until node 1 counted the death, so that it does in step 2.
        args.insert(args.end(),
                    {absl::StrCat("--pause-at-step=", kElasticStep), "--pause-after-marks=0"});
      }
      runs->push_back({n, StartSimTrainer(*(*nodes)[n], r, 2, args)});
    }
  }
  *victim = std::move((*runs)[3].process);
  runs->erase(runs->begin() + 3);
  const ExitStatus died = victim->Wait(seconds(60));
  EXPECT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim->Log();
  const std::string departed = absl::StrCat("event=trainer_departed iteration=", kElasticStep,
                                            " trainer=\"rank 3 (local 1, pid ", victim->pid(),
                                            ")\" marked=", marks, "/", kAllMarks);
  ASSERT_TRUE(WaitForLog((*nodes)[1]->process(), departed, seconds(30)))
      << departed << Logs(*nodes);
  for (ElasticRun& run : *runs) {
    ASSERT_TRUE(WaitStopped(run.process, seconds(30))) << run.process.Log() << Logs(*nodes);
    run.process.Signal(SIGCONT);
  }
}

class GpuTrainerDeathTest : public ::testing::TestWithParam<int> {};  // its marks of step 2

TEST_P(GpuTrainerDeathTest, ATrainerDeadBeforeItsFirstOrAfterItsLastMarkLeavesItsNodeIn) {
  const int marks = GetParam();
  std::vector<std::unique_ptr<Daemon>> nodes;
  std::vector<ElasticRun> runs;
  Process victim;
  ASSERT_NO_FATAL_FAILURE(RunUntilRankThreeDiesInStepTwo(
      "gputrainerstays", marks, {}, marks == 0 ? kElasticStep : kElasticStep + 1, "0,1,2,4,5",
      &nodes, &runs, &victim));
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/-1));
  for (int n = 0; n < kElasticNodes; ++n) {
    const std::string log = nodes[n]->process().Log();
    for (const char* needle : {"event=job_reformed", "event=node_departed", "event=job_failed"}) {
      EXPECT_EQ(log.find(needle), std::string::npos) << needle << " on node " << n << Logs(nodes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sim, GpuTrainerDeathTest, ::testing::Values(0, kAllMarks),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 0 ? "before_first_mark" : "after_last_mark";
                         });

// A restarted GPU trainer rejoins its node (docs/DESIGN.md "Elastic jobs"):
// 3 nodes x 2 trainers on 2 simulated GPUs each (fp64, --min-nodes 2,
// every trainer --catch-up); the victim SIGKILLs itself in step 2, before
// its first mark or after its last (its stream drained), while the others
// are held at the start of step 2. Once its node counted it out, a
// replacement with its local rank starts there and, once that node's
// scheduler holds its request, the others go on over the five. The first
// agreement that finds the local rank counted out announces it; at the
// boundary after that iteration its node opens its CUDA memory (flat: the
// dead trainer's daemon-owned buffer again; user: its own allocations, the
// dead one's closed) and events in the victim's place, and it starts at m
// with the victim's rank, world size 6 and the catch-up root's state (the
// lowest rank alive, 1 when rank 0 died) by gs_broadcast of device memory,
// within 1e-12 of the reference up to m. Every step is within 1e-12 of its
// members' average (all 6; the five from the first step without the
// victim; all 6 again from m) and all six end with the same weights bit
// for bit; nobody re-forms or fails. Mid-backward (after 2 marks, once its
// first marked tensor was averaged; all mark in order): every node redoes
// step 2 without it and the others are held at the start of step 3.
struct RejoinCase {
  std::string name;
  std::string mode;  // sim_trainer --mode
  int victim;        // its rank: node victim / 2, local rank victim % 2
  int marks;         // its marks of step 2 before it dies: 0 or kAllMarks
};

void PrintTo(const RejoinCase& c, std::ostream* os) { *os << c.name; }

// The trainers' flags: the victim is out from step 2 (dead before its
// first mark) or 3 (its step 2 counted), back from the join.
std::vector<std::string> RejoinTrainerArgs(const RejoinCase& c) {
  std::vector<std::string> five;
  for (int r = 0; r < 6; ++r) {
    if (r != c.victim) five.push_back(std::to_string(r));
  }
  return {
      "--mode=" + c.mode,
      "--dtype=fp64",
      absl::StrCat("--steps=", kJoinSteps),
      "--catch-up",
      absl::StrCat("--members-from-step=", c.marks == kAllMarks ? kElasticStep + 1 : kElasticStep),
      "--members=" + absl::StrJoin(five, ","),
      "--members-after-join=0,1,2,3,4,5"};
}

// Starts the job, lets the victim die in step 2 with the others held at
// its start; returns once the victim's node counted it out and the others
// are stopped (`runs` without the victim).
void RunUntilTheVictimDiedAndTheOthersWait(const std::string& job, const RejoinCase& c,
                                           std::vector<std::unique_ptr<Daemon>>* nodes,
                                           std::vector<ElasticRun>* runs) {
  const bool mid = c.marks > 0 && c.marks < kAllMarks;
  ASSERT_NO_FATAL_FAILURE(StartSimNodes(ElasticJobFlags(job), nodes));
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = RejoinTrainerArgs(c);
      // Mid-backward: everyone marks in the same order, so that the
      // victim's first mark is in the first bucket.
      if (mid) args.push_back("--in-order");
      if (2 * n + r == c.victim) {
        args.insert(args.end(), {absl::StrCat("--die-at-step=", kElasticStep),
                                 absl::StrCat("--die-after-marks=", c.marks)});
        // Mid-backward: once part of step 2 was averaged with it.
        if (mid) args.push_back("--die-once-averaged");
      } else {
        // Mid-backward: they finish step 2's redo first.
        args.insert(args.end(), {absl::StrCat("--pause-at-step=", kElasticStep + (mid ? 1 : 0)),
                                 "--pause-after-marks=0"});
      }
      runs->push_back({n, StartSimTrainer(*(*nodes)[n], r, 2, args)});
    }
  }
  Process victim = std::move((*runs)[c.victim].process);
  runs->erase(runs->begin() + c.victim);
  const ExitStatus died = victim.Wait(seconds(60));
  ASSERT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim.Log();
  const std::string departed = absl::StrCat(
      "event=trainer_departed iteration=", kElasticStep, " trainer=\"rank ", c.victim, " (local ",
      c.victim % 2, ", pid ", victim.pid(), ")\" marked=", c.marks, "/", kAllMarks);
  ASSERT_TRUE(WaitForLog((*nodes)[c.victim / 2]->process(), departed, seconds(30)))
      << departed << Logs(*nodes);
  for (ElasticRun& run : *runs) {
    ASSERT_TRUE(WaitStopped(run.process, seconds(30))) << run.process.Log() << Logs(*nodes);
  }
}

class GpuTrainerRejoinTest : public ::testing::TestWithParam<RejoinCase> {};

TEST_P(GpuTrainerRejoinTest, ARestartedTrainerRejoinsItsNodeCatchesUpAndTrainsOverAllAgain) {
  const RejoinCase& c = GetParam();
  const int node = c.victim / 2, root = c.victim == 0 ? 1 : 0;
  std::vector<std::unique_ptr<Daemon>> nodes;
  std::vector<ElasticRun> runs;
  ASSERT_NO_FATAL_FAILURE(
      RunUntilTheVictimDiedAndTheOthersWait("gpurejoin" + c.name, c, &nodes, &runs));
  runs.push_back({node, StartSimTrainer(*nodes[node], c.victim % 2, 2, RejoinTrainerArgs(c))});
  Process& fresh = runs.back().process;
  ASSERT_TRUE(WaitForLog(nodes[node]->process(), "event=trainer_rejoin_pending", seconds(30)))
      << fresh.Log() << Logs(nodes);
  for (size_t i = 0; i + 1 < runs.size(); ++i) runs[i].process.Signal(SIGCONT);
  const std::string joined = "joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog(fresh, joined, seconds(60))) << fresh.Log() << Logs(nodes);
  const std::string log = fresh.Log();
  const int m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(m, c.marks == 0 ? kElasticStep : kElasticStep + 1);
  if (c.marks > 0 && c.marks < kAllMarks) {
    EXPECT_NE(nodes[node]->process().Log().find(
                  absl::StrCat("event=iteration_redo_for_lost_trainer iteration=", kElasticStep)),
              std::string::npos)
        << Logs(nodes);
  }
  ASSERT_LT(m, kJoinSteps) << "the others finished before the replacement rejoined";
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/-1));
  EXPECT_NE(log.find(absl::StrCat(joined, m, ": state from rank ", root, ", world size 6, rank ",
                                  c.victim, "\n")),
            std::string::npos)
      << log;
  for (size_t i = 0; i + 1 < runs.size(); ++i) {
    const std::string needle =
        absl::StrCat("trainers joined after iteration ", m, ": state sent from rank ", root, "\n");
    EXPECT_NE(runs[i].process.Log().find(needle), std::string::npos)
        << needle << " in " << runs[i].process.Log();
  }
  const std::string daemon = nodes[node]->process().Log();
  for (const std::string& needle :
       {absl::StrCat("event=gpu_trainer_replaced trainer=\"rank ", c.victim, " (local ",
                     c.victim % 2, ", pid ", fresh.pid(), ")\""),
        absl::StrCat("event=trainer_rejoined iteration=", m)}) {
    EXPECT_NE(daemon.find(needle), std::string::npos) << needle << Logs(nodes);
  }
  for (int n = 0; n < kElasticNodes; ++n) {
    const std::string other = nodes[n]->process().Log();
    for (const char* needle : {"event=job_reformed", "event=node_departed", "event=job_failed",
                               "event=trainer_rejoin_refused"}) {
      EXPECT_EQ(other.find(needle), std::string::npos) << needle << " on node " << n << Logs(nodes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sim, GpuTrainerRejoinTest,
    ::testing::Values(RejoinCase{"flat_rank3_before_first_mark", "flat", 3, 0},
                      RejoinCase{"user_rank3_before_first_mark", "user", 3, 0},
                      RejoinCase{"flat_rank0_after_last_mark", "flat", 0, kAllMarks},
                      RejoinCase{"user_rank3_mid_backward", "user", 3, 2}),
    [](const ::testing::TestParamInfo<RejoinCase>& info) { return info.param.name; });

// A restarted trainer on another GPU than its predecessor's cannot take its
// place (the job's NCCL ranks are per GPU): its gs_register fails at once
// with INVALID_ARGUMENT naming it and both GPUs, and the job trains on
// without it.
TEST(GpuElasticJob, ARestartedTrainerOnAnotherGpuIsRefusedNamingBothAndTheJobTrainsOn) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  std::vector<ElasticRun> runs;
  const RejoinCase c{"wronggpu", "flat", 3, 0};
  ASSERT_NO_FATAL_FAILURE(
      RunUntilTheVictimDiedAndTheOthersWait("gpurejoinwronggpu", c, &nodes, &runs));
  std::vector<std::string> args = RejoinTrainerArgs(c);
  args.push_back("--device=0");  // its predecessor trained on the node's second GPU
  Process fresh = StartSimTrainer(*nodes[1], 1, 2, args);
  const ExitStatus st = fresh.Wait(seconds(30));
  const std::string log = fresh.Log();
  ASSERT_TRUE(st.exited && st.code == 2) << st.ToString() << "\n" << log << Logs(nodes);
  for (const std::string& needle :
       {std::string("error code=1"), absl::StrCat("rank 3 (local 1, pid ", fresh.pid(), ")"),
        std::string("registered CUDA tensors on GPU "),
        std::string("but its local rank trained on GPU "),
        std::string("rejoins on its predecessor's GPU")}) {
    EXPECT_NE(log.find(needle), std::string::npos) << needle << " in " << log << Logs(nodes);
  }
  for (ElasticRun& run : runs) run.process.Signal(SIGCONT);
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/-1));
  for (int n = 0; n < kElasticNodes; ++n) {
    const std::string daemon = nodes[n]->process().Log();
    for (const char* needle :
         {"event=job_reformed", "event=job_failed", "event=trainer_rejoined"}) {
      EXPECT_EQ(daemon.find(needle), std::string::npos)
          << needle << " on node " << n << Logs(nodes);
    }
  }
}

// "After its last mark" counts a GPU trainer's gradients only if the work
// it queued before its marks completed: rank 3 marks all 6 gradients of
// step 2 with its stream held (its writes never run) and dies. Node 1 counts
// it as marked=6/6, then its reduction finds the dead trainer's readiness
// events failed, so node 1 leaves the job instead: rank 2 fails with
// PEER_FAILED naming rank 3 and its incomplete work, and nodes 0 and 2
// re-form and redo step 2 over ranks 0, 1, 4, 5, each step within 1e-12 of
// its members' average.
TEST(GpuElasticJob, ATrainerDeadAfterItsLastMarkWhoseWorkNeverRanTakesItsNodeOut) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  std::vector<ElasticRun> runs;
  Process victim;
  ASSERT_NO_FATAL_FAILURE(RunUntilRankThreeDiesInStepTwo("gpuundrained", kAllMarks,
                                                         {"--die-with-stream-held"}, kElasticStep,
                                                         "0,1,4,5", &nodes, &runs, &victim));
  Process other = std::move(runs[2].process);  // rank 2, node 1
  runs.erase(runs.begin() + 2);
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/1));
  const ExitStatus st = other.Wait(seconds(30));
  const std::string log = other.Log();
  ASSERT_TRUE(st.exited && st.code == 2) << st.ToString() << "\n" << log << Logs(nodes);
  for (const std::string& needle :
       {std::string("error code=4"),
        absl::StrCat("rank 3 (local 1, pid ", victim.pid(), ") died in iteration ", kElasticStep,
                     " after marking all 6 gradients, but the GPU work it queued before its "
                     "marks did not complete"),
        std::string("so its node leaves the job")}) {
    EXPECT_NE(log.find(needle), std::string::npos) << needle << " in " << log << Logs(nodes);
  }
  ExpectSurvivorsReformedWithout(nodes, /*gone=*/1);
  EXPECT_TRUE(nodes[1]->process().Running()) << Logs(nodes);
}

// A node's last trainer dying takes the node out on the GPU path too: node
// 2 runs one trainer (rank 4), which SIGKILLs itself after 2 marks of step
// 2; its daemon lives on, and nodes 0 and 1 redo step 2 over ranks 0-3.
TEST(GpuElasticJob, ANodesOnlyTrainerKilledTakesItsNodeOutAndTheOthersRedoTheStep) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartSimNodes(ElasticJobFlags("gpulasttrainer"), &nodes, {2, 2, 1}));
  std::vector<ElasticRun> runs;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < (n == 2 ? 1 : 2); ++r) {
      std::vector<std::string> args = {
          "--mode=user", "--dtype=fp64", absl::StrCat("--steps=", kElasticSteps),
          absl::StrCat("--members-from-step=", kElasticStep), "--members=0,1,2,3"};
      if (n == 2) {
        args.insert(args.end(),
                    {absl::StrCat("--die-at-step=", kElasticStep), "--die-after-marks=2"});
      }
      runs.push_back({n, StartSimTrainer(*nodes[n], r, 2, args)});
    }
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/2));
  Process& victim = runs[4].process;
  const ExitStatus died = victim.Wait(seconds(10));
  EXPECT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim.Log();
  EXPECT_NE(
      nodes[2]->process().Log().find(absl::StrCat("rank 4 (local 0, pid ", victim.pid(), ") died")),
      std::string::npos)
      << Logs(nodes);
  EXPECT_NE(nodes[2]->process().Log().find("it was its node's last trainer, so the node leaves"),
            std::string::npos)
      << Logs(nodes);
  ExpectSurvivorsReformedWithout(nodes, /*gone=*/2);
  EXPECT_TRUE(nodes[2]->process().Running()) << Logs(nodes);
}

// A node joining a running elastic GPU job (docs/DESIGN.md "Joining a
// running job"): nodes 0 and 1 (--num-nodes 2 --max-nodes 3 --min-nodes 1,
// 2 trainers on 2 simulated GPUs each, fp64) train; node 0's trainers stop
// at the start of step 2 while node 2, a new rank, starts with 2 trainers.
// Once both members read the leader's grow entry node 0's trainers go on,
// so every member switches at its iteration m: the members re-create
// their communicators with node 2's GPUs (6 NCCL ranks), node 2 opens its
// GPU session at NCCL ranks 4-5 and starts at m, and every trainer
// gs_broadcasts the job's state (iteration count and fp64 weights, in
// device memory) from rank 0 after step m-1: the joiners receive it within
// 1e-12 of the reference up to m. Every step is within 1e-12 of the
// average over its members (ranks 0-3 before m, 0-5 from m on) and all six
// end with the same weights bit for bit.
TEST(GpuElasticJob, ANewNodeJoinsTheRunningJobCatchesUpFromDeviceMemoryAndTrainsWithIt) {
  ScratchDir secrets;
  std::vector<std::string> common = {"--bucket-cap-mb=0.004", "--first-bucket-cap-mb=0.000001",
                                     "--timeout-s=30",        "--num-nodes=2",
                                     "--max-nodes=3",         "--min-nodes=1",
                                     "--job-id=gpujoin"};
  ASSERT_NO_FATAL_FAILURE(AddTokenFile(secrets, &common));
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartSimNode(0, 2, 0, common, {}, &nodes));
  const int port = nodes[0]->ListenPort(seconds(10));
  ASSERT_GT(port, 0) << Logs(nodes);
  ASSERT_NO_FATAL_FAILURE(StartSimNode(1, 2, port, common, {}, &nodes));
  const std::vector<std::string> train = {"--dtype=fp64", absl::StrCat("--steps=", kJoinSteps),
                                          "--catch-up", "--members-before-join=0,1,2,3",
                                          "--members-after-join=0,1,2,3,4,5"};
  std::vector<ElasticRun> runs;
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = train;
      args.push_back("--mode=flat");
      if (n == 0) {
        args.insert(args.end(),
                    {absl::StrCat("--pause-at-step=", kElasticStep), "--pause-after-marks=0"});
      }
      runs.push_back({n, StartSimTrainer(*nodes[n], r, 2, args)});
    }
  }
  for (int r = 0; r < 2; ++r) {
    Process& p = runs[r].process;
    ASSERT_TRUE(WaitForLog(p, absl::StrCat("paused at step ", kElasticStep), seconds(60)) &&
                WaitStopped(p, seconds(30)))
        << p.Log() << Logs(nodes);
  }
  ASSERT_NO_FATAL_FAILURE(StartSimNode(2, 2, port, common, {}, &nodes));
  for (int r = 0; r < 2; ++r) {
    // Registered as the members' are: every node of a job must.
    std::vector<std::string> args = train;
    args.push_back("--mode=flat");
    runs.push_back({2, StartSimTrainer(*nodes[2], r, 2, args)});
  }
  ASSERT_TRUE(WaitForLog(nodes[0]->process(), "event=job_grow_published", seconds(30)))
      << Logs(nodes);
  for (int n : {0, 1}) {
    ASSERT_TRUE(WaitForLog(nodes[n]->process(), "event=job_grow_read", seconds(30))) << Logs(nodes);
  }
  for (int r = 0; r < 2; ++r) runs[r].process.Signal(SIGCONT);
  const std::string joined = "joined the running job at iteration ";
  ASSERT_TRUE(WaitForLog(runs[4].process, joined, seconds(60)))
      << runs[4].process.Log() << Logs(nodes);
  const std::string log = runs[4].process.Log();
  const int m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(m, kElasticStep);
  ASSERT_LT(m, kJoinSteps) << "the members finished before node 2 joined";
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/-1));
  for (int rank = 0; rank < 6; ++rank) {
    const std::string needle =
        rank < 4 ? absl::StrCat("nodes joined after iteration ", m, ": state sent from rank 0\n")
                 : absl::StrCat(joined, m, ": state from rank 0, world size 6, rank ", rank, "\n");
    EXPECT_NE(runs[rank].process.Log().find(needle), std::string::npos)
        << needle << " in " << runs[rank].process.Log();
  }
  for (int n = 0; n < 2; ++n) {
    const std::string daemon = nodes[n]->process().Log();
    for (const std::string& needle :
         {std::string("event=job_growing"),
          absl::StrCat("event=gpu_session_reformed generation=2 gpus=2 first_rank=", 2 * n,
                       " nranks=6")}) {
      EXPECT_NE(daemon.find(needle), std::string::npos)
          << needle << " on node " << n << Logs(nodes);
    }
  }
  EXPECT_NE(nodes[2]->process().Log().find("first_rank=4 nranks=6"), std::string::npos)
      << Logs(nodes);
}

// A replacement for a dead node joins the re-formed GPU job: 3 nodes x 2
// trainers on 2 simulated GPUs each (fp64, --min-nodes 2); in step 2 every
// trainer stops after its first mark and node 2 (daemon and trainers) is
// SIGKILLed. Node 1's trainers go on (its collective fails), node 0's stay
// stopped while nodes 0 and 1 re-form as generation 2 (4 NCCL ranks); then
// a fresh node 2 daemon with 2 trainers (--catch-up) starts, and once both
// survivors read the grow entry node 0's trainers go on: all switch at m,
// generation 3 has 6 NCCL ranks again, and the replacements receive rank
// 0's state by gs_broadcast of device memory. Every step is within 1e-12
// of its members' average (0-1: ranks 0-5, 2 to m-1: ranks 0-3, m on:
// ranks 0-5) and all six end with the same weights bit for bit.
// `count` simulated nodes (node 0 leads; 2 trainers on 2 GPUs each) run
// `train`, every trainer stopped after its first mark of step kElasticStep;
// the last node (daemon and trainers) is SIGKILLed and `until_reformed`
// returns once the survivors re-formed, node 0's trainers still stopped. A
// fresh last node with 2 trainers (`train`) joins, and once every survivor
// read the grow entry node 0's trainers go on. `*m`: where the joiners
// started (checked to be after the kill and before the last step).
using ReformedCheck =
    std::function<void(const std::vector<std::unique_ptr<Daemon>>&, std::vector<ElasticRun>&)>;
void ReplaceTheLastNodeWhileNodeZeroWaits(int count, std::vector<std::string> common,
                                          const std::vector<std::string>& train,
                                          const ReformedCheck& until_reformed,
                                          std::vector<std::unique_ptr<Daemon>>* nodes,
                                          std::vector<ElasticRun>* runs, int* m) {
  ScratchDir secrets;
  ASSERT_NO_FATAL_FAILURE(AddTokenFile(secrets, &common));
  ASSERT_NO_FATAL_FAILURE(StartSimNode(0, 2, 0, common, {}, nodes));
  const int port = (*nodes)[0]->ListenPort(seconds(10));
  ASSERT_GT(port, 0) << Logs(*nodes);
  for (int n = 1; n < count; ++n) {
    ASSERT_NO_FATAL_FAILURE(StartSimNode(n, 2, port, common, {}, nodes));
  }
  for (int n = 0; n < count; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = train;
      args.insert(args.end(),
                  {absl::StrCat("--pause-at-step=", kElasticStep), "--pause-after-marks=1"});
      runs->push_back({n, StartSimTrainer(*(*nodes)[n], r, 2, args)});
    }
  }
  for (ElasticRun& run : *runs) {
    ASSERT_TRUE(
        WaitForLog(run.process, absl::StrCat("paused at step ", kElasticStep), seconds(60)) &&
        WaitStopped(run.process, seconds(30)))
        << run.process.Log() << Logs(*nodes);
  }
  const int last = count - 1;
  nodes->back()->process().Signal(SIGKILL);
  for (int i : {2 * last, 2 * last + 1}) (*runs)[i].process.Signal(SIGKILL);
  for (int i : {2 * last, 2 * last + 1}) (*runs)[i].process.Wait(seconds(10));
  runs->erase(runs->begin() + 2 * last, runs->end());
  ASSERT_NO_FATAL_FAILURE(until_reformed(*nodes, *runs));
  nodes->pop_back();
  ASSERT_NO_FATAL_FAILURE(StartSimNode(last, 2, port, common, {}, nodes));
  for (int r = 0; r < 2; ++r) runs->push_back({last, StartSimTrainer(*nodes->back(), r, 2, train)});
  ASSERT_TRUE(WaitForLog((*nodes)[0]->process(), "event=job_grow_published", seconds(30)))
      << Logs(*nodes);
  for (int n = 0; n < last; ++n) {
    ASSERT_TRUE(WaitForLog((*nodes)[n]->process(), "event=job_grow_read", seconds(30)))
        << Logs(*nodes);
  }
  for (int i : {0, 1}) (*runs)[i].process.Signal(SIGCONT);
  const std::string joined = "joined the running job at iteration ";
  ElasticRun& joiner = (*runs)[2 * last];
  ASSERT_TRUE(WaitForLog(joiner.process, joined, seconds(60)))
      << joiner.process.Log() << Logs(*nodes);
  const std::string log = joiner.process.Log();
  *m = std::atoi(log.c_str() + log.find(joined) + joined.size());
  ASSERT_GT(*m, kElasticStep);
  ASSERT_LT(*m, kJoinSteps) << "the survivors finished before the replacement joined";
}

TEST(GpuElasticJob, AReplacementNodeJoinsTheReformedJobCatchesUpAndTrainsOverAllAgain) {
  const std::vector<std::string> train = {"--mode=flat",
                                          "--dtype=fp64",
                                          absl::StrCat("--steps=", kJoinSteps),
                                          "--catch-up",
                                          absl::StrCat("--members-from-step=", kElasticStep),
                                          "--members=0,1,2,3",
                                          "--members-after-join=0,1,2,3,4,5"};
  std::vector<std::unique_ptr<Daemon>> nodes;
  std::vector<ElasticRun> runs;
  int m = 0;
  ASSERT_NO_FATAL_FAILURE(ReplaceTheLastNodeWhileNodeZeroWaits(
      3,
      {"--bucket-cap-mb=0.004", "--first-bucket-cap-mb=0.000001", "--timeout-s=30", "--num-nodes=3",
       "--min-nodes=2", "--job-id=gpureplace"},
      train,
      [](const std::vector<std::unique_ptr<Daemon>>& live, std::vector<ElasticRun>& held) {
        for (int i : {2, 3}) held[i].process.Signal(SIGCONT);  // node 1's: its collective fails
        ASSERT_TRUE(WaitForLog(live[0]->process(), "event=job_reformed", seconds(30)))
            << Logs(live);
      },
      &nodes, &runs, &m));
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/-1));
  for (int n = 0; n < 2; ++n) {
    const std::string daemon = nodes[n]->process().Log();
    for (const std::string& needle :
         {absl::StrCat("event=gpu_session_reformed generation=2 gpus=2 first_rank=", 2 * n,
                       " nranks=4"),
          absl::StrCat("event=gpu_session_reformed generation=3 gpus=2 first_rank=", 2 * n,
                       " nranks=6")}) {
      EXPECT_NE(daemon.find(needle), std::string::npos)
          << needle << " on node " << n << Logs(nodes);
    }
  }
  EXPECT_NE(nodes[2]->process().Log().find("first_rank=4 nranks=6"), std::string::npos)
      << Logs(nodes);
}

// The device copies of every trainer's input follow the world: 2 nodes x 2
// trainers on 2 simulated GPUs each (fp64, --min-nodes 1); in step 2 every
// trainer stops after its first mark and node 1 (daemon and trainers) is
// SIGKILLed. Node 0 re-forms alone, stops queueing the copies and frees
// them (a one-node world has no node to redo with); a replacement node 1
// joins at m and node 0 allocates and takes them again. Every step is
// within 1e-12 of its members' average and all four end alike.
TEST(GpuElasticJob, InputCopiesStopWhenTheJobShrinksToOneNodeAndStartAgainWhenANodeJoins) {
  const std::vector<std::string> train = {"--mode=flat",
                                          "--dtype=fp64",
                                          absl::StrCat("--steps=", kJoinSteps),
                                          "--catch-up",
                                          absl::StrCat("--members-from-step=", kElasticStep),
                                          "--members=0,1",
                                          "--members-after-join=0,1,2,3"};
  const std::string stopped = absl::StrCat(
      "event=trainer_input_copies_stopped iteration=", kElasticStep, " nodes=1 trainers=2 ");
  std::vector<std::unique_ptr<Daemon>> nodes;
  std::vector<ElasticRun> runs;
  int m = 0;
  ASSERT_NO_FATAL_FAILURE(ReplaceTheLastNodeWhileNodeZeroWaits(
      2,
      {"--bucket-cap-mb=0.004", "--first-bucket-cap-mb=0.000001", "--timeout-s=30", "--num-nodes=2",
       "--min-nodes=1", "--job-id=gpucopies"},
      train,
      [&](const std::vector<std::unique_ptr<Daemon>>& live, std::vector<ElasticRun>&) {
        ASSERT_TRUE(WaitForLog(live[0]->process(), stopped, seconds(30))) << Logs(live);
      },
      &nodes, &runs, &m));
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/-1));
  const std::string log = nodes[0]->process().Log();
  const size_t started = log.find("event=trainer_input_copies_started ");
  EXPECT_NE(log.find(" nodes=2 trainers=2 ", started), std::string::npos) << log;
  EXPECT_LT(log.find(stopped), started) << log;
  EXPECT_LT(log.find("event=job_growing"), started) << log;
  EXPECT_EQ(log.find("event=trainer_input_copies_failed"), std::string::npos) << log;
}

// A fixed job (--min-nodes = --num-nodes) still ends at a trainer's death:
// rank 3 (node 1) SIGKILLs itself after 2 marks of step 2, and every other
// trainer, on every node, fails with PEER_FAILED naming it; nobody re-forms.
TEST(GpuFixedJob, ATrainersDeathEndsTheJobOnEveryNodeNamingIt) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(
      StartSimNodes({"--timeout-s=10", "--num-nodes=3", "--job-id=gpufixedtrainer"}, &nodes));
  std::vector<ElasticRun> runs;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::string> args = {"--mode=flat", absl::StrCat("--steps=", kElasticSteps)};
      if (n == 1 && r == 1) {
        args.insert(args.end(),
                    {absl::StrCat("--die-at-step=", kElasticStep), "--die-after-marks=2"});
      }
      runs.push_back({n, StartSimTrainer(*nodes[n], r, 2, args)});
    }
  }
  Process& victim = runs[3].process;
  const ExitStatus died = victim.Wait(seconds(60));
  EXPECT_TRUE(!died.exited && died.code == SIGKILL) << died.ToString() << victim.Log();
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i == 3) continue;
    const ExitStatus st = runs[i].process.Wait(seconds(60));
    const std::string log = runs[i].process.Log();
    ASSERT_TRUE(st.exited && st.code == 2) << st.ToString() << "\n" << log << Logs(nodes);
    EXPECT_NE(log.find("error code=4"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 3 (local 1"), std::string::npos) << log << Logs(nodes);
  }
  for (int n = 0; n < kElasticNodes; ++n) {
    EXPECT_EQ(nodes[n]->process().Log().find("event=job_reformed"), std::string::npos)
        << Logs(nodes);
  }
}

// The scheduler's watchdog in an elastic GPU job. Node 2's trainers marked
// only the first gradient of step 2 and the survivors' all of them, so the
// survivors wait inside the second bucket's collective; node 2's daemon is
// then stopped (SIGSTOP: silent, not dead), and the survivors' collectives
// never time out by themselves (GRADSYNC_SIM_STALL_AT=collective, as an
// NCCL kernel waiting for a stopped peer). Past the timeout the watchdog
// aborts that generation's collectives only, the leader names node 2
// presumed dead (silent for seconds while the others answer), and the
// survivors re-form without it and redo step 2 from their kept sums (the
// first bucket was written back already), each step within 1e-12 of its
// members' average. Woken, node 2's trainers get the job's error.
// The watchdog comes first by construction, not by a race: node 1's fires
// 7 s after its launch (--timeout-s=6 plus the 1 s margin), while the
// leader's own heartbeat timeout, min(--timeout-s, 10 s) on node 0, is
// given its cap: 10 s from node 2's last heartbeat, which comes after that
// launch (node 2 is stopped only after its stall report, 2 s after it
// began waiting), so node 2 would have to fall silent 3 s before the
// survivors launched for the leader to come first. Node 2 stops 5 s
// before node 1's watchdog fires, so the watchdog always finds it silent.
TEST(GpuElasticJob, ANodeStoppedInsideACollectivePastTheTimeoutIsLeftOutAndTheOthersRedoTheStep) {
  std::vector<std::unique_ptr<Daemon>> nodes;
  ASSERT_NO_FATAL_FAILURE(StartSimNodes(
      {"--bucket-cap-mb=0.004", "--first-bucket-cap-mb=0.000001", "--timeout-s=6",
       "--stall-threshold-s=2", "--num-nodes=3", "--min-nodes=2", "--job-id=gpuwatchdog"},
      &nodes, {2, 2, 2}, {{"GRADSYNC_SIM_STALL_AT", "collective"}}, {{0, {"--timeout-s=20"}}}));
  std::vector<ElasticRun> runs;
  for (int n = 0; n < kElasticNodes; ++n) {
    for (int r = 0; r < 2; ++r) {
      const int marks = MarksBeforePause(ElasticStage::kSurvivorsInCollective, n == 2);
      runs.push_back({n, StartSimTrainer(*nodes[n], r, 2,
                                         {"--mode=flat", "--dtype=fp64", "--in-order",
                                          absl::StrCat("--steps=", kElasticSteps),
                                          absl::StrCat("--pause-at-step=", kElasticStep),
                                          absl::StrCat("--pause-after-marks=", marks),
                                          absl::StrCat("--members-from-step=", kElasticStep),
                                          "--members=0,1,2,3"})});
    }
  }
  for (ElasticRun& run : runs) {
    ASSERT_TRUE(
        WaitForLog(run.process, absl::StrCat("paused at step ", kElasticStep), seconds(60)) &&
        WaitStopped(run.process, seconds(30)))
        << run.process.Log() << Logs(nodes);
  }
  // Node 2 waits for its paused trainers (its stall report), the
  // survivors inside the collective; then node 2 goes silent mid-step.
  ASSERT_TRUE(WaitForLog(nodes[2]->process(), "event=stall", seconds(30))) << Logs(nodes);
  nodes[2]->process().Signal(SIGSTOP);
  for (ElasticRun& run : runs) {
    if (run.node != 2) run.process.Signal(SIGCONT);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSurvivorsEndAlike(runs, nodes, /*gone_node=*/2));
  bool watchdog_fired = false;
  for (int n = 0; n < 2; ++n) {
    const std::string log = nodes[n]->process().Log();
    watchdog_fired = watchdog_fired || log.find(absl::StrCat("event=reduction_timeout iteration=",
                                                             kElasticStep)) != std::string::npos;
    for (const std::string& needle :
         {std::string("event=node_presumed_dead generation=1 node_rank=2"),
          std::string("event=gpu_session_reformed generation=2 gpus=2"),
          absl::StrCat("event=iteration_redo iteration=", kElasticStep, " world_size=4 nodes=2")}) {
      EXPECT_NE(log.find(needle), std::string::npos) << needle << " on node " << n << Logs(nodes);
    }
    EXPECT_EQ(log.find("kept_buckets=0"), std::string::npos) << log;
    EXPECT_EQ(log.find("event=job_failed"), std::string::npos) << log;
  }
  EXPECT_TRUE(watchdog_fired) << Logs(nodes);
  nodes[2]->process().Signal(SIGCONT);
  for (ElasticRun& run : runs) {
    if (run.node != 2) continue;
    run.process.Signal(SIGCONT);
    const ExitStatus st = run.process.Wait(seconds(60));
    const std::string log = run.process.Log();
    ASSERT_TRUE(st.exited && st.code == 2) << st.ToString() << "\n" << log << Logs(nodes);
    EXPECT_TRUE(log.find("error code=4") != std::string::npos ||
                log.find("error code=5") != std::string::npos)
        << log;
  }
}

// The equivalence check can fail: a daemon that reduces without polling the
// readiness events (a test-only flag of gradsyncd_sim) reads gradients the
// trainers' streams have not written yet, and the trainers notice.
TEST(GpuPath, SkippingTheEventWaitGivesWrongResults) {
  for (const std::string mode : {"flat", "user"}) {
    Daemon daemon(2, {"--timeout-s=20", "--unsafe-skip-event-wait"}, SimEnv(2),
                  "tests/gpu/gradsyncd_sim");
    ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
    std::vector<Process> trainers = StartAll(
        daemon, Case{"skip", 2, 2, {"--mode=" + mode, "--hold-stream-ms=30", "--steps=3"}});
    int mismatches = 0;
    std::string logs;
    for (auto& t : trainers) {
      ExitStatus st = t.Wait(seconds(60));
      if (st.exited && st.code == 1) ++mismatches;
      EXPECT_NE(st.code, 0) << mode << ": a trainer passed although the daemon never waited\n"
                            << t.Log();
      logs += t.Log();
    }
    EXPECT_GT(mismatches, 0) << mode << "\n" << logs << "\ndaemon:\n" << daemon.process().Log();
    EXPECT_NE(daemon.process().Log().find("event=unsafe_skip_event_wait"), std::string::npos);
  }
}

TEST(GpuPath, TrainerKilledMidIterationFailsItsPeersNamingIt) {
  Daemon daemon(3, {"--timeout-s=20"}, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> args = {"--mode=user", "--steps=20"};
    if (r == 1) args.push_back("--die-at-step=2");
    trainers.push_back(StartSimTrainer(daemon, r, 2, args));
  }
  ExitStatus victim = trainers[1].Wait(seconds(60));
  EXPECT_FALSE(victim.exited) << trainers[1].Log();
  EXPECT_EQ(victim.code, SIGKILL);
  for (int r : {0, 2}) {
    ExitStatus st = trainers[r].Wait(seconds(40));
    const std::string log = trainers[r].Log();
    ASSERT_TRUE(st.exited && st.code == 2) << "trainer " << r << "\n" << log;
    EXPECT_NE(log.find("error code=4"), std::string::npos) << log;  // PEER_FAILED
    EXPECT_NE(log.find("rank 1 (local 1"), std::string::npos) << log;
  }
  // The daemon keeps serving: the next job gets fresh communicators.
  std::vector<Process> next = StartAll(daemon, Case{"next", 3, 2, {"--mode=flat", "--steps=3"}});
  for (auto& t : next) {
    ExitStatus st = t.Wait(seconds(60));
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << "\ndaemon:\n" << daemon.process().Log();
  }
}

// A trainer whose stream never gets to its readiness event: the daemon
// waits (it must), but only until the timeout, then every trainer gets
// TIMEOUT naming the trainer and the tensor.
TEST(GpuPath, ReadinessEventThatNeverCompletesTimesOutNamingTrainerAndTensor) {
  Daemon daemon(2, {"--timeout-s=2"}, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  Process stuck = StartSimTrainer(daemon, 0, 2, {"--mode=flat", "--hold-stream-ms=6000"});
  Process fine = StartSimTrainer(daemon, 1, 2, {"--mode=flat"});
  for (Process* t : {&stuck, &fine}) {
    ExitStatus st = t->Wait(seconds(40));
    const std::string log = t->Log();
    ASSERT_TRUE(st.exited && st.code == 2) << log << "\ndaemon:\n" << daemon.process().Log();
    EXPECT_NE(log.find("error code=5"), std::string::npos) << log;  // TIMEOUT
    EXPECT_NE(log.find("rank 0 (local 0"), std::string::npos) << log;
    EXPECT_NE(log.find("readiness event never completed"), std::string::npos) << log;
  }
}

// A readiness event pending past the stall threshold is reported (log and
// stats) while the daemon keeps waiting; the iteration then completes.
TEST(GpuPath, PendingReadinessEventIsReportedAsAStall) {
  Daemon daemon(2, {"--timeout-s=20", "--stall-threshold-s=0.3"}, SimEnv(1),
                "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  Process slow = StartSimTrainer(daemon, 0, 1, {"--steps=2", "--hold-stream-ms=1500"});
  Process fine = StartSimTrainer(daemon, 1, 1, {"--steps=2"});
  for (Process* t : {&slow, &fine}) {
    ExitStatus st = t->Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << t->Log() << "\ndaemon:\n" << daemon.process().Log();
  }
  const std::string log = daemon.process().Log();
  EXPECT_NE(log.find("event=stall"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 0 (local 0"), std::string::npos) << log;
  EXPECT_NE(log.find("readiness event of tensor"), std::string::npos) << log;
}

// Stats cover GPU buckets through the same observer as the CPU path.
TEST(GpuPath, StatsCoverGpuBuckets) {
  Daemon daemon(2, kDaemonArgs, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  const int port = daemon.ListenPort(seconds(10));
  ASSERT_GT(port, 0);
  std::vector<Process> trainers = StartAll(daemon, Case{"stats", 2, 2, {"--steps=4"}});
  for (auto& t : trainers) {
    ExitStatus st = t.Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << t.Log();
  }
  Process stats = Process::Spawn({Runfile("tools/gradsyncctl/gradsyncctl"),
                                  absl::StrCat("--addr=127.0.0.1:", port), "stats", "--json"},
                                 daemon.dir() + "/stats.log");
  ASSERT_EQ(stats.Wait(seconds(20)).code, 0) << stats.Log();
  const std::string json = stats.Log();
  EXPECT_NE(json.find("gpu-sim"), std::string::npos) << json;
  EXPECT_NE(json.find("\"buckets\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"count\": \"4\""), std::string::npos) << json;
}

TEST(GpuPath, MixingCpuAndCudaTensorsIsRefusedNamingOneOfEach) {
  Daemon daemon(1, {"--timeout-s=20"}, SimEnv(1), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  Process t = StartSimTrainer(daemon, 0, 1, {"--mix"});
  ExitStatus st = t.Wait(seconds(30));
  const std::string log = t.Log();
  ASSERT_TRUE(st.exited && st.code == 2) << log;
  EXPECT_NE(log.find("error code=1"), std::string::npos) << log;  // INVALID_ARGUMENT
  EXPECT_NE(log.find("tensor 1 'fc1.weight' is on the CPU and tensor 0 'embed' on cuda:0"),
            std::string::npos)
      << log;
}

// A sticky device error (simulated: GRADSYNC_SIM_LOSE_DEVICE_AT) leaves the
// device unusable for the process, wherever it happens — opening a job's
// trainer events, NCCL init, tearing the job down — so the daemon exits
// with its distinct code for its supervisor to restart it, rather than
// stay up failing every later GPU job.
TEST(GpuPath, ALostDeviceOnAnyPathExitsTheDaemonWithItsCode) {
  for (const std::string at : {"open_event", "create_collectives", "free"}) {
    std::map<std::string, std::string> env = SimEnv(1);
    env["GRADSYNC_SIM_LOSE_DEVICE_AT"] = at;
    Daemon daemon(1, kDaemonArgs, env, "tests/gpu/gradsyncd_sim");
    ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
    Process trainer = StartSimTrainer(daemon, 0, 1, {"--steps=1"});
    const ExitStatus st = daemon.process().Wait(seconds(30));
    const std::string log = daemon.process().Log();
    EXPECT_TRUE(st.exited && st.code == 71) << at << ": " << st.ToString() << "\n" << log;
    EXPECT_NE(log.find("event=device_context_lost"), std::string::npos) << at << "\n" << log;
    EXPECT_NE(log.find("lost at " + at), std::string::npos) << log;
    trainer.Wait(seconds(30));
  }
}

// The release gradsyncd links no simulation: here (no GPU, or built
// without CUDA) it has no device, so it refuses CUDA tensors, saying why,
// and --backend=nccl at start.
TEST(GpuPath, ReleaseDaemonWithoutCudaRefusesCudaTensors) {
  Daemon daemon(1, {"--timeout-s=20"}, SimEnv(1));
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  Process t = StartSimTrainer(daemon, 0, 1, {"--mode=flat"});
  ExitStatus st = t.Wait(seconds(30));
  const std::string log = t.Log();
  ASSERT_TRUE(st.exited && st.code == 2) << log;
  EXPECT_NE(log.find("error code=1"), std::string::npos) << log;
  EXPECT_NE(log.find("has no GPU device"), std::string::npos) << log;

  Daemon nccl(1, {"--backend=nccl"});
  ExitStatus ns = nccl.process().Wait(seconds(10));
  EXPECT_TRUE(ns.exited && ns.code == 2) << nccl.process().Log();
  EXPECT_NE(nccl.process().Log().find("--backend=nccl: "), std::string::npos)
      << nccl.process().Log();
}

}  // namespace
}  // namespace gradsync::testing
