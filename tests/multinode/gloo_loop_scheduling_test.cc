// Gloo's event-loop thread runs SCHED_BATCH. That thread
// busy-polls epoll while the user thread holds a pair's lock; woken by a
// peer's message it preempted the user thread mid-send and spun until the
// next scheduler tick, which set the ~4 ms floor of a cross-node 4 KB
// iteration (the benchmark, not this test, shows the time). Two real
// GlooBackends (two ranks on threads of this process, real TCP on
// loopback, Gloo's in-memory HashStore for the rendezvous) are connected;
// every thread their creation left behind must be SCHED_BATCH, the callers
// must be back to SCHED_OTHER, and an allreduce must still sum exactly.
#include <dirent.h>
#include <sched.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backends/batch_scheduling.h"
#include "daemon/backends/gloo_backend.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

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
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::unique_ptr<GlooBackend> backends[2];
  absl::Status created[2];
  int caller_policy[2] = {-1, -1};
  {
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      ranks.emplace_back([&, rank] {
        GlooBackendOptions options;
        options.node_rank = rank;
        options.num_nodes = 2;
        options.host = "127.0.0.1";
        options.generation = 1;
        options.store_prefix = "gloo";
        options.timeout = absl::Seconds(60);
        options.world_size = 2;
        options.store = store;
        absl::StatusOr<std::unique_ptr<GlooBackend>> backend = GlooBackend::Create(options);
        created[rank] = backend.status();
        if (backend.ok()) backends[rank] = std::move(*backend);
        caller_policy[rank] = SchedulingPolicyOf(0);
      });
    }
    for (std::thread& t : ranks) t.join();
  }
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
  {
    std::vector<std::thread> ranks;
    for (int rank = 0; rank < 2; ++rank) {
      data[rank].resize(kCount);
      for (size_t i = 0; i < kCount; ++i) data[rank][i] = static_cast<float>(rank + 1 + i);
      ranks.emplace_back([&, rank] {
        reduced[rank] = backends[rank]->AllreduceSum(data[rank].data(), kCount, DType::kFloat32);
      });
    }
    for (std::thread& t : ranks) t.join();
  }
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
