// Training through gradsync equals single-process training on the whole
// batch: N trainers, each on 1/N of every global batch, against
// `fault_trainer --single` on the whole batch, after 20 steps. The layout has
// several buckets (tiny caps), a tensor larger than the cap (fc1.weight)
// and 1-element tensors (fc2.bias, gate); "gate" is unused on some steps,
// by every trainer or (partly_unused cases) by some trainers only, whose
// buffer then holds stale non-zero data when marked unused;
// trainers mark gradients ready in different random orders, so the plan is
// rebuilt from rank 0's observed order after the first iteration.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

struct Case {
  int trainers;
  bool fp64;
  std::vector<std::string> args;  // shared by the trainers and the reference
  std::string name;
};

// gtest prints a parameter it does not know as raw bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (" << c.trainers << " trainers, " << (c.fp64 ? "fp64" : "fp32") << ",";
  for (const std::string& arg : c.args) *os << " " << arg;
  *os << ")";
}

class EquivalenceTest : public ::testing::TestWithParam<Case> {};

// Tiny caps: several buckets; fc1.weight (2 KiB in fp32) exceeds the cap.
const std::vector<std::string> kSmallBuckets = {"--bucket-cap-mb=0.001",
                                                "--first-bucket-cap-mb=0.0001", "--timeout-s=30"};

TEST_P(EquivalenceTest, MatchesSingleProcessOnTheWholeBatch) {
  const Case& c = GetParam();
  Daemon daemon(c.trainers, kSmallBuckets);
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();

  std::vector<std::string> args = c.args;
  args.push_back("--steps=20");
  if (c.fp64) args.push_back("--fp64");
  std::vector<Process> trainers;
  std::vector<std::string> outs;
  for (int r = 0; r < c.trainers; ++r) {
    outs.push_back(absl::StrCat(daemon.dir(), "/weights", r, ".txt"));
    std::vector<std::string> mine = args;
    mine.push_back(absl::StrCat("--shuffle-seed=", 11 + r));  // a different ready order each
    trainers.push_back(StartTrainer(daemon, r, mine, outs.back()));
  }
  for (int r = 0; r < c.trainers; ++r) {
    ExitStatus st = trainers[r].Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " code " << st.code << "\n"
                                           << trainers[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
  }

  std::vector<std::string> ref_args = {Runfile("tests/testing/fault_trainer"), "--single",
                                       "--quiet", "--out=" + daemon.dir() + "/reference.txt"};
  ref_args.insert(ref_args.end(), args.begin(), args.end());
  Process ref = Process::Spawn(ref_args, daemon.dir() + "/reference.log");
  ExitStatus rs = ref.Wait(seconds(60));
  ASSERT_TRUE(rs.exited && rs.code == 0) << ref.Log();

  const std::vector<double> expected = LoadWeights(daemon.dir() + "/reference.txt");
  ASSERT_FALSE(expected.empty());
  const double tolerance = c.fp64 ? 1e-12 : 1e-5;
  const std::vector<double> first = LoadWeights(outs[0]);
  for (int r = 0; r < c.trainers; ++r) {
    const std::vector<double> got = LoadWeights(outs[r]);
    ASSERT_EQ(got.size(), expected.size()) << "trainer " << r;
    EXPECT_LE(RelativeDifference(got, expected), tolerance) << "trainer " << r;
    // Every trainer applied the same averaged gradient: bit-identical weights.
    EXPECT_EQ(got, first) << "trainer " << r << " diverged from trainer 0";
  }
  // The plan really had several buckets.
  const std::string log = daemon.process().Log();
  EXPECT_EQ(log.find("buckets=1 "), std::string::npos) << log;
  EXPECT_NE(log.find("buckets="), std::string::npos) << log;
  // Rank 0's shuffled ready order differs from the registration order: the
  // plan was rebuilt after iteration 0 (buckets no longer contiguous), and
  // training stayed equivalent across the change.
  EXPECT_NE(log.find("event=plan_rebuilt iteration=1"), std::string::npos) << log;
}

// The example the demo runs (examples/mlp_trainer, no fault flags) trains
// through gradsync to what it trains alone, and to what the tests' trainer
// (the same model with fault flags) trains alone.
TEST(ExampleTrainerTest, TwoExampleTrainersEqualTheExampleAndTheTestTrainerOnTheWholeBatch) {
  Daemon daemon(2, kSmallBuckets);
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  const std::vector<std::string> args = {"--steps=10", "--fp64", "--accumulate=2"};
  auto argv = [&](const std::string& binary, const std::vector<std::string>& more) {
    std::vector<std::string> v = {Runfile(binary), "--quiet"};
    v.insert(v.end(), args.begin(), args.end());
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", std::to_string(r)}};
    trainers.push_back(Process::Spawn(
        argv("examples/mlp_trainer", {"--socket=" + daemon.socket(),
                                      absl::StrCat("--out=", daemon.dir(), "/w", r, ".txt")}),
        absl::StrCat(daemon.dir(), "/trainer", r, ".log"), options));
  }
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " " << st.ToString() << "\n"
                                           << trainers[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
  }
  for (const std::string binary : {"examples/mlp_trainer", "tests/testing/fault_trainer"}) {
    const std::string out = daemon.dir() + "/" + (binary[0] == 'e' ? "example" : "test") + ".txt";
    Process single = Process::Spawn(argv(binary, {"--single", "--out=" + out}), out + ".log");
    const ExitStatus st = single.Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << binary << " " << st.ToString() << single.Log();
  }
  const std::vector<double> example = LoadWeights(daemon.dir() + "/example.txt");
  ASSERT_FALSE(example.empty());
  EXPECT_EQ(LoadWeights(daemon.dir() + "/test.txt"), example);
  for (int r = 0; r < 2; ++r) {
    const std::vector<double> got = LoadWeights(absl::StrCat(daemon.dir(), "/w", r, ".txt"));
    ASSERT_EQ(got.size(), example.size()) << "trainer " << r;
    EXPECT_LE(RelativeDifference(got, example), 1e-12) << "trainer " << r;
  }
  EXPECT_EQ(LoadWeights(daemon.dir() + "/w0.txt"), LoadWeights(daemon.dir() + "/w1.txt"));
}

// Two example trainers through `daemon`, each with `args`, to completion;
// trainer r writes its final weights to <daemon dir>/w<r>.txt. *rank0_log:
// what rank 0 printed (each step it completed).
void RunTwoExampleTrainers(const Daemon& daemon, const std::vector<std::string>& args,
                           std::string* rank0_log) {
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv = {Runfile("examples/mlp_trainer"), "--socket=" + daemon.socket(),
                                     absl::StrCat("--out=", daemon.dir(), "/w", r, ".txt")};
    argv.insert(argv.end(), args.begin(), args.end());
    SpawnOptions options;
    options.env = {{"LOCAL_RANK", std::to_string(r)}};
    trainers.push_back(
        Process::Spawn(argv, absl::StrCat(daemon.dir(), "/trainer", r, ".log"), options));
  }
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = trainers[r].Wait(seconds(60));
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " " << st.ToString() << "\n"
                                           << trainers[r].Log() << "\ndaemon:\n"
                                           << daemon.process().Log();
  }
  *rank0_log = trainers[0].Log();
}

// The restart-everything path (tests/bench/elastic_recovery_bench.py's
// baseline): a job of two example trainers stops after 6 steps with rank
// 0's --checkpoint; a new daemon and two new trainers resume from it to
// step 12 and end where one process training 12 steps on the whole batch
// ends.
TEST(ExampleTrainerTest, TrainersRestartedFromTheCheckpointEndWhereAnUninterruptedRunEnds) {
  Daemon first(2, kSmallBuckets);
  ASSERT_TRUE(first.WaitReady(seconds(10))) << first.process().Log();
  const std::string checkpoint = first.dir() + "/checkpoint.txt";
  std::string log;
  RunTwoExampleTrainers(first, {"--steps=6", "--fp64", "--checkpoint=" + checkpoint}, &log);
  if (::testing::Test::HasFatalFailure()) return;
  Daemon second(2, kSmallBuckets);
  ASSERT_TRUE(second.WaitReady(seconds(10))) << second.process().Log();
  RunTwoExampleTrainers(second, {"--steps=12", "--fp64", "--checkpoint=" + checkpoint}, &log);
  if (::testing::Test::HasFatalFailure()) return;
  // It resumed at step 6 (12 steps from the start would end at the same
  // weights).
  EXPECT_NE(log.find("step   6  loss"), std::string::npos) << log;
  EXPECT_EQ(log.find("step   5  loss"), std::string::npos) << log;

  const std::string out = second.dir() + "/single.txt";
  Process single = Process::Spawn({Runfile("examples/mlp_trainer"), "--quiet", "--single",
                                   "--steps=12", "--fp64", "--out=" + out},
                                  out + ".log");
  const ExitStatus st = single.Wait(seconds(60));
  ASSERT_TRUE(st.exited && st.code == 0) << st.ToString() << single.Log();
  const std::vector<double> want = LoadWeights(out);
  ASSERT_FALSE(want.empty());
  for (int r = 0; r < 2; ++r) {
    const std::vector<double> got = LoadWeights(absl::StrCat(second.dir(), "/w", r, ".txt"));
    ASSERT_EQ(got.size(), want.size()) << "trainer " << r;
    EXPECT_LE(RelativeDifference(got, want), 1e-12) << "trainer " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Trainers, EquivalenceTest,
    ::testing::Values(Case{1, true, {"--gate-every=3"}, "one_fp64"},
                      Case{2, true, {"--gate-every=3"}, "two_fp64"},
                      Case{4, true, {"--gate-every=3"}, "four_fp64"},
                      Case{1, false, {"--gate-every=3"}, "one_fp32"},
                      Case{2, false, {"--gate-every=3"}, "two_fp32"},
                      Case{4, false, {"--gate-every=3"}, "four_fp32"},
                      // no_sync: 4 accumulation steps + 1 synced step per optimizer step
                      // equal one step on the 5 concatenated micro-batches.
                      Case{2, true, {"--accumulate=5"}, "no_sync_two_fp64"},
                      Case{4, false, {"--accumulate=5", "--gate-every=2"}, "no_sync_four_fp32"},
                      // On every second step samples [0, 32) of the 64 skip the gate: rank 0
                      // of 2 (ranks 0-1 of 4) mark it unused over a buffer left holding 0.75,
                      // the others ready. Unused must contribute zeros, not what is there.
                      Case{2,
                           true,
                           {"--gate-every=2", "--gate-unused-first=32", "--stale-unused"},
                           "partly_unused_stale_two_fp64"},
                      Case{4,
                           false,
                           {"--gate-every=2", "--gate-unused-first=32", "--stale-unused"},
                           "partly_unused_stale_four_fp32"},
                      Case{4,
                           false,
                           {"--accumulate=3", "--gate-every=2", "--gate-unused-first=32",
                            "--stale-unused"},
                           "partly_unused_stale_no_sync_four_fp32"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace gradsync::testing
