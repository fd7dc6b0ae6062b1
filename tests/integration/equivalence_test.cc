// Training through gradsync equals single-process training on the whole
// batch: N trainers, each on 1/N of every global batch, against
// `mlp_trainer --single` on the whole batch, after 20 steps. The layout has
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

  std::vector<std::string> ref_args = {Runfile("examples/mlp_trainer"), "--single", "--quiet",
                                       "--out=" + daemon.dir() + "/reference.txt"};
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
