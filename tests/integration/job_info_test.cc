// gs_get_job_info with real daemons and trainer processes
// (tests/integration/job_info_trainer.c): after every gs_wait each trainer
// of every node reads the same job-wide iteration count, the world size its
// sum was divided by (it shrinks when trainers gs_join asking to divide by
// the active trainers) and its own global rank; the printed average proves
// the reported world size is the divisor the daemon used.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/integration/cluster.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);

struct Case {
  std::vector<int> steps;  // per global rank: synchronized iterations before gs_join
  bool divide_by_active;
  std::string name;
};

Process StartReporter(const Daemon& daemon, int local_rank, const Case& c) {
  std::vector<std::string> argv = {Runfile("tests/integration/job_info_trainer"),
                                   "--socket=" + daemon.socket(),
                                   "--join-steps=" + absl::StrJoin(c.steps, ",")};
  if (c.divide_by_active) argv.push_back("--divide-by-active");
  SpawnOptions options;
  options.env = {{"LOCAL_RANK", std::to_string(local_rank)}};
  return Process::Spawn(
      argv, absl::StrCat(daemon.dir(), "/job_info", local_rank, ".", rand(), ".log"), options);
}

// What global rank `rank` must print: before the first iteration the job's
// world size; after iteration k (1-based) the trainers still active in it
// (or the whole world when dividing by the initial world size), and their
// contributions (rank + 1 each) divided by that.
std::vector<std::string> Expected(const Case& c, int rank) {
  const int world = static_cast<int>(c.steps.size());
  std::vector<std::string> lines = {
      absl::StrCat("job rank=", rank, " iteration=0 world_size=", world, " average=0")};
  for (int k = 1; k <= c.steps[rank]; ++k) {
    int active = 0, sum = 0;
    for (int r = 0; r < world; ++r) {
      if (c.steps[r] < k) continue;
      ++active;
      sum += r + 1;
    }
    const int divisor = c.divide_by_active ? active : world;
    char average[32];
    std::snprintf(average, sizeof(average), "%g", static_cast<float>(sum) / divisor);
    lines.push_back(absl::StrCat("job rank=", rank, " iteration=", k, " world_size=", divisor,
                                 " average=", average));
  }
  return lines;
}

std::vector<std::string> JobLines(const std::string& log) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StartsWith(line, "job ")) out.emplace_back(line);
  }
  return out;
}

void ExpectReports(std::vector<Process>& ps, const Case& c, const std::string& logs) {
  for (size_t r = 0; r < ps.size(); ++r) {
    const ExitStatus st = ps[r].Wait(kBound);
    ASSERT_TRUE(st.exited && st.code == 0) << "trainer " << r << " " << st.ToString() << "\n"
                                           << ps[r].Log() << "\n"
                                           << logs;
    EXPECT_EQ(JobLines(ps[r].Log()), Expected(c, static_cast<int>(r))) << "trainer " << r << "\n"
                                                                       << ps[r].Log();
  }
}

class JobInfoOneNodeTest : public ::testing::TestWithParam<Case> {};

TEST_P(JobInfoOneNodeTest, EveryTrainerSeesTheIterationWorldAndRank) {
  const Case& c = GetParam();
  const int n = static_cast<int>(c.steps.size());
  Daemon daemon(n, {"--timeout-s=30"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  std::vector<Process> ps;
  for (int r = 0; r < n; ++r) ps.push_back(StartReporter(daemon, r, c));
  ExpectReports(ps, c, daemon.process().Log());
}

INSTANTIATE_TEST_SUITE_P(
    JobInfo, JobInfoOneNodeTest,
    ::testing::Values(Case{{5, 4, 2}, true, "world_shrinks_as_trainers_join"},
                      Case{{5, 4, 2}, false, "divide_by_initial_world_size_keeps_it"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Two daemons, two trainers each (global ranks node-major): the same
// numbers on both nodes, node 1's trainers joining at different iterations.
class JobInfoTwoNodesTest : public ::testing::TestWithParam<Case> {};

TEST_P(JobInfoTwoNodesTest, EveryTrainerOfEveryNodeSeesTheSame) {
  const Case& c = GetParam();
  ClusterOptions options;
  options.local_size = 2;
  options.job_id = "jobinfojob";
  options.flags = {"--timeout-s=30", "--uneven-inputs"};
  Cluster cluster(options);
  ASSERT_TRUE(cluster.Start()) << cluster.DaemonLogs();
  std::vector<Process> ps;
  for (int n = 0; n < 2; ++n) {
    for (int r = 0; r < 2; ++r) ps.push_back(StartReporter(cluster.node(n), r, c));
  }
  ExpectReports(ps, c, cluster.DaemonLogs());
}

INSTANTIATE_TEST_SUITE_P(
    JobInfo, JobInfoTwoNodesTest,
    ::testing::Values(Case{{6, 5, 2, 4}, true, "world_shrinks_as_trainers_join"},
                      Case{{6, 5, 2, 4}, false, "divide_by_initial_world_size_keeps_it"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace gradsync::testing
