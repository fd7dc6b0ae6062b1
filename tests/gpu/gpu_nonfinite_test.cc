// --nonfinite on the GPU path, end to end on the simulated device: a real
// gradsyncd_sim and real trainer processes (sim_trainer) with CUDA
// gradients, one of which writes a NaN or an Inf into one element of one
// step. error: every trainer's gs_wait fails with INVALID_ARGUMENT naming
// the culprit trainer, its node and host, the tensor, the element and the
// value; skip: every trainer skips that step alone and the replicas stay
// equal to each other and to a reference that skipped it; off: the value
// reaches every trainer's result.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

// Small buckets: several per step, and staged ones once the plan is
// rebuilt after iteration 0 (the trainers mark in shuffled orders).
const std::vector<std::string> kDaemonArgs = {"--bucket-cap-mb=0.004",
                                              "--first-bucket-cap-mb=0.001", "--timeout-s=20"};
constexpr int kExitCallFailed = 2;  // sim_trainer: a call failed

std::map<std::string, std::string> SimEnv(int gpus, const std::string& host_id = "") {
  std::map<std::string, std::string> env = {{"GRADSYNC_SIM_GPUS", std::to_string(gpus)}};
  if (!host_id.empty()) env["NCCL_HOSTID"] = host_id;
  return env;
}

Process StartSimTrainer(const Daemon& daemon, int local_rank, int gpus,
                        const std::vector<std::string>& args) {
  std::vector<std::string> argv = {Runfile("tests/gpu/sim_trainer"), "--socket=" + daemon.socket(),
                                   absl::StrCat("--shuffle-seed=", 7 + local_rank)};
  argv.insert(argv.end(), args.begin(), args.end());
  std::map<std::string, std::string> env = SimEnv(gpus);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  SpawnOptions options;
  options.env = env;
  return Process::Spawn(
      argv, absl::StrCat(daemon.dir(), "/trainer", local_rank, ".", rand() % 1000000, ".log"),
      options);
}

std::vector<std::string> Args(const std::string& layout, const std::string& dtype,
                              const std::string& nonfinite, int bad_rank, int bad_step,
                              int bad_tensor, int bad_element, const std::string& value) {
  return {"--mode=" + layout,
          "--dtype=" + dtype,
          "--steps=4",
          "--nonfinite=" + nonfinite,  // the daemon's: what the trainer expects
          absl::StrCat("--bad-rank=", bad_rank),
          absl::StrCat("--bad-step=", bad_step),
          absl::StrCat("--bad-tensor=", bad_tensor),
          absl::StrCat("--bad-element=", bad_element),
          "--bad-value=" + value};
}

std::string CulpritText(int rank, int local_rank, const Process& p, int node) {
  return absl::StrCat("non-finite gradient from rank ", rank, " (local ", local_rank, ", pid ",
                      p.pid(), ") on node ", node, " (host ");
}

struct ErrorCase {
  std::string name;
  int trainers;
  int gpus;
  std::string layout;
  std::string dtype;
  int bad_rank;
  int bad_step;
  int bad_tensor;
  int bad_element;  // -1: the last
  std::string value;
  std::string expected;  // "tensor ... element ... = ..."
  int embed_numel = 0;   // > 0: sim_trainer --embed-numel
};

void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

class GpuNonFiniteErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(GpuNonFiniteErrorTest, EveryTrainerFailsNamingTheCulpritTensorElementAndValue) {
  const ErrorCase& c = GetParam();
  std::vector<std::string> args = kDaemonArgs;
  args.push_back("--nonfinite=error");
  Daemon daemon(c.trainers, args, SimEnv(c.gpus), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<std::string> targs = Args(c.layout, c.dtype, "error", c.bad_rank, c.bad_step,
                                        c.bad_tensor, c.bad_element, c.value);
  if (c.embed_numel > 0) targs.push_back(absl::StrCat("--embed-numel=", c.embed_numel));
  std::vector<Process> trainers;
  for (int r = 0; r < c.trainers; ++r)
    trainers.push_back(StartSimTrainer(daemon, r, c.gpus, targs));
  const std::string culprit = CulpritText(c.bad_rank, c.bad_rank, trainers[c.bad_rank], 0);
  for (int r = 0; r < c.trainers; ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(90));
    const std::string log = trainers[r].Log();
    ASSERT_TRUE(st.exited && st.code == kExitCallFailed) << "trainer " << r << "\n"
                                                         << log << "\ndaemon:\n"
                                                         << daemon.process().Log();
    EXPECT_NE(log.find("error code=1:"), std::string::npos) << log;  // INVALID_ARGUMENT
    EXPECT_NE(log.find(culprit), std::string::npos) << culprit << "\n" << log;
    EXPECT_NE(log.find(c.expected), std::string::npos) << c.expected << "\n" << log;
    EXPECT_NE(log.find(absl::StrCat("iteration ", c.bad_step, ":")), std::string::npos) << log;
  }
  EXPECT_NE(daemon.process().Log().find("event=nonfinite_gradient"), std::string::npos)
      << daemon.process().Log();
}

INSTANTIATE_TEST_SUITE_P(
    Sim, GpuNonFiniteErrorTest,
    ::testing::Values(
        // Iteration 0: each bucket one contiguous range, summed in place
        // into rank 0's memory, which must not then look like the culprit.
        ErrorCase{"nan_summed_in_place_into_another_trainer_fp32", 2, 1, "flat", "fp32", 1, 0, 1, 5,
                  "nan", "tensor 1 'fc1.weight' element 5 = nan"},
        ErrorCase{"nan_from_the_in_place_trainer_fp32", 2, 1, "flat", "fp32", 0, 0, 2, 7, "nan",
                  "tensor 2 'fc1.bias' element 7 = nan"},
        // Later iterations: staged buckets, user pointers, another GPU.
        ErrorCase{"nan_from_one_of_four_on_two_gpus_user_fp32", 4, 2, "user", "fp32", 3, 2, 0, 17,
                  "nan", "tensor 0 'embed' element 17 = nan"},
        ErrorCase{"inf_at_the_last_element_bf16", 4, 2, "flat", "bf16", 1, 2, 1, -1, "inf",
                  "tensor 1 'fc1.weight' element 2047 = inf"},
        ErrorCase{"nan_bf16_user", 2, 1, "user", "bf16", 1, 1, 3, 0, "nan",
                  "tensor 3 'fc2.weight' element 0 = nan"},
        // The search reads gradients back through a 1 MiB host window
        // (262144 fp32 elements): the last element of the first window,
        // the first of the second, and the tensor's last, in a tensor of
        // 300000 (summed in place in iteration 0, staged later).
        ErrorCase{"nan_at_the_last_element_of_the_first_search_window_fp32", 2, 1, "flat", "fp32",
                  1, 0, 0, 262143, "nan", "tensor 0 'embed' element 262143 = nan", 300000},
        ErrorCase{"nan_at_the_first_element_of_the_second_search_window_fp32", 2, 1, "flat", "fp32",
                  0, 0, 0, 262144, "nan", "tensor 0 'embed' element 262144 = nan", 300000},
        ErrorCase{"inf_past_the_first_search_window_user_fp32", 2, 1, "user", "fp32", 1, 2, 0, -1,
                  "inf", "tensor 0 'embed' element 299999 = inf", 300000}),
    [](const ::testing::TestParamInfo<ErrorCase>& info) { return info.param.name; });

// Every trainer says "skipped ... step S" for the bad step alone (sim_trainer
// fails on any other skip), its parameters equal its reference that skipped
// it, and all fingerprints are equal.
void ExpectSkippedAlike(std::vector<Process>& trainers, int bad_step, const std::string& logs) {
  std::string fingerprint;
  for (size_t r = 0; r < trainers.size(); ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(90));
    const std::string log = trainers[r].Log();
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << "\n" << log << "\n" << logs;
    EXPECT_NE(log.find(absl::StrCat("step ", bad_step, "\n")), std::string::npos) << log;
    const size_t at = log.find(" fingerprint ");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string mine = log.substr(at, log.find('\n', at) - at);
    if (fingerprint.empty()) fingerprint = mine;
    EXPECT_EQ(mine, fingerprint) << "trainer " << r << "\n" << log;
  }
}

TEST(GpuNonFinite, SkipSkipsThatStepOnEveryTrainerAndKeepsReplicasEqualFp32) {
  std::vector<std::string> args = kDaemonArgs;
  args.push_back("--nonfinite=skip");
  Daemon daemon(4, args, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 4; ++r) {
    trainers.push_back(
        StartSimTrainer(daemon, r, 2, Args("flat", "fp32", "skip", 2, 2, 1, 9, "nan")));
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSkippedAlike(trainers, 2, daemon.process().Log()));
  const std::string log = daemon.process().Log();
  EXPECT_NE(log.find(absl::StrCat("event=nonfinite_step_skipped iteration=2 culprit=\"rank 2 "
                                  "(local 2, pid ",
                                  trainers[2].pid(), ")")),
            std::string::npos)
      << log;
}

TEST(GpuNonFinite, SkipWithAnInfAtTheLastElementInBf16UserPointers) {
  std::vector<std::string> args = kDaemonArgs;
  args.push_back("--nonfinite=skip");
  Daemon daemon(2, args, SimEnv(1), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(
        StartSimTrainer(daemon, r, 1, Args("user", "bf16", "skip", 0, 1, 0, -1, "inf")));
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSkippedAlike(trainers, 1, daemon.process().Log()));
}

TEST(GpuNonFinite, OffLetsTheNanReachEveryTrainer) {
  std::vector<std::string> args = kDaemonArgs;
  args.push_back("--nonfinite=off");
  Daemon daemon(2, args, SimEnv(2), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    trainers.push_back(
        StartSimTrainer(daemon, r, 2, Args("flat", "fp32", "off", 1, 2, 1, 5, "nan")));
  }
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(90));
    const std::string log = trainers[r].Log();
    ASSERT_TRUE(st.exited && st.code == 0) << log << "\ndaemon:\n" << daemon.process().Log();
    EXPECT_NE(log.find(absl::StrCat("nonfinite through rank ", r, " step 2 tensor 1 element 5")),
              std::string::npos)
        << log;
  }
  EXPECT_EQ(daemon.process().Log().find("event=nonfinite"), std::string::npos)
      << daemon.process().Log();
}

// Two simulated nodes of 2 trainers each on 2 GPUs; `leader_env` is added
// to node 0's environment.
void StartTwoSimNodes(std::vector<std::string> common, std::unique_ptr<Daemon>* leader,
                      std::unique_ptr<Daemon>* follower,
                      const std::map<std::string, std::string>& leader_env = {}) {
  ScratchDir secrets;
  ASSERT_TRUE(WriteTokenFile(secrets.File("token"), "gpu-nonfinite-token"));
  common.push_back("--job-token-file=" + secrets.File("token"));
  std::vector<std::string> lead = common;
  lead.push_back("--node-rank=0");
  std::map<std::string, std::string> env = SimEnv(2, "sim-node-0");
  env.insert(leader_env.begin(), leader_env.end());
  *leader = std::make_unique<Daemon>(2, lead, env, "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE((*leader)->WaitReady(seconds(10))) << (*leader)->process().Log();
  const int port = (*leader)->ListenPort(seconds(10));
  ASSERT_GT(port, 0) << (*leader)->process().Log();
  std::vector<std::string> follow = common;
  follow.insert(follow.end(), {"--node-rank=1", absl::StrCat("--leader=127.0.0.1:", port)});
  *follower =
      std::make_unique<Daemon>(2, follow, SimEnv(2, "sim-node-1"), "tests/gpu/gradsyncd_sim");
  ASSERT_TRUE((*follower)->WaitReady(seconds(10))) << (*follower)->process().Log();
}

// Rank 3 (node 1, local 1) writes the NaN: only its node knows the culprit,
// yet node 0 sees the result is not finite in the same bucket of the same
// iteration (the NaN written into the collective's input reaches it).
// `leader_env` may hold node 0's look at that result back.
void ExpectCulpritOnEveryNode(const std::map<std::string, std::string>& leader_env) {
  std::vector<std::string> common = kDaemonArgs;
  common.insert(common.end(),
                {"--num-nodes=2", "--job-id=gpu-nonfinite-error", "--nonfinite=error"});
  std::unique_ptr<Daemon> leader, follower;
  ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader, &follower, leader_env));
  const std::vector<std::string> targs = Args("flat", "fp32", "error", 3, 2, 1, 5, "nan");
  std::vector<Process> trainers;
  for (Daemon* d : {leader.get(), follower.get()}) {
    for (int r = 0; r < 2; ++r) trainers.push_back(StartSimTrainer(*d, r, 2, targs));
  }
  const std::string culprit = CulpritText(3, 1, trainers[3], 1);
  for (size_t t = 0; t < trainers.size(); ++t) {
    const ExitStatus st = trainers[t].Wait(seconds(90));
    const std::string log = trainers[t].Log();
    ASSERT_TRUE(st.exited && st.code == kExitCallFailed)
        << "trainer " << t << "\n"
        << log << "\nleader:\n"
        << leader->process().Log() << "\nfollower:\n"
        << follower->process().Log();
    EXPECT_NE(log.find("error code=1:"), std::string::npos) << log;  // INVALID_ARGUMENT
    EXPECT_NE(log.find(culprit), std::string::npos) << culprit << "\n" << log;
    EXPECT_NE(log.find("tensor 1 'fc1.weight' element 5 = nan"), std::string::npos) << log;
    if (t < 2) {
      EXPECT_NE(log.find("the leader reports: node_rank=1"), std::string::npos) << log;
      EXPECT_NE(log.find(") reported INVALID_ARGUMENT: iteration "), std::string::npos) << log;
    }
  }
  if (leader_env.empty()) return;
  // Held back, node 0 failed from the abort's news, not its own look.
  EXPECT_NE(leader->process().Log().find("code=INVALID_ARGUMENT culprit_local_rank=-1 "
                                         "message=\"the job was aborted by the leader; the "
                                         "leader reports: node_rank=1"),
            std::string::npos)
      << leader->process().Log();
}

TEST(GpuNonFinite, TwoNodesErrorNamesTheCulpritOnEveryNode) { ExpectCulpritOnEveryNode({}); }

// Node 0 looks at its result four heartbeats late: the leader's abort,
// caused by node 1's report, reaches it first and must carry the culprit's
// INVALID_ARGUMENT, not PEER_FAILED.
TEST(GpuNonFinite, TwoNodesErrorNamesTheCulpritEvenWhenTheAbortArrivesFirst) {
  ExpectCulpritOnEveryNode({{"GRADSYNC_TEST_DELAY_COLLECTIVE_CHECK_MS", "2000"}});
}

TEST(GpuNonFinite, TwoNodesSkipKeepsEveryReplicaEqual) {
  std::vector<std::string> common = kDaemonArgs;
  common.insert(common.end(), {"--num-nodes=2", "--job-id=gpu-nonfinite-skip", "--nonfinite=skip"});
  std::unique_ptr<Daemon> leader, follower;
  ASSERT_NO_FATAL_FAILURE(StartTwoSimNodes(common, &leader, &follower));
  const std::vector<std::string> targs = Args("user", "fp32", "skip", 3, 2, 3, 11, "nan");
  std::vector<Process> trainers;
  for (Daemon* d : {leader.get(), follower.get()}) {
    for (int r = 0; r < 2; ++r) trainers.push_back(StartSimTrainer(*d, r, 2, targs));
  }
  ASSERT_NO_FATAL_FAILURE(ExpectSkippedAlike(
      trainers, 2,
      "leader:\n" + leader->process().Log() + "\nfollower:\n" + follower->process().Log()));
  EXPECT_NE(leader->process().Log().find(
                "event=nonfinite_step_skipped iteration=2 culprit=\"another node\""),
            std::string::npos)
      << leader->process().Log();
  EXPECT_NE(follower->process().Log().find(
                absl::StrCat("culprit=\"rank 3 (local 1, pid ", trainers[3].pid(), ")")),
            std::string::npos)
      << follower->process().Log();
}

}  // namespace
}  // namespace gradsync::testing
