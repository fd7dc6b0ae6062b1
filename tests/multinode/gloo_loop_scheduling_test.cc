// Gloo's event-loop thread runs SCHED_BATCH. That thread
// busy-polls epoll while the user thread holds a pair's lock; woken by a
// peer's message it preempted the user thread mid-send and spun until the
// next scheduler tick, which set the ~4 ms floor of a cross-node 4 KB
// iteration (the benchmark, not this test, shows the time). Two real
// GlooBackends (two_gloo_backends.h) are connected;
// every thread their creation left behind must be SCHED_BATCH, the callers
// must be back to SCHED_OTHER, and an allreduce must still sum exactly.
#include <dirent.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backends/batch_scheduling.h"
#include "daemon/backends/gloo_backend.h"
#include "gtest/gtest.h"
#include "tests/multinode/two_gloo_backends.h"

namespace gradsync::testing {
namespace {

std::set<int> ThreadsOfThisProcess() {
  std::set<int> tids;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') tids.insert(std::atoi(entry->d_name));
    }
    closedir(dir);
  }
  return tids;
}

std::string ThreadName(int tid) {
  std::ifstream comm(absl::StrCat("/proc/self/task/", tid, "/comm"));
  std::string name;
  std::getline(comm, name);
  return name;
}

TEST(GlooLoopSchedulingTest, EventLoopThreadsRunBatchAndCallersStayNormal) {
  ASSERT_EQ(SchedulingPolicyOf(0), SCHED_OTHER) << "the test must start as a normal thread";
  const std::set<int> before = ThreadsOfThisProcess();
  std::unique_ptr<GlooBackend> backends[2];
  absl::Status created[2];
  int caller_policy[2] = {-1, -1};
  CreateTwoGlooBackends(backends, created,
                        [&](int rank) { caller_policy[rank] = SchedulingPolicyOf(0); });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(created[rank].ok()) << "rank " << rank << ": " << created[rank];
    EXPECT_EQ(caller_policy[rank], SCHED_OTHER)
        << "rank " << rank << "'s creating thread was left with policy " << caller_policy[rank];
  }

  // What Create left running: Gloo's event loops (the rank threads ended).
  std::vector<int> started;
  for (int tid : ThreadsOfThisProcess()) {
    if (before.count(tid) == 0) started.push_back(tid);
  }
  ASSERT_FALSE(started.empty()) << "GlooBackend::Create started no thread (no event loop?)";
  for (int tid : started) {
    EXPECT_EQ(SchedulingPolicyOf(tid), SCHED_BATCH)
        << "thread " << tid << " '" << ThreadName(tid) << "' started by GlooBackend::Create has "
        << "policy " << SchedulingPolicyOf(tid) << ", not SCHED_BATCH (" << SCHED_BATCH << ")";
  }
  EXPECT_EQ(SchedulingPolicyOf(0), SCHED_OTHER);

  // Still exact: rank r holds r + 1 + i, the sum is 3 + 2i.
  constexpr size_t kCount = 1024;
  std::vector<float> data[2];
  absl::Status reduced[2];
  for (int rank = 0; rank < 2; ++rank) {
    data[rank].resize(kCount);
    for (size_t i = 0; i < kCount; ++i) data[rank][i] = static_cast<float>(rank + 1 + i);
  }
  OnBothNodes([&](int rank) {
    reduced[rank] = backends[rank]->AllreduceSum(data[rank].data(), kCount, DType::kFloat32);
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(reduced[rank].ok()) << "rank " << rank << ": " << reduced[rank];
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(data[rank][i], static_cast<float>(3 + 2 * i))
          << "rank " << rank << " element " << i;
    }
  }
}

}  // namespace
}  // namespace gradsync::testing
