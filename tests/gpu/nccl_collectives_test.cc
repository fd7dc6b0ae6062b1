// The NCCL CollectiveGroup (gpu/nccl_collectives). The first tests run on
// every machine (they stop before any device is touched); the rest need a
// CUDA device and skip without one, saying why. With one GPU (the GPU test
// node) NCCL cannot put two ranks on it, so the failure paths are exercised
// with nranks = 2 and a rank that never joins; the tests with a second rank
// need two GPUs.
#include "gpu/nccl_collectives.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/monotonic.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_presence.h"

namespace gradsync::gpu {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The rendezvous store's contract for the unique id: publish once, fetch
// waits until the key exists or the deadline passes.
class InProcessStore {
 public:
  absl::Status Publish(const std::string& key, const std::string& value) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!values_.emplace(key, value).second) {
      return absl::AlreadyExistsError("key " + key + " published twice");
    }
    cv_.notify_all();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Fetch(const std::string& key, absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = values_.find(key);
      if (it != values_.end()) return it->second;
      const absl::Duration left = deadline - MonotonicNow();  // fetch deadlines are monotonic
      if (left <= absl::ZeroDuration()) return absl::DeadlineExceededError("no " + key);
      ++fetches_waited_;
      cv_.notify_all();  // for WaitUntilAFetchWaits
      cv_.wait_for(lock, absl::ToChronoNanoseconds(left));
    }
  }
  int published() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(values_.size());
  }
  // The tests order events on these states, never on a guessed delay; false
  // when `timeout` passes first.
  bool WaitUntilPublished(int count, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return static_cast<int>(values_.size()) >= count; });
  }
  bool WaitUntilAFetchWaits(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return fetches_waited_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  int64_t fetches_waited_ = 0;  // times a Fetch found no value and waited
};

CollectiveOptions Options(InProcessStore* store, std::vector<DeviceId> devices, int nranks,
                          int first_rank, uint64_t generation, absl::Duration timeout) {
  CollectiveOptions o;
  o.nranks = nranks;
  o.first_rank = first_rank;
  o.devices = std::move(devices);
  o.generation = generation;
  o.timeout = timeout;
  o.publish = [store](const std::string& k, const std::string& v) { return store->Publish(k, v); };
  o.fetch = [store](const std::string& k, absl::Time d) { return store->Fetch(k, d); };
  return o;
}

constexpr char kSomeGpu[] = "GPU-00000000-0000-0000-0000-000000000000";

// ---- Without a device --------------------------------------------------

TEST(NcclCollectivesOptionsTest, CreatingWhileCancelledReturnsPromptly) {
  InProcessStore store;
  CollectiveOptions o = Options(&store, {kSomeGpu}, 2, 0, 1, absl::Seconds(60));
  o.cancelled = [] { return true; };
  const Clock::time_point start = Clock::now();
  auto group = CreateNcclCollectives(o);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kCancelled) << group.status();
  EXPECT_LT(SecondsSince(start), 1.0);
  EXPECT_EQ(store.published(), 0);
}

TEST(NcclCollectivesOptionsTest, RefusesNcclCommId) {
  InProcessStore store;
  setenv("NCCL_COMM_ID", "127.0.0.1:12345", 1);
  auto group = CreateNcclCollectives(Options(&store, {kSomeGpu}, 1, 0, 1, absl::Seconds(5)));
  unsetenv("NCCL_COMM_ID");
  EXPECT_EQ(group.status().code(), absl::StatusCode::kFailedPrecondition) << group.status();
  EXPECT_NE(group.status().message().find("NCCL_COMM_ID"), absl::string_view::npos);
}

TEST(NcclCollectivesOptionsTest, RejectsBadOptions) {
  InProcessStore store;
  const absl::Duration t = absl::Seconds(5);
  for (const CollectiveOptions& o : {
           Options(&store, {kSomeGpu}, 0, 0, 1, t),            // nranks < 1
           Options(&store, {}, 1, 0, 1, t),                    // no devices
           Options(&store, {kSomeGpu, kSomeGpu}, 2, 0, 1, t),  // one GPU twice
           Options(&store, {kSomeGpu}, 2, 2, 1, t),            // rank out of range
           Options(&store, {kSomeGpu}, 1, 0, 1, absl::ZeroDuration()),
       }) {
    auto group = CreateNcclCollectives(o);
    EXPECT_EQ(group.status().code(), absl::StatusCode::kInvalidArgument) << group.status();
  }
  CollectiveOptions no_publish = Options(&store, {kSomeGpu}, 2, 0, 1, t);
  no_publish.publish = nullptr;
  EXPECT_EQ(CreateNcclCollectives(no_publish).status().code(), absl::StatusCode::kInvalidArgument);
}

// Here: no device (kUnavailable) or no NCCL (kFailedPrecondition); on a GPU
// machine: no GPU with that UUID (kInvalidArgument). Never a crash.
TEST(NcclCollectivesOptionsTest, UnknownDeviceIsAnError) {
  InProcessStore store;
  auto group = CreateNcclCollectives(Options(&store, {kSomeGpu}, 1, 0, 1, absl::Seconds(5)));
  ASSERT_FALSE(group.ok());
  const absl::StatusCode code = group.status().code();
  EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
              code == absl::StatusCode::kFailedPrecondition ||
              code == absl::StatusCode::kInvalidArgument)
      << group.status();
}

// ---- On a device ----------------------------------------------------------

#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

std::string Uuid(int ordinal) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) return "";
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    absl::StrAppendFormat(&s, "%02x", b[i]);
  }
  return s;
}

class NcclCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GS_SKIP_UNLESS_GPU();
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    for (int i = 0; i < std::min(count, 2); ++i) uuids_.push_back(Uuid(i));
  }

  // Fills `count` floats with `value` on `ordinal`.
  float* Filled(int ordinal, size_t count, float value) {
    std::vector<float> host(count, value);
    void* p = nullptr;
    if (cudaSetDevice(ordinal) != cudaSuccess || cudaMalloc(&p, count * sizeof(float)) != 0 ||
        cudaMemcpy(p, host.data(), count * sizeof(float), cudaMemcpyHostToDevice) != 0 ||
        cudaDeviceSynchronize() != cudaSuccess) {
      ADD_FAILURE() << "cuda setup on ordinal " << ordinal;
      return nullptr;
    }
    return static_cast<float*>(p);
  }
  // Counts elements of `p` that differ from `want`.
  size_t Wrong(int ordinal, const float* p, size_t count, float want) {
    std::vector<float> host(count);
    cudaSetDevice(ordinal);
    if (cudaMemcpy(host.data(), p, count * sizeof(float), cudaMemcpyDeviceToHost) != 0) {
      return count;
    }
    size_t wrong = 0;
    for (float v : host) wrong += v != want;
    return wrong;
  }

  std::vector<DeviceId> uuids_;
  InProcessStore store_;
};

TEST_F(NcclCollectivesTest, OneRankSumIsTheInput) {
  auto group = CreateNcclCollectives(Options(&store_, {uuids_[0]}, 1, 0, 1, absl::Seconds(60)));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(store_.published(), 0);  // all ranks local: nothing to exchange
  for (size_t count : {size_t{1}, size_t{(1 << 20) + 3}}) {
    float* p = Filled(0, count, 3.5f);
    ASSERT_NE(p, nullptr);
    absl::Status s = (*group)->AllreduceSum({DeviceBuffer{0, p, count}}, DType::kFloat32);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(Wrong(0, p, count, 3.5f), 0u) << count;
    cudaFree(p);
  }
}

TEST_F(NcclCollectivesTest, TwoLocalRanksSum) {
  GS_SKIP_UNLESS_GPUS(uuids_.size(), 2u);
  auto group = CreateNcclCollectives(Options(&store_, uuids_, 2, 0, 1, absl::Seconds(60)));
  ASSERT_TRUE(group.ok()) << group.status();
  const size_t count = (1 << 20) + 3;
  float* a = Filled(0, count, 1.0f);
  float* b = Filled(1, count, 2.0f);
  absl::Status s = (*group)->AllreduceSum({DeviceBuffer{0, a, count}, DeviceBuffer{1, b, count}},
                                          DType::kFloat32);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Wrong(0, a, count, 3.0f), 0u);
  EXPECT_EQ(Wrong(1, b, count, 3.0f), 0u);
  cudaSetDevice(0);
  cudaFree(a);
  cudaSetDevice(1);
  cudaFree(b);
}

// ncclBroadcast of bytes (gs_broadcast's device pieces): one rank keeps
// its bytes, an odd count included; a root outside the group is refused.
TEST_F(NcclCollectivesTest, OneRankBroadcastKeepsTheRootsBytes) {
  auto group = CreateNcclCollectives(Options(&store_, {uuids_[0]}, 1, 0, 1, absl::Seconds(60)));
  ASSERT_TRUE(group.ok()) << group.status();
  const size_t count = (1 << 20) + 3;
  float* p = Filled(0, count, 7.25f);
  ASSERT_NE(p, nullptr);
  absl::Status s = (*group)->Broadcast({DeviceBuffer{0, p, count * sizeof(float)}}, 0);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Wrong(0, p, count, 7.25f), 0u);
  EXPECT_EQ((*group)->Broadcast({DeviceBuffer{0, p, 4}}, 1).code(),
            absl::StatusCode::kInvalidArgument);
  cudaFree(p);
}

TEST_F(NcclCollectivesTest, TwoLocalRanksBroadcastFromRankOne) {
  GS_SKIP_UNLESS_GPUS(uuids_.size(), 2u);
  auto group = CreateNcclCollectives(Options(&store_, uuids_, 2, 0, 1, absl::Seconds(60)));
  ASSERT_TRUE(group.ok()) << group.status();
  const size_t count = (1 << 20) + 3;
  float* a = Filled(0, count, 1.0f);
  float* b = Filled(1, count, 2.0f);
  absl::Status s = (*group)->Broadcast(
      {DeviceBuffer{0, a, count * sizeof(float)}, DeviceBuffer{1, b, count * sizeof(float)}}, 1);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Wrong(0, a, count, 2.0f), 0u);
  EXPECT_EQ(Wrong(1, b, count, 2.0f), 0u);
  cudaSetDevice(0);
  cudaFree(a);
  cudaSetDevice(1);
  cudaFree(b);
}

// The review's one-GPU test: rank 1 never joins. Creation times out within
// the timeout (waiting, before init, for rank 1's arrival), and a fresh
// generation then works.
TEST_F(NcclCollectivesTest, RankThatNeverJoinsTimesOutThenAFreshGenerationWorks) {
  const absl::Duration timeout = absl::Seconds(4);
  const int leaked_before = LeakedBootstrapRoots();
  const Clock::time_point start = Clock::now();
  auto group = CreateNcclCollectives(Options(&store_, {uuids_[0]}, 2, 0, 7, timeout));
  const double elapsed = SecondsSince(start);
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
  EXPECT_GE(elapsed, 3.9);
  EXPECT_LT(elapsed, 4.0 + 10.0) << "abort took too long";
  EXPECT_EQ(store_.published(), 2);  // the id and rank 0's arrival, under generation 7's keys
  EXPECT_EQ(LeakedBootstrapRoots(), leaked_before + 1);  // its root never saw rank 1

  auto fresh = CreateNcclCollectives(Options(&store_, {uuids_[0]}, 1, 0, 8, timeout));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  float* p = Filled(0, 1024, 2.0f);
  ASSERT_NE(p, nullptr);
  absl::Status s = (*fresh)->AllreduceSum({DeviceBuffer{0, p, 1024}}, DType::kFloat32);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(Wrong(0, p, 1024, 2.0f), 0u);
  cudaFree(p);
}

TEST_F(NcclCollectivesTest, CancellingDuringInitReturnsPromptly) {
  std::atomic<bool> cancel{false};
  CollectiveOptions o = Options(&store_, {uuids_[0]}, 2, 0, 9, absl::Seconds(60));
  o.cancelled = [&] { return cancel.load(); };
  // Rank 0 publishes the id, then waits for rank 1 to arrive: cancel then.
  bool init_under_way = false;
  std::thread canceller([&] {
    init_under_way = store_.WaitUntilPublished(1, std::chrono::seconds(30));
    cancel = true;
  });
  const Clock::time_point start = Clock::now();
  auto group = CreateNcclCollectives(o);
  const double elapsed = SecondsSince(start);
  canceller.join();
  EXPECT_TRUE(init_under_way) << "rank 0 never published the id";
  EXPECT_EQ(group.status().code(), absl::StatusCode::kCancelled) << group.status();
  EXPECT_LT(elapsed, 5.0);
}

TEST_F(NcclCollectivesTest, CancellingWhileWaitingForTheIdReturnsPromptly) {
  std::atomic<bool> cancel{false};
  // Rank 1 of 2: waits for an id nobody publishes.
  CollectiveOptions o = Options(&store_, {uuids_[0]}, 2, 1, 10, absl::Seconds(60));
  o.cancelled = [&] { return cancel.load(); };
  bool waiting = false;
  std::thread canceller([&] {
    waiting = store_.WaitUntilAFetchWaits(std::chrono::seconds(30));
    cancel = true;
  });
  const Clock::time_point start = Clock::now();
  auto group = CreateNcclCollectives(o);
  const double elapsed = SecondsSince(start);
  canceller.join();
  EXPECT_TRUE(waiting) << "rank 1 never waited for the id";
  EXPECT_EQ(group.status().code(), absl::StatusCode::kCancelled) << group.status();
  EXPECT_LT(elapsed, 2.0);
}

TEST_F(NcclCollectivesTest, WaitingForAnIdThatNeverComesTimesOut) {
  const Clock::time_point start = Clock::now();
  auto group = CreateNcclCollectives(Options(&store_, {uuids_[0]}, 2, 1, 11, absl::Seconds(2)));
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
  EXPECT_LT(SecondsSince(start), 4.0);
}

// One GPU: a one-rank collective is over in microseconds, so Abort races
// with a loop of them; whichever call sees it (in flight or the next one)
// must fail with kAborted promptly, and so must every later call.
TEST_F(NcclCollectivesTest, AbortFromAnotherThreadFailsPromptly) {
  auto group = CreateNcclCollectives(Options(&store_, {uuids_[0]}, 1, 0, 12, absl::Seconds(60)));
  ASSERT_TRUE(group.ok()) << group.status();
  const size_t count = 64 << 20;  // 256 MiB
  float* p = Filled(0, count, 1.0f);
  ASSERT_NE(p, nullptr);
  std::atomic<int64_t> aborted_at{0};
  std::atomic<int> calls{0};
  std::thread aborter([&] {
    // Once a collective has completed: the loop is running them.
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
    while (calls.load() == 0 && Clock::now() < deadline) std::this_thread::yield();
    aborted_at = Clock::now().time_since_epoch().count();
    (*group)->Abort("test abort");
  });
  absl::Status s;
  const Clock::time_point start = Clock::now();
  while (s.ok() && SecondsSince(start) < 30) {
    s = (*group)->AllreduceSum({DeviceBuffer{0, p, count}}, DType::kFloat32);
    calls.fetch_add(1);
  }
  const Clock::time_point failed = Clock::now();
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s << " after " << calls.load() << " calls";
  EXPECT_NE(s.message().find("test abort"), absl::string_view::npos) << s;
  const double latency =
      std::chrono::duration<double>(failed.time_since_epoch() - Clock::duration(aborted_at.load()))
          .count();
  EXPECT_LT(latency, 2.0);
  absl::Status again = (*group)->AllreduceSum({DeviceBuffer{0, p, count}}, DType::kFloat32);
  EXPECT_EQ(again.code(), absl::StatusCode::kAborted) << again;
  group->reset();  // aborted: destruction must not finalize
  cudaFree(p);
}

TEST_F(NcclCollectivesTest, RejectsBadBuffersWithoutFailingTheGroup) {
  auto group = CreateNcclCollectives(Options(&store_, {uuids_[0]}, 1, 0, 13, absl::Seconds(60)));
  ASSERT_TRUE(group.ok()) << group.status();
  float* p = Filled(0, 16, 1.0f);
  EXPECT_EQ((*group)->AllreduceSum({}, DType::kFloat32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*group)->AllreduceSum({DeviceBuffer{1, p, 16}}, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*group)->AllreduceSum({DeviceBuffer{0, nullptr, 16}}, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
#ifndef NDEBUG
  std::vector<float> host(16);
  EXPECT_EQ((*group)->AllreduceSum({DeviceBuffer{0, host.data(), 16}}, DType::kFloat32).code(),
            absl::StatusCode::kInvalidArgument);
#endif
  absl::Status s = (*group)->AllreduceSum({DeviceBuffer{0, p, 16}}, DType::kFloat32);
  EXPECT_TRUE(s.ok()) << s;
  cudaFree(p);
}

// Two GPUs, one rank each in its own group (two threads, as two daemons
// would be): rank 1 skips a collective, so rank 0's kernel spins on it
// until Abort; the abort must stop it promptly.
TEST_F(NcclCollectivesTest, AbortStopsACollectiveThatAPeerSkipped) {
  GS_SKIP_UNLESS_GPUS(uuids_.size(), 2u);
  std::unique_ptr<CollectiveGroup> groups[2];
  absl::Status created[2];
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto g = CreateNcclCollectives(Options(&store_, {uuids_[r]}, 2, r, 14, absl::Seconds(60)));
        created[r] = g.status();
        if (g.ok()) groups[r] = std::move(*g);
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_TRUE(created[0].ok()) << created[0];
  ASSERT_TRUE(created[1].ok()) << created[1];
  float* p = Filled(0, 1 << 20, 1.0f);
  // Aborts once rank 0 has entered the collective. Whether its kernel is
  // already spinning is not observable from outside the group; either way
  // the call must end kAborted (a call after Abort fails too: see above).
  std::atomic<bool> entered{false};
  std::thread aborter([&] {
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
    while (!entered.load() && Clock::now() < deadline) std::this_thread::yield();
    groups[0]->Abort("peer skipped");
  });
  const Clock::time_point start = Clock::now();
  entered.store(true);
  absl::Status s = groups[0]->AllreduceSum({DeviceBuffer{0, p, 1 << 20}}, DType::kFloat32);
  const double elapsed = SecondsSince(start);
  aborter.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_LT(elapsed, 5.0);
  groups[1]->Abort("test over");
  groups[0].reset();
  groups[1].reset();
  cudaSetDevice(0);
  cudaFree(p);
}

}  // namespace
}  // namespace gradsync::gpu
