// GatedDaemonDevice over the simulated device: memory work on a GPU waits
// for the collectives in flight there (the simulation underneath refuses
// any overlap, as CUDA + NCCL could deadlock on it), and collectives wait
// for memory work. Two "nodes" in one process (threads) form the group, so
// a collective stays in flight until the test lets the peer join.
#include "gpu/gated_daemon_device.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/monotonic.h"
#include "gmock/gmock.h"
#include "gpu/sim/sim_device.h"
#include "gtest/gtest.h"
#include "tests/testing/wait.h"

namespace gradsync::gpu {
namespace {

using ::gradsync::testing::WaitUntil;
using ::testing::HasSubstr;

// `host`: two nodes sharing SIM-GPU-0 need two hosts (NCCL refuses two
// ranks on one GPU of one host).
SimOptions Options(const std::string& host = "gate-node-0") {
  SimOptions o;
  o.num_gpus = 2;
  o.prefix = "gsgatetest";
  o.host = host;
  return o;
}

// The unique-id exchange of two nodes in one process.
struct Store {
  absl::Mutex mu;
  std::map<std::string, std::string> values ABSL_GUARDED_BY(mu);

  void Fill(CollectiveOptions& o) {
    o.publish = [this](const std::string& key, const std::string& value) {
      absl::MutexLock lock(&mu);
      values[key] = value;
      return absl::OkStatus();
    };
    o.fetch = [this](const std::string& key, absl::Time deadline) -> absl::StatusOr<std::string> {
      absl::MutexLock lock(&mu);
      auto published = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return values.count(key) != 0; };
      if (!mu.AwaitWithTimeout(absl::Condition(&published), deadline - MonotonicNow())) {
        return absl::DeadlineExceededError(key);
      }
      return values[key];
    };
  }
};

CollectiveOptions Group(int rank, Store* store) {
  CollectiveOptions o;
  o.nranks = 2;
  o.first_rank = rank;
  o.devices = {"SIM-GPU-0"};
  o.generation = 3;
  o.timeout = absl::Seconds(60);
  store->Fill(o);
  return o;
}

constexpr absl::Duration kBound = absl::Seconds(20);

class GatedDaemonDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sim = SimDaemonDevice::Create(Options());
    ASSERT_TRUE(sim.ok()) << sim.status();
    gated_ = std::make_unique<GatedDaemonDevice>(*std::move(sim), absl::Seconds(60));
    auto peer = SimDaemonDevice::Create(Options("gate-node-1"));
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *std::move(peer);
    absl::StatusOr<std::unique_ptr<CollectiveGroup>> peer_group;
    std::thread peer_init([&] { peer_group = peer_->CreateCollectives(Group(1, &store_)); });
    auto group = gated_->CreateCollectives(Group(0, &store_));
    peer_init.join();
    ASSERT_TRUE(group.ok()) << group.status();
    ASSERT_TRUE(peer_group.ok()) << peer_group.status();
    group_ = *std::move(group);
    peer_group_ = *std::move(peer_group);
    auto mine = gated_->Alloc("SIM-GPU-0", 4 * sizeof(float));
    auto theirs = peer_->Alloc("SIM-GPU-0", 4 * sizeof(float));
    ASSERT_TRUE(mine.ok() && theirs.ok());
    mine_ = *mine;
    theirs_ = *theirs;
    const float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
    std::memcpy(mine_, a, sizeof(a));
    std::memcpy(theirs_, b, sizeof(b));
  }

  void TearDown() override {
    group_.reset();
    peer_group_.reset();
  }

  Store store_;
  std::unique_ptr<GatedDaemonDevice> gated_;
  std::unique_ptr<SimDaemonDevice> peer_;
  std::unique_ptr<CollectiveGroup> group_, peer_group_;
  void* mine_ = nullptr;
  void* theirs_ = nullptr;
};

// Another job's allocation, free and IPC open on the GPU wait for the
// collective (the simulation would refuse them, naming the overlap), then
// succeed; the collective's result is intact.
TEST_F(GatedDaemonDeviceTest, MemoryWorkWaitsForACollectiveOnTheSameGpu) {
  absl::Status collective;
  std::thread running([&] { collective = group_->AllreduceSum({{0, mine_, 4}}, DType::kFloat32); });
  ASSERT_TRUE(WaitUntil([&] { return gated_->gate().collectives("SIM-GPU-0") == 1; }, kBound));
  // Another GPU is not held.
  absl::StatusOr<void*> elsewhere = gated_->Alloc("SIM-GPU-1", 64);
  EXPECT_TRUE(elsewhere.ok()) << elsewhere.status();

  absl::StatusOr<void*> allocated;
  std::thread allocating([&] { allocated = gated_->Alloc("SIM-GPU-0", 64); });
  ASSERT_TRUE(WaitUntil([&] { return gated_->gate().memory_waiting("SIM-GPU-0") == 1; }, kBound));
  // The peer joins: the collective completes, then the allocation runs.
  EXPECT_TRUE(peer_group_->AllreduceSum({{0, theirs_, 4}}, DType::kFloat32).ok());
  running.join();
  allocating.join();
  EXPECT_TRUE(collective.ok()) << collective;
  ASSERT_TRUE(allocated.ok()) << allocated.status();
  float got[4];
  std::memcpy(got, mine_, sizeof(got));
  EXPECT_EQ(got[0], 11.f);
  EXPECT_EQ(got[3], 44.f);
  EXPECT_TRUE(gated_->Free("SIM-GPU-0", *allocated).ok());
  EXPECT_TRUE(gated_->Free("SIM-GPU-1", *elsewhere).ok());
}

// A memory call that cannot start before its deadline says what held the
// GPU rather than risk the deadlock.
TEST_F(GatedDaemonDeviceTest, MemoryWorkPastItsWaitNamesTheBusyGpu) {
  GatedDaemonDevice impatient(*SimDaemonDevice::Create(Options()), absl::Milliseconds(50));
  impatient.gate()
      .EnterCollective({"SIM-GPU-0"}, MonotonicNow() + absl::Seconds(1), nullptr)
      .IgnoreError();
  const absl::StatusOr<void*> p = impatient.Alloc("SIM-GPU-0", 64);
  impatient.gate().ExitCollective({"SIM-GPU-0"});
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(p.status().message(), HasSubstr("GPU SIM-GPU-0 still runs 1 collective(s)"));
}

// Pinned host memory (the non-finite check's read-back) is memory work too:
// cudaHostAlloc and cudaFreeHost can wait on the device like cudaMalloc.
TEST_F(GatedDaemonDeviceTest, HostMemoryWorkWaitsForTheGpusCollectivesLikeAlloc) {
  GatedDaemonDevice impatient(*SimDaemonDevice::Create(Options()), absl::Milliseconds(50));
  const absl::StatusOr<void*> host = impatient.AllocHost("SIM-GPU-0", 64);
  ASSERT_TRUE(host.ok()) << host.status();
  impatient.gate()
      .EnterCollective({"SIM-GPU-0"}, MonotonicNow() + absl::Seconds(1), nullptr)
      .IgnoreError();
  const absl::StatusOr<void*> blocked = impatient.AllocHost("SIM-GPU-0", 64);
  const absl::Status freed = impatient.FreeHost("SIM-GPU-0", *host);
  impatient.gate().ExitCollective({"SIM-GPU-0"});
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(blocked.status().message(), HasSubstr("GPU SIM-GPU-0 still runs 1 collective(s)"));
  EXPECT_EQ(freed.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(impatient.FreeHost("SIM-GPU-0", *host).ok());
}

// Abort reaches a collective waiting behind memory work at once.
TEST_F(GatedDaemonDeviceTest, AbortEndsACollectiveWaitingForMemoryWork) {
  ASSERT_TRUE(gated_->gate()
                  .EnterMemoryWork({"SIM-GPU-0"}, MonotonicNow() + absl::Seconds(5), "test")
                  .ok());
  absl::Status collective;
  std::thread running([&] { collective = group_->AllreduceSum({{0, mine_, 4}}, DType::kFloat32); });
  group_->Abort("generation ended");
  running.join();
  gated_->gate().ExitMemoryWork({"SIM-GPU-0"});
  EXPECT_EQ(collective.code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace gradsync::gpu
