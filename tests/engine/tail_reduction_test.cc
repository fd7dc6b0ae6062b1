// The step's tail on one node: once every local trainer has marked all its
// gradients (they only wait in gs_wait now), the buckets left are reduced
// with the tail's threads; buckets reduced while backward still runs keep
// the reduce threads. Real trainer segments, the scheduler in-process.
// Results must be bit-identical to the one-thread sum (a0 + a1) / world.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/scheduler.h"
#include "tests/engine/fake_backend.h"
#include "tests/engine/in_memory_trainers.h"
#include "tests/engine/patience.h"

namespace gradsync::testing {
namespace {

// 512 KB of fp32 per tensor: above the reducer's parallel threshold, so the
// thread count it reports is the one it was given.
constexpr uint64_t kElements = 128 * 1024;

// Every finished bucket's timeline, as the scheduler reports it.
class TimelineLog : public SchedulerObserver {
 public:
  void OnBucketDone(const BucketTimeline& t) override {
    absl::MutexLock lock(&mu_);
    done_.push_back(t);
  }
  // The first `n` timelines, or fewer if they did not come within the bound.
  std::vector<BucketTimeline> WaitFor(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_.size() >= n; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&enough), Patience())) GaveUp();
    return done_;
  }

 private:
  absl::Mutex mu_;
  std::vector<BucketTimeline> done_ ABSL_GUARDED_BY(mu_);
};

class TailReductionTest : public ::testing::Test {
 protected:
  void Start(int num_nodes) {
    const Layout layout = {{"first.weight", DType::kFloat32, kElements},
                           {"last.weight", DType::kFloat32, kElements}};
    InMemoryNode::Options options;
    options.local_size = 2;
    options.caps = {kElements * 4, kElements * 4};  // one tensor per bucket
    auto node = InMemoryNode::Create("tail", layout, options);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    ASSERT_EQ(node_->plan().buckets.size(), 2u);
    backend_ = std::make_unique<FakeBackend>(num_nodes);
    Scheduler::Options opts;
    opts.world_size = 2 * num_nodes;
    opts.stall_threshold_s = 3600;
    opts.reduce_threads = 1;
    opts.tail_reduce_threads = 2;
    scheduler_ = std::make_unique<Scheduler>(
        node_->trainers(), node_->layout(), node_->plan(), node_->arena(), backend_.get(),
        node_->ready_bell(), &log_,
        [this](const absl::Status& error, int) {
          absl::MutexLock lock(&mu_);
          if (error_.ok()) error_ = error;
        },
        opts);
    scheduler_->Start();
  }
  void TearDown() override {
    if (scheduler_) scheduler_->Stop();
    scheduler_.reset();
    node_.reset();
  }

  // Random fp32 gradients (rounding matters in their sum); returns what
  // each element must become: (a0 + a1) / world in fp32, as one thread does.
  std::vector<std::vector<float>> WriteGradients(float world) {
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    std::vector<std::vector<float>> expected(2, std::vector<float>(kElements));
    for (size_t t = 0; t < 2; ++t) {
      for (uint64_t e = 0; e < kElements; ++e) {
        const float a0 = dist(gen), a1 = dist(gen);
        node_->trainer(0).Set(t, e, a0);
        node_->trainer(1).Set(t, e, a1);
        expected[t][e] = (a0 + a1) / world;
      }
    }
    return expected;
  }

  void MarkBucket(uint32_t bucket) {
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(node_->trainer(r).MarkReady(node_->plan().buckets[bucket].tensors[0]).ok());
    }
  }

  // Trainer r holds exactly `expected` (bit for bit); counts the elements off.
  size_t Mismatches(int r, const std::vector<std::vector<float>>& expected) {
    size_t wrong = 0;
    for (size_t t = 0; t < 2; ++t) {
      for (uint64_t e = 0; e < kElements; ++e) {
        if (node_->trainer(r).Get(t, e) != static_cast<double>(expected[t][e])) ++wrong;
      }
    }
    return wrong;
  }

  absl::Status error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }

  std::unique_ptr<InMemoryNode> node_;
  std::unique_ptr<FakeBackend> backend_;
  TimelineLog log_;
  std::unique_ptr<Scheduler> scheduler_;
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

TEST_F(TailReductionTest, BucketsLeftWhenEveryTrainerMarkedAllUseTheTailThreadsBitIdentically) {
  ASSERT_NO_FATAL_FAILURE(Start(/*num_nodes=*/1));
  const auto expected = WriteGradients(2.0f);
  // Bucket 0 while the other tensor is still unmarked (backward running).
  ASSERT_NO_FATAL_FAILURE(MarkBucket(0));
  ASSERT_EQ(log_.WaitFor(1).size(), 1u);
  // The last marks: both trainers are done, bucket 1 is the tail.
  ASSERT_NO_FATAL_FAILURE(MarkBucket(1));
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(node_->trainer(r).Wait(kBound).ok()) << "rank " << r;
  const std::vector<BucketTimeline> done = log_.WaitFor(2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].bucket, 0u);
  EXPECT_EQ(done[0].reduce_threads, 1u) << "bucket 0 ran while the trainers still computed";
  EXPECT_EQ(done[1].bucket, 1u);
  EXPECT_EQ(done[1].reduce_threads, 2u) << "bucket 1 ran after every trainer marked everything";
  for (int r = 0; r < 2; ++r) EXPECT_EQ(Mismatches(r, expected), 0u) << "rank " << r;
  EXPECT_TRUE(error().ok()) << error();
}

}  // namespace
}  // namespace gradsync::testing
