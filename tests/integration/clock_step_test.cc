// A step of the wall clock on one node in the middle of a 2-node job: that
// node's daemon runs under libfaketime (only the wall clock faked;
// CLOCK_MONOTONIC is real), whose offset the test moves by +30 s once the
// job trains. Every wait of the daemon must keep its length on the
// monotonic clock: a wait whose deadline the kernel reads on CLOCK_REALTIME
// (absl's timed waits) lasts 30 s longer, the node's heartbeat loop falls
// silent and the leader aborts the healthy job ("node_rank=0 sent no
// heartbeat for ...").
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr char kLibFaketime[] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

// libfaketime reads its offset from `file` at every clock read (NO_CACHE),
// so writing the file steps the clock of every process using it at once.
std::map<std::string, std::string> FaketimeEnv(const std::string& file) {
  return {{"LD_PRELOAD", kLibFaketime},
          {"FAKETIME_TIMESTAMP_FILE", file},
          {"FAKETIME_NO_CACHE", "1"},
          {"FAKETIME_DONT_FAKE_MONOTONIC", "1"}};
}

bool WriteOffset(const std::string& file, const std::string& offset) {
  std::ofstream out(file, std::ios::trunc);
  out << offset << "\n";
  return static_cast<bool>(out.flush());
}

// The wall clock (seconds since 1970) as a process under `env` reads it.
absl::StatusOr<int64_t> FakedUnixSeconds(const std::string& dir,
                                         const std::map<std::string, std::string>& env) {
  SpawnOptions options;
  options.env = env;
  Process date = Process::Spawn({"/bin/date", "+%s"}, dir + "/date.log", options);
  const ExitStatus st = date.Wait(seconds(10));
  int64_t s = 0;
  if (!st.exited || st.code != 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(date.Log()), &s)) {
    return absl::InternalError(
        absl::StrCat("date under libfaketime: ", st.ToString(), " ", date.Log()));
  }
  return s;
}

// The parameter: the node whose clock steps (0: the leader's host).
class ClockStep : public ::testing::TestWithParam<int> {};

TEST_P(ClockStep, AWallClockStepOfThirtySecondsMidJobKeepsTrainingToTheExactResult) {
  const int stepped = GetParam();
  ASSERT_EQ(access(kLibFaketime, R_OK), 0)
      << kLibFaketime << " is missing: scripts/setup installs libfaketime";
  ScratchDir faketime_dir("gsft");
  const std::string offset_file = faketime_dir.File("offset");
  ASSERT_TRUE(WriteOffset(offset_file, "+0"));

  ClusterOptions options;
  options.nodes = 2;
  options.local_size = 1;
  options.job_id = "clockjob";
  // --timeout-s=8: a node silent for 8 s is declared dead (the heartbeat
  // timeout is min(timeout, 10 s)), well within the job's length below.
  options.flags = {"--bucket-cap-mb=0.001", "--first-bucket-cap-mb=0.0001", "--timeout-s=8"};
  const std::map<std::string, std::string> faked_env = FaketimeEnv(offset_file);
  options.node_env.resize(2);
  options.node_env[stepped] = faked_env;
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();

  // 50 steps of at least 300 ms each (the trainers pause in backward): the
  // job outlives the heartbeat timeout by seconds after the step.
  const std::vector<std::string> args = {"--steps=50", "--batch=60", "--fp64"};
  std::vector<std::string> trainer_args = args;
  trainer_args.push_back("--sleep-ms=300");
  std::vector<std::string> outs;
  std::vector<Process> trainers = cluster.StartTrainers(trainer_args, &outs);
  // The first iteration is over once the nodes decided the plan after it.
  ASSERT_TRUE(WaitForLog(cluster.node(0).process(), "event=plan_decided", seconds(30)))
      << cluster.DaemonLogs();

  const int64_t before = static_cast<int64_t>(std::time(nullptr));
  ASSERT_TRUE(WriteOffset(offset_file, "+30"));
  // The step is in effect for a process under libfaketime.
  absl::StatusOr<int64_t> faked = FakedUnixSeconds(faketime_dir.path(), faked_env);
  ASSERT_TRUE(faked.ok()) << faked.status();
  EXPECT_GE(*faked - before, 29);

  for (Process& t : trainers) {
    const ExitStatus st = t.Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n"
                                           << t.Log() << cluster.DaemonLogs();
  }
  EXPECT_EQ(cluster.DaemonLogs().find("sent no heartbeat"), std::string::npos)
      << cluster.DaemonLogs();
  const std::vector<double> expected = SingleProcessReference(cluster.dir(), args);
  for (const std::string& out : outs) {
    EXPECT_LE(RelativeDifference(LoadWeights(out), expected), 1e-12) << out;
  }
}

INSTANTIATE_TEST_SUITE_P(Node, ClockStep, ::testing::Values(0, 1));

}  // namespace
}  // namespace gradsync::testing
