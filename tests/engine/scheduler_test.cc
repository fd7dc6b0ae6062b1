// The scheduler in-process, Gloo-style: real trainer segments and rings in
// this process, the test acting as the trainers (writing gradients, posting
// readiness entries, waiting for completions as the client does) and a fake
// backend standing in for the other nodes. The scheduler's failure reports
// are recorded as Job would receive them.
#include "daemon/engine/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_code.h"
#include "tests/engine/fake_backend.h"
#include "tests/engine/gradients.h"
#include "tests/engine/in_memory_trainers.h"
#include "tests/engine/patience.h"

namespace gradsync {
// Failure messages print the parameters by name.
void PrintTo(DType t, std::ostream* os) { *os << DTypeName(t); }
namespace testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

// The daemon's own timeout in tests that expect one; the others use kNever.
constexpr int64_t kShortTimeoutMs = 500;
// The scheduler's own timeout where its watchdog must end a hung collective.
constexpr int64_t kWatchdogTimeoutMs = 300;
constexpr int64_t kNever = 60 * 1000;
// Each other node contributes this to every element.
constexpr double kRemote = 1.5;

// What Job::Fail sees from the scheduler: the first report wins, and the
// scheduler is halted as Job does.
class FailureSink {
 public:
  Scheduler::FailFn fn() {
    return [this](const absl::Status& error, int culprit) {
      absl::MutexLock lock(&mu_);
      ++reports_;
      if (!error_.ok()) return;
      error_ = error;
      culprit_ = culprit;
      if (scheduler_ != nullptr) scheduler_->Halt();
    };
  }
  void set_scheduler(Scheduler* s) {
    absl::MutexLock lock(&mu_);
    scheduler_ = s;
  }
  // The first report, or an OK status if none came within `timeout`.
  absl::Status Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !error_.ok(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&failed), Patience(timeout))) GaveUp();
    return error_;
  }
  // The first report so far (OK: none).
  absl::Status Peek() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }
  int culprit() const {
    absl::MutexLock lock(&mu_);
    return culprit_;
  }
  int reports() const {
    absl::MutexLock lock(&mu_);
    return reports_;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int culprit_ ABSL_GUARDED_BY(mu_) = 0;
  int reports_ ABSL_GUARDED_BY(mu_) = 0;
  Scheduler* scheduler_ ABSL_GUARDED_BY(mu_) = nullptr;
};

struct NodeSetup {
  int local_size = 2;
  int num_nodes = 2;
  DType dtype = DType::kFloat32;
  BucketCaps caps;
  int64_t timeout_ms = kNever;
  Scheduler::OrderAgreement agree_order;                     // empty: this node's order
  std::function<absl::Status(const PlanStamp&)> check_plan;  // empty: one node
  bool uneven_inputs = false;  // --uneven-inputs: gs_join allowed across nodes
};

// One node under test: its trainers' segments, a fake backend for the other
// nodes, and a running scheduler.
class SchedulerFixture {
 protected:
  void StartScheduler(const NodeSetup& s) {
    setup_ = s;
    InMemoryNode::Options options;
    options.local_size = s.local_size;
    // This is the last node: global ranks differ from local ones, so a
    // message naming the wrong one shows.
    options.rank_offset = s.local_size * (s.num_nodes - 1);
    options.caps = s.caps;
    auto node = InMemoryNode::Create("sched", TestLayout(s.dtype), options);
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::move(*node);
    backend_ = std::make_unique<FakeBackend>(s.num_nodes, kRemote);
    Scheduler::Options opts;
    opts.world_size = s.local_size * s.num_nodes;
    opts.timeout_ms = s.timeout_ms;
    opts.stall_threshold_s = 3600;
    opts.reduce_threads = 2;
    opts.caps = s.caps;
    opts.agree_order = s.agree_order;
    opts.check_plan = s.check_plan;
    opts.uneven_inputs = s.uneven_inputs;
    scheduler_ = std::make_unique<Scheduler>(node_->trainers(), node_->layout(), node_->plan(),
                                             node_->arena(), backend_.get(), node_->ready_bell(),
                                             /*observer=*/nullptr, failures_.fn(), opts);
    failures_.set_scheduler(scheduler_.get());
    scheduler_->Start();
  }

  void StopScheduler() {
    // A stalled collective answers and finishes its bucket; a hung one
    // (Hang) is aborted by Stop.
    if (backend_) backend_->Release();
    if (scheduler_) scheduler_->Stop();
    scheduler_.reset();
    node_.reset();
  }

  InMemoryTrainer& trainer(int r) { return node_->trainer(r); }
  int rank(int r) const { return setup_.local_size * (setup_.num_nodes - 1) + r; }
  int world_size() const { return setup_.local_size * setup_.num_nodes; }
  double remote() const { return kRemote * (setup_.num_nodes - 1); }
  size_t tensor(const std::string& name) { return TensorIndex(node_->layout(), name); }
  std::string Name(int r) { return node_->daemon_side(r).Name(); }

  // One whole iteration; its result must be the average.
  void RunIteration(uint64_t it) {
    const Sums sums = WriteAll(it);
    MarkAll(it);
    WaitAllOk();
    for (int r = 0; r < setup_.local_size; ++r) {
      EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()))
          << "local rank " << r << ", iteration " << it;
    }
  }

  // Writes every trainer's gradients for iteration `it` and returns their sum.
  Sums WriteAll(uint64_t it) {
    Sums sums = ZeroSums(node_->layout());
    for (int r = 0; r < setup_.local_size; ++r) WriteGradients(trainer(r), rank(r), it, &sums);
    return sums;
  }

  // Marks every tensor on every trainer, trainers interleaved as concurrent
  // backward passes would, each in its own (seeded) order.
  void MarkAll(uint64_t seed, const std::vector<std::pair<int, size_t>>& skip = {}) {
    const size_t n = node_->layout().size();
    std::vector<std::vector<uint32_t>> orders;
    for (int r = 0; r < setup_.local_size; ++r) {
      std::vector<uint32_t> order = ReverseRegistrationOrder(n);
      std::mt19937 gen(static_cast<uint32_t>(seed * 31 + r));
      std::shuffle(order.begin(), order.end(), gen);
      orders.push_back(order);
    }
    for (size_t k = 0; k < n; ++k) {
      for (int r = 0; r < setup_.local_size; ++r) {
        const size_t t = orders[r][k];
        if (std::find(skip.begin(), skip.end(), std::make_pair(r, t)) != skip.end()) continue;
        ASSERT_TRUE(trainer(r).MarkReady(t).ok());
      }
    }
  }

  void WaitAllOk() {
    for (int r = 0; r < setup_.local_size; ++r) {
      absl::Status st = trainer(r).Wait(kBound);
      ASSERT_TRUE(st.ok()) << "local rank " << r << ": " << st;
    }
  }

  NodeSetup setup_;
  std::unique_ptr<InMemoryNode> node_;
  std::unique_ptr<FakeBackend> backend_;
  FailureSink failures_;
  std::unique_ptr<Scheduler> scheduler_;
};

// ---- the arithmetic: trainer counts x bucket plans x dtypes x nodes ----

enum class Plan { kTinyCaps, kTensorOverCap, kDefaultCaps };

const char* PlanName(Plan p) {
  switch (p) {
    case Plan::kTinyCaps:
      return "TinyCaps";
    case Plan::kTensorOverCap:
      return "TensorOverCap";
    case Plan::kDefaultCaps:
      return "DefaultCaps";
  }
  return "?";
}
void PrintTo(Plan p, std::ostream* os) { *os << PlanName(p); }

BucketCaps CapsFor(Plan p) {
  switch (p) {
    case Plan::kTinyCaps:
      return {256, 64};  // a few small tensors per bucket at most
    case Plan::kTensorOverCap:
      return {1024, 1024};  // embed.weight (1000 elements) does not fit
    case Plan::kDefaultCaps:
      return BucketCaps{};  // 25 MB: the whole model is one bucket
  }
  return {};
}

using AverageParam = std::tuple<int, Plan, DType, int>;  // trainers, plan, dtype, nodes

class SchedulerTest : public SchedulerFixture, public ::testing::TestWithParam<AverageParam> {
 protected:
  void SetUp() override {
    const auto [trainers, plan, dtype, nodes] = GetParam();
    NodeSetup s;
    s.local_size = trainers;
    s.num_nodes = nodes;
    s.dtype = dtype;
    s.caps = CapsFor(plan);
    StartScheduler(s);
  }
  void TearDown() override { StopScheduler(); }
};

TEST_P(SchedulerTest, AveragesEveryBucketAcrossTrainersAndNodes) {
  const auto [trainers, plan_kind, dtype, nodes] = GetParam();
  const BucketPlan plan = scheduler_->plan();
  // The plan is the one the parameter asks for.
  switch (plan_kind) {
    case Plan::kTinyCaps:
      EXPECT_GE(plan.buckets.size(), 4u);
      break;
    case Plan::kTensorOverCap: {
      const size_t embed = tensor("embed.weight");
      const PlannedBucket& b = plan.buckets[plan.bucket_of_tensor[embed]];
      EXPECT_EQ(b.tensors, std::vector<uint32_t>{static_cast<uint32_t>(embed)});
      EXPECT_GT(b.bytes, CapsFor(plan_kind).cap_bytes);
      EXPECT_GT(plan.buckets.size(), 1u);
      break;
    }
    case Plan::kDefaultCaps:
      EXPECT_EQ(plan.buckets.size(), 1u);
      break;
  }

  // Three iterations: the first in registration-planned buckets, then
  // (shuffled marks) in the rebuilt plan, whose buckets need not be
  // contiguous in the arena.
  for (uint64_t it = 0; it < 3; ++it) {
    const Sums sums = WriteAll(it);
    MarkAll(it);
    WaitAllOk();
    for (int r = 0; r < trainers; ++r) {
      EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()))
          << "local rank " << r << ", iteration " << it;
    }
    // One cross-node collective per bucket, none on a single node.
    if (it == 0) {
      EXPECT_EQ(backend_->calls().size(), nodes > 1 ? plan.buckets.size() : 0);
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_EQ(scheduler_->iteration(), 3u);
  // The rebuild happens once, after iteration 0: iterations 1 and 2 ran
  // the plan the scheduler holds now.
  EXPECT_EQ(backend_->calls().size(),
            nodes > 1 ? plan.buckets.size() + 2 * scheduler_->plan().buckets.size() : 0);
  EXPECT_TRUE(failures_.Peek().ok()) << failures_.Peek();
}

std::string AverageName(const ::testing::TestParamInfo<AverageParam>& info) {
  const auto [trainers, plan, dtype, nodes] = info.param;
  return absl::StrCat(trainers, "Trainers_", PlanName(plan), "_", DTypeName(dtype), "_", nodes,
                      "Nodes");
}

INSTANTIATE_TEST_SUITE_P(TrainersPlansDtypes, SchedulerTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(Plan::kTinyCaps, Plan::kTensorOverCap,
                                                              Plan::kDefaultCaps),
                                            ::testing::Values(DType::kFloat32, DType::kFloat64,
                                                              DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(1, 2)),
                         AverageName);

// ---- order, overlap and the iteration's life, on one setup ----

class SchedulerBehaviourTest : public SchedulerFixture, public ::testing::Test {
 protected:
  void TearDown() override { StopScheduler(); }
  // Two trainers on the second of two nodes (global ranks 2 and 3).
  void Start(int64_t timeout_ms = kNever, BucketCaps caps = {256, 64}, bool uneven_inputs = false) {
    NodeSetup s;
    s.timeout_ms = timeout_ms;
    s.caps = caps;
    s.uneven_inputs = uneven_inputs;
    StartScheduler(s);
  }
};

TEST_F(SchedulerBehaviourTest, LaunchesBucketsInPlanOrderAsSoonAsEachIsComplete) {
  // One tensor per bucket: the collectives' sizes say which bucket ran.
  ASSERT_NO_FATAL_FAILURE(Start(kNever, {4, 4}));
  const BucketPlan plan = scheduler_->plan();
  ASSERT_EQ(plan.buckets.size(), 6u);
  auto numel = [&](uint32_t b) { return node_->layout()[plan.buckets[b].tensors[0]].numel; };
  const Sums sums = WriteAll(0);

  // Bucket 1 is complete first; it must still wait for bucket 0.
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(trainer(r).MarkReady(plan.buckets[1].tensors[0]).ok());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(trainer(r).MarkReady(plan.buckets[0].tensors[0]).ok());
  // Both run while the rest of backward has not produced its gradients.
  ASSERT_TRUE(backend_->WaitForCalls(2, kBound));
  std::vector<FakeBackend::Call> calls = backend_->calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].count, numel(0));
  EXPECT_EQ(calls[1].count, numel(1));

  for (uint32_t b = 2; b < 6; ++b) {
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(trainer(r).MarkReady(plan.buckets[b].tensors[0]).ok());
  }
  WaitAllOk();
  calls = backend_->calls();
  ASSERT_EQ(calls.size(), 6u);
  for (uint32_t b = 0; b < 6; ++b) EXPECT_EQ(calls[b].count, numel(b)) << "call " << b;
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()));
}

// The per-iteration agreement (trainer counts, no_sync counts, config
// versions) costs no exchange of its own without --uneven-inputs: it rides
// with each iteration's first collective, and only that one. With the flag
// the divisor depends on it before anything is written back, so it stays
// a separate exchange ahead of the first bucket.
TEST_F(SchedulerBehaviourTest, AgreementRidesWithEachIterationsFirstCollectiveOnlyWithoutUneven) {
  for (bool uneven : {false, true}) {
    ASSERT_NO_FATAL_FAILURE(Start(kNever, {256, 64}, uneven));
    const size_t buckets = node_->plan().buckets.size();
    ASSERT_GT(buckets, 1u);
    for (uint64_t it = 0; it < 3; ++it) {
      const Sums sums = WriteAll(it);
      MarkAll(it);
      WaitAllOk();
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()))
            << "uneven " << uneven << " iteration " << it << " local rank " << r;
      }
    }
    const std::vector<FakeBackend::Call> calls = backend_->calls();
    size_t first = 0;
    for (uint64_t it = 0; it < 3; ++it) {
      const size_t n = scheduler_->plan().buckets.size();  // rebuilt after iteration 0
      const size_t in_it = it == 0 ? buckets : n;
      ASSERT_LE(first + in_it, calls.size());
      for (size_t c = first; c < first + in_it; ++c) {
        EXPECT_EQ(calls[c].with_counts, !uneven && c == first)
            << "uneven " << uneven << " iteration " << it << " call " << c - first;
      }
      first += in_it;
    }
    EXPECT_EQ(calls.size(), first);
    EXPECT_TRUE(failures_.Peek().ok()) << failures_.Peek();
    StopScheduler();
  }
}

// Uneven inputs: a joined trainer counts as zeros. Its arena holds a
// pattern that would poison any sum it entered, and keeps it: the local sum
// skips it and the write-back leaves it alone. The divisor stays the world
// size (divide_by_initial_world_size). Once the others join too, everyone
// is told and nothing more is reduced.
TEST_F(SchedulerBehaviourTest, JoinedTrainerIsNeitherSummedNorWrittenBack) {
  Start(kNever, {256, 64}, /*uneven_inputs=*/true);
  RunIteration(0);
  ASSERT_TRUE(trainer(1).PostJoin(true).ok());
  const size_t arena_bytes = node_->arena().total_bytes;
  std::memset(trainer(1).arena(), 0x7f, arena_bytes);  // NaN in fp32/fp64
  for (uint64_t it = 1; it < 3; ++it) {
    Sums sums = ZeroSums(node_->layout());
    WriteGradients(trainer(0), rank(0), it, &sums);
    for (size_t t = 0; t < node_->layout().size(); ++t) ASSERT_TRUE(trainer(0).MarkReady(t).ok());
    ASSERT_TRUE(trainer(0).Wait(kBound).ok());
    EXPECT_TRUE(HoldsAverage(trainer(0), sums, remote(), world_size())) << "iteration " << it;
  }
  for (size_t i = 0; i < arena_bytes; ++i) {
    ASSERT_EQ(trainer(1).arena()[i], 0x7f) << "byte " << i << " of the joined trainer's arena";
  }
  const size_t calls = backend_->calls().size();
  ASSERT_TRUE(trainer(0).PostJoin(true).ok());
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(trainer(r).Wait(kBound).ok()) << "local rank " << r;
  EXPECT_TRUE(scheduler_->all_joined());
  EXPECT_EQ(scheduler_->active_trainers(), 0u);
  EXPECT_EQ(backend_->calls().size(), calls) << "a bucket was reduced after every trainer joined";
  EXPECT_TRUE(failures_.Peek().ok()) << failures_.Peek();
}

// Across nodes the per-iteration count exchange is opt-in: without
// --uneven-inputs a gs_join fails the job with STATE naming the trainer and
// the flag, and no iteration ever paid for an exchange.
TEST_F(SchedulerBehaviourTest, JoinAcrossNodesWithoutUnevenInputsFailsWithStateNamingTheFlag) {
  ASSERT_NO_FATAL_FAILURE(Start());
  RunIteration(0);
  const size_t calls = backend_->calls().size();
  EXPECT_EQ(calls, node_->plan().buckets.size()) << "one collective per bucket, no count exchange";
  ASSERT_TRUE(trainer(1).PostJoin(true).ok());
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::STATE) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(absl::StrCat(Name(1), " called gs_join")));
  EXPECT_THAT(std::string(st.message()), HasSubstr("--uneven-inputs"));
  EXPECT_EQ(failures_.culprit(), 1);
}

TEST_F(SchedulerBehaviourTest, NoSyncIterationsAccumulateAndTheNextSyncedOneAveragesTheSum) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Sums sums = WriteAll(0);
  for (int r = 0; r < 2; ++r) trainer(r).SetSync(false);
  MarkAll(0);
  WaitAllOk();  // returns at once: nothing was posted
  EXPECT_EQ(scheduler_->iteration(), 0u);
  EXPECT_TRUE(backend_->calls().empty());

  // The second micro-batch adds to the first, as autograd accumulates.
  const Layout& layout = node_->layout();
  for (int r = 0; r < 2; ++r) {
    for (size_t t = 0; t < layout.size(); ++t) {
      for (size_t e = 0; e < layout[t].numel; ++e) {
        const double before = trainer(r).Get(t, e);
        sums[t][e] +=
            trainer(r).SetRounded(t, e, before + GradientValue(rank(r), t, e, 1)) - before;
      }
    }
    trainer(r).SetSync(true);
  }
  MarkAll(1);
  WaitAllOk();
  EXPECT_EQ(scheduler_->iteration(), 1u);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()));
}

// A trainer in no_sync while its peer syncs would mix a
// 2-iteration sum with a 1-iteration one and return GS_OK.
TEST_F(SchedulerBehaviourTest, TrainerOutOfStepOnNoSyncFailsWithMismatchNamingBoth) {
  ASSERT_NO_FATAL_FAILURE(Start());
  WriteAll(0);
  trainer(1).SetSync(false);
  for (size_t t = 0; t < node_->layout().size(); ++t) ASSERT_TRUE(trainer(1).MarkReady(t).ok());
  ASSERT_TRUE(trainer(1).Wait(kBound).ok());  // accumulating: nothing posted
  trainer(1).SetSync(true);
  MarkAll(1);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::MISMATCH) << st;
  // Whichever came first is the reference: both are named with their sums.
  EXPECT_THAT(std::string(st.message()), HasSubstr(Name(1) + " summed 2 iteration(s)"));
  EXPECT_THAT(std::string(st.message()), HasSubstr(Name(0) + " summed 1"));
  EXPECT_EQ(failures_.culprit(), -1);  // every trainer gets the MISMATCH
  EXPECT_TRUE(backend_->calls().empty()) << "a bucket was reduced from mixed sums";
}

TEST_F(SchedulerBehaviourTest, TrainersInStepOnNoSyncWithChecksumsAverageTheSum) {
  // Everything GRADSYNC_DEBUG=detail checks passes for honest trainers.
  ASSERT_NO_FATAL_FAILURE(Start());
  Sums sums = WriteAll(0);
  for (int r = 0; r < 2; ++r) {
    trainer(r).SetChecksumMarks(true);
    trainer(r).SetSync(false);
  }
  MarkAll(0);
  WaitAllOk();
  const Layout& layout = node_->layout();
  for (int r = 0; r < 2; ++r) {
    for (size_t t = 0; t < layout.size(); ++t) {
      for (size_t e = 0; e < layout[t].numel; ++e) {
        const double before = trainer(r).Get(t, e);
        sums[t][e] +=
            trainer(r).SetRounded(t, e, before + GradientValue(rank(r), t, e, 1)) - before;
      }
    }
    trainer(r).SetSync(true);
  }
  MarkAll(1);
  WaitAllOk();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()));
  RunIteration(2);  // and the counts start over
}

// Writing a buffer after marking it changes the result;
// GRADSYNC_DEBUG=detail names the trainer and the tensor instead.
TEST_F(SchedulerBehaviourTest, WriteAfterMarkInDebugModeFailsWithInvalidArgumentNamingTheTensor) {
  ASSERT_NO_FATAL_FAILURE(Start(kNever, BucketCaps{}));  // one bucket: nothing reduced early
  WriteAll(0);
  for (int r = 0; r < 2; ++r) trainer(r).SetChecksumMarks(true);
  const size_t bias = tensor("fc1.bias");
  ASSERT_TRUE(trainer(1).MarkReady(bias).ok());
  trainer(1).Set(bias, 0, trainer(1).Get(bias, 0) + 1.0);  // after the mark
  MarkAll(0, {{1, bias}});
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::INVALID_ARGUMENT) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr(Name(1) + " wrote tensor " + std::to_string(bias) +
                        " 'fc1.bias' after marking it in iteration 0"));
  EXPECT_EQ(failures_.culprit(), 1);
  EXPECT_TRUE(backend_->calls().empty()) << "the written bucket was reduced";
}

TEST_F(SchedulerBehaviourTest, UnusedGradientsCountAsMarkedAndContributeZeros) {
  ASSERT_NO_FATAL_FAILURE(Start());
  Sums sums = WriteAll(0);
  const size_t bias = tensor("fc1.bias"), head = tensor("head.weight");
  // Local rank 1 did not use fc1.bias; nobody used head.weight.
  for (size_t e = 0; e < node_->layout()[bias].numel; ++e) sums[bias][e] = trainer(0).Get(bias, e);
  for (size_t e = 0; e < node_->layout()[head].numel; ++e) sums[head][e] = 0;
  for (size_t t = 0; t < node_->layout().size(); ++t) {
    for (int r = 0; r < 2; ++r) {
      const bool unused = t == head || (t == bias && r == 1);
      ASSERT_TRUE((unused ? trainer(r).MarkUnused(t) : trainer(r).MarkReady(t)).ok());
    }
  }
  WaitAllOk();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()));
}

TEST_F(SchedulerBehaviourTest, RingsWrapAroundOverManyIterations) {
  // 64-entry rings, 6 marks and 1 completion per iteration per trainer.
  ASSERT_NO_FATAL_FAILURE(Start());
  for (uint64_t it = 0; it < 40 && !HasFailure(); ++it) RunIteration(it);
  EXPECT_EQ(scheduler_->iteration(), 40u);
}

TEST_F(SchedulerBehaviourTest, RebuildFollowsTheOrderTheNodesAgreedOn) {
  // Node 0 decides: registration order, whatever this node observed.
  const std::vector<uint32_t> agreed = {0, 1, 2, 3, 4, 5};
  NodeSetup s;
  s.caps = {256, 64};
  s.agree_order = [&](const std::vector<uint32_t>& local) {
    EXPECT_EQ(local.size(), agreed.size());
    return absl::StatusOr<std::vector<uint32_t>>(agreed);
  };
  ASSERT_NO_FATAL_FAILURE(StartScheduler(s));
  RunIteration(0);
  RunIteration(1);  // the rebuilt plan is installed before this one starts
  const BucketPlan want = PlanBuckets(node_->layout(), agreed, s.caps);
  const BucketPlan got = scheduler_->plan();
  ASSERT_EQ(got.buckets.size(), want.buckets.size());
  for (size_t b = 0; b < want.buckets.size(); ++b) {
    EXPECT_EQ(got.buckets[b].tensors, want.buckets[b].tensors) << "bucket " << b;
  }
  EXPECT_EQ(scheduler_->plan_version(), 2u);
}

TEST_F(SchedulerBehaviourTest, FailingToAgreeOnTheRebuiltOrderFailsWithItsCode) {
  NodeSetup s;
  s.caps = {256, 64};
  s.agree_order = [](const std::vector<uint32_t>&) -> absl::StatusOr<std::vector<uint32_t>> {
    return MakeError(v1::UNAVAILABLE, "the leader is unreachable");
  };
  ASSERT_NO_FATAL_FAILURE(StartScheduler(s));
  RunIteration(0);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::UNAVAILABLE) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("agreeing on the rebuilt bucket order: the leader is unreachable"));
}

TEST_F(SchedulerBehaviourTest, NewCapsApplyAtTheIterationBoundaryTheyNameAndAveragesStayRight) {
  ASSERT_NO_FATAL_FAILURE(Start(kNever, BucketCaps{}));  // one bucket
  RunIteration(0);
  RunIteration(1);
  ASSERT_EQ(scheduler_->plan().buckets.size(), 1u);
  const uint64_t version = scheduler_->plan_version();
  scheduler_->SetCaps({4, 4}, /*at_iteration=*/3);
  RunIteration(2);
  RunIteration(3);  // entered with the new caps: one tensor per bucket
  EXPECT_EQ(scheduler_->plan().buckets.size(), 6u);
  EXPECT_EQ(scheduler_->plan_version(), version + 1);
  RunIteration(4);
  EXPECT_TRUE(failures_.Peek().ok()) << failures_.Peek();
}

// A burst of job-wide changes queues; none overwrites
// another, each applies at its own iteration, in order.
TEST_F(SchedulerBehaviourTest, QueuedCapChangesApplyInOrderEachAtItsOwnIteration) {
  ASSERT_NO_FATAL_FAILURE(Start(kNever, BucketCaps{}));  // one bucket
  RunIteration(0);
  RunIteration(1);
  ASSERT_EQ(scheduler_->plan().buckets.size(), 1u);
  scheduler_->SetCaps({4, 4}, /*at_iteration=*/3, /*config_version=*/1);
  scheduler_->SetCaps(BucketCaps{}, /*at_iteration=*/5, /*config_version=*/2);
  RunIteration(2);
  RunIteration(3);  // version 1: one tensor per bucket
  EXPECT_EQ(scheduler_->plan().buckets.size(), 6u);
  RunIteration(4);
  RunIteration(5);  // version 2: one bucket again
  EXPECT_EQ(scheduler_->plan().buckets.size(), 1u);
  RunIteration(6);
  EXPECT_TRUE(failures_.Peek().ok()) << failures_.Peek();
}

// Every plan decision is checked across nodes before its first collective,
// stamped alike on every node: version, fingerprint, first iteration and
// the config version it applied.
TEST_F(SchedulerBehaviourTest, EveryPlanDecisionIsCheckedWithItsStampBeforeItRuns) {
  absl::Mutex mu;
  std::vector<PlanStamp> stamps;
  NodeSetup s;
  s.caps = BucketCaps{};
  s.check_plan = [&](const PlanStamp& stamp) {
    absl::MutexLock lock(&mu);
    stamps.push_back(stamp);
    return absl::OkStatus();
  };
  ASSERT_NO_FATAL_FAILURE(StartScheduler(s));
  RunIteration(0);
  RunIteration(1);
  scheduler_->SetCaps({4, 4}, /*at_iteration=*/3, /*config_version=*/1);
  RunIteration(2);
  RunIteration(3);
  const BucketPlan per_tensor = scheduler_->plan();
  RunIteration(4);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(stamps.size(), 2u);
  EXPECT_EQ(stamps[0].plan_version, 2u);  // the rebuilt order, entering iteration 1
  EXPECT_EQ(stamps[0].iteration, 1u);
  EXPECT_EQ(stamps[0].config_version, 0u);
  EXPECT_EQ(stamps[1].plan_version, 3u);
  EXPECT_EQ(stamps[1].iteration, 3u);
  EXPECT_EQ(stamps[1].config_version, 1u);
  EXPECT_EQ(stamps[1].fingerprint, PlanFingerprint(per_tensor));
  EXPECT_NE(stamps[0].fingerprint, stamps[1].fingerprint);
  EXPECT_EQ(scheduler_->plan_version(), 3u);
}

// The one-time rebuild entering iteration 1 and a burst of job-wide
// versions for iterations 2-6, all queued before the job's first
// iteration: one plan decision per boundary, numbered in order, each
// stamped with the version it applied.
TEST_F(SchedulerBehaviourTest, RebuildAndVersionsInConsecutiveIterationsAreDecidedInOrder) {
  absl::Mutex mu;
  std::vector<PlanStamp> stamps;
  NodeSetup s;
  s.caps = BucketCaps{};
  s.check_plan = [&](const PlanStamp& stamp) {
    absl::MutexLock lock(&mu);
    stamps.push_back(stamp);
    return absl::OkStatus();
  };
  ASSERT_NO_FATAL_FAILURE(StartScheduler(s));
  for (uint64_t v = 1; v <= 5; ++v) {
    scheduler_->SetCaps(v % 2 == 1 ? BucketCaps{4, 4} : BucketCaps{}, /*at_iteration=*/v + 1, v);
  }
  for (uint64_t it = 0; it < 8; ++it) RunIteration(it);
  EXPECT_TRUE(failures_.Peek().ok()) << failures_.Peek();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(stamps.size(), 6u);
  for (size_t k = 0; k < stamps.size(); ++k) {
    EXPECT_EQ(stamps[k].plan_version, k + 2) << "decision " << k;
    EXPECT_EQ(stamps[k].iteration, k + 1) << "decision " << k;
    EXPECT_EQ(stamps[k].config_version, k) << "decision " << k;
  }
  EXPECT_EQ(scheduler_->plan_version(), 7u);
}

// A node whose job never got version 1 of the config log but got 2 and 3
// would apply version 2 where the other nodes apply 1, and count one plan
// decision fewer: the others would wait on its plan check until the
// timeout. It fails at the next boundary instead, naming what is missing.
TEST_F(SchedulerBehaviourTest, ConfigVersionMissingOnThisNodeFailsWithInternalNamingIt) {
  ASSERT_NO_FATAL_FAILURE(Start(kNever, BucketCaps{}));
  RunIteration(0);
  RunIteration(1);
  scheduler_->SetCaps({4, 4}, /*at_iteration=*/3, /*config_version=*/2);
  scheduler_->SetCaps(BucketCaps{}, /*at_iteration=*/4, /*config_version=*/3);
  // The gap is caught at the next boundary the scheduler crosses: before
  // iteration 2 or after it, depending on whether it crossed into 2 before
  // the versions arrived. The trainers do their part of iteration 2 either
  // way, without expecting it to complete.
  WriteAll(2);
  MarkAll(2);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::INTERNAL) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("config version 2 reached this node's scheduler after version 0: "
                        "version 1 is missing here"));
  EXPECT_EQ(scheduler_->plan().buckets.size(), 1u);  // nothing applied
}

TEST_F(SchedulerBehaviourTest, DivergedPlanFailsWithMismatchBeforeItsFirstCollective) {
  NodeSetup s;
  s.caps = BucketCaps{};
  s.check_plan = [](const PlanStamp& stamp) {
    return MakeError(v1::MISMATCH,
                     absl::StrCat("bucket plans diverged at plan version ", stamp.plan_version,
                                  ": node 0 has config version 4"));
  };
  ASSERT_NO_FATAL_FAILURE(StartScheduler(s));
  RunIteration(0);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::MISMATCH) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("bucket plans diverged at plan version 2: node 0 has config version 4"));
}

TEST_F(SchedulerBehaviourTest, CapChangeArrivingAfterItsIterationFailsWithState) {
  ASSERT_NO_FATAL_FAILURE(Start());
  RunIteration(0);
  RunIteration(1);
  RunIteration(2);
  // The other nodes switched at iteration 1; this node would diverge. The
  // trainers saw iteration 2 done before the scheduler crossed its boundary
  // into 3, so the change is caught there or at the next boundary (4): the
  // trainers do their part of iteration 3 either way, without expecting it
  // to complete.
  scheduler_->SetCaps({4, 4}, /*at_iteration=*/1);
  WriteAll(3);
  MarkAll(3);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::STATE) << st;
  EXPECT_THAT(
      std::string(st.message()),
      AnyOf(HasSubstr("bucket-cap change for iteration 1 reached this node at iteration 3"),
            HasSubstr("bucket-cap change for iteration 1 reached this node at iteration 4")));
}

TEST_F(SchedulerBehaviourTest, SkippedGradientTimesOutNamingTheRankAndTheTensor) {
  ASSERT_NO_FATAL_FAILURE(Start(kShortTimeoutMs));
  WriteAll(0);
  MarkAll(0, /*skip=*/{{1, tensor("fc1.bias")}});
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::TIMEOUT) << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr(absl::StrCat(Name(1), " has not marked fc1.bias")));
  EXPECT_THAT(std::string(st.message()), Not(HasSubstr(Name(0))));  // rank 2 marked everything
  EXPECT_EQ(failures_.culprit(), -1);
}

TEST_F(SchedulerBehaviourTest, StalledCollectiveFailsWithTimeoutNamingTheBucket) {
  // The other nodes never answer; the backend gives up after its own
  // timeout (the daemon gives Gloo its --timeout-s), well before the
  // scheduler's, so the error is the backend's. A backend that ignores its
  // timeout is the scheduler's watchdog's (next test).
  ASSERT_NO_FATAL_FAILURE(Start());
  backend_->Stall(absl::Milliseconds(kShortTimeoutMs));
  WriteAll(0);
  MarkAll(0);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::TIMEOUT) << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("bucket 0 of iteration 0: fake allreduce failed"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("did not answer"));
  EXPECT_EQ(failures_.culprit(), Scheduler::kCollectiveFailed);
}

TEST_F(SchedulerBehaviourTest, HungCollectiveIsAbortedAtTheTimeoutAndFailsNamingTheBucket) {
  // One tensor per bucket; bucket 0 goes through, bucket 1's collective
  // hangs and the backend never gives up on its own.
  ASSERT_NO_FATAL_FAILURE(Start(kWatchdogTimeoutMs, {4, 4}));
  ASSERT_EQ(scheduler_->plan().buckets.size(), 6u);
  backend_->Hang(/*after=*/1);
  WriteAll(0);
  MarkAll(0);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::TIMEOUT) << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("bucket 1 of iteration 0: the fake allreduce did not complete within the "
                        "0.3 s timeout"));
  EXPECT_EQ(failures_.culprit(), Scheduler::kCollectiveFailed);
  EXPECT_EQ(failures_.reports(), 1);
  // The watchdog aborted the hung call, saying which one.
  EXPECT_THAT(backend_->abort_reason(), HasSubstr("bucket 1 of iteration 0"));
  // Halted: no later bucket was launched.
  EXPECT_EQ(backend_->calls().size(), 2u);
}

TEST_F(SchedulerBehaviourTest, StopDuringAHungCollectiveReturns) {
  // The job's timeout is out of reach: only Stop can end the call. The
  // test returning is the proof.
  ASSERT_NO_FATAL_FAILURE(Start());
  backend_->Hang();
  WriteAll(0);
  MarkAll(0);
  ASSERT_TRUE(backend_->WaitUntilStalled(1, kBound));
  scheduler_->Stop();
  EXPECT_THAT(backend_->abort_reason(), HasSubstr("the job is stopping"));
  // The job is over: the aborted bucket is not reported as a failure.
  EXPECT_EQ(failures_.reports(), 0);
}

TEST_F(SchedulerBehaviourTest, AbortingAStalledCollectiveFailsWithTheAbortReason) {
  ASSERT_NO_FATAL_FAILURE(Start());
  backend_->Stall(absl::InfiniteDuration());
  WriteAll(0);
  MarkAll(0);
  ASSERT_TRUE(backend_->WaitUntilStalled(1, kBound));
  backend_->Abort("node 0 stopped heart-beating");
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::PEER_FAILED) << st;
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("node 0 stopped heart-beating"));
  EXPECT_EQ(failures_.culprit(), Scheduler::kCollectiveFailed);
}

TEST_F(SchedulerBehaviourTest, SlowCollectiveThatAnswersCompletesTheIteration) {
  ASSERT_NO_FATAL_FAILURE(Start());
  backend_->Stall(absl::InfiniteDuration());
  const Sums sums = WriteAll(0);
  MarkAll(0);
  ASSERT_TRUE(backend_->WaitUntilStalled(1, kBound));
  backend_->Release();
  WaitAllOk();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(HoldsAverage(trainer(r), sums, remote(), world_size()));
  EXPECT_EQ(failures_.reports(), 0);
}

// ---- backend errors keep their meaning ----

struct BackendErrorCase {
  const char* name;
  absl::Status error;
  v1::Code code;
};
void PrintTo(const BackendErrorCase& c, std::ostream* os) { *os << c.name; }

class SchedulerBackendErrorTest : public SchedulerFixture,
                                  public ::testing::TestWithParam<BackendErrorCase> {
 protected:
  void TearDown() override { StopScheduler(); }
};

TEST_P(SchedulerBackendErrorTest, FailsTheIterationWithTheBackendsCodeAndMessage) {
  NodeSetup s;
  s.caps = {256, 64};
  ASSERT_NO_FATAL_FAILURE(StartScheduler(s));
  // One good iteration first: the failure is reported where it happens.
  const size_t first_plan_buckets = scheduler_->plan().buckets.size();
  WriteAll(0);
  MarkAll(0);
  WaitAllOk();
  backend_->FailWith(GetParam().error);
  WriteAll(1);
  MarkAll(1);
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), GetParam().code) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("bucket 0 of iteration 1: fake allreduce failed: "));
  EXPECT_THAT(std::string(st.message()), HasSubstr(GetParam().error.message()));
  EXPECT_EQ(failures_.culprit(), Scheduler::kCollectiveFailed);
  // Halted: nothing reaches the trainers from the scheduler itself (Job
  // posts the error), and no later bucket is launched.
  EXPECT_EQ(backend_->calls().size(), first_plan_buckets + 1);
}

INSTANTIATE_TEST_SUITE_P(
    Codes, SchedulerBackendErrorTest,
    ::testing::Values(
        BackendErrorCase{"PeerClosed", absl::UnavailableError("node 0 closed its connection"),
                         v1::UNAVAILABLE},
        BackendErrorCase{"Aborted", absl::AbortedError("node 0 aborted"), v1::PEER_FAILED},
        BackendErrorCase{"OwnTimeout", absl::DeadlineExceededError("gloo timed out"), v1::TIMEOUT},
        BackendErrorCase{"Internal", absl::InternalError("transport exception"), v1::PEER_FAILED}),
    [](const ::testing::TestParamInfo<BackendErrorCase>& info) { return info.param.name; });

// ---- bad ring entries fail the trainer that sent them ----

struct BadEntryCase {
  const char* name;
  void (*inject)(InMemoryTrainer& t);
  const char* says;
};
void PrintTo(const BadEntryCase& c, std::ostream* os) { *os << c.name; }

ipc::ReadyEvent NextEntry(const InMemoryTrainer& t, uint32_t tensor) {
  ipc::ReadyEvent e{};
  e.tensor = tensor;
  e.kind = static_cast<uint32_t>(ipc::ReadyKind::kReady);
  e.iteration = t.iteration();
  e.sequence = t.next_sequence();
  return e;
}

class SchedulerBadEntryTest : public SchedulerFixture,
                              public ::testing::TestWithParam<BadEntryCase> {
 protected:
  void TearDown() override { StopScheduler(); }
};

TEST_P(SchedulerBadEntryTest, FailsThatTrainerWithInvalidArgument) {
  NodeSetup s;
  s.caps = {256, 64};
  ASSERT_NO_FATAL_FAILURE(StartScheduler(s));
  WriteAll(0);
  // Local rank 0 behaves; local rank 1 sends the bad entry after a good one.
  for (size_t t = 0; t < node_->layout().size(); ++t) ASSERT_TRUE(trainer(0).MarkReady(t).ok());
  ASSERT_TRUE(trainer(1).MarkReady(tensor("fc1.bias")).ok());
  GetParam().inject(trainer(1));
  const absl::Status st = failures_.Wait(kBound);
  EXPECT_EQ(CodeOf(st), v1::INVALID_ARGUMENT) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(Name(1)));
  EXPECT_THAT(std::string(st.message()), HasSubstr(GetParam().says));
  EXPECT_EQ(failures_.culprit(), 1);
}

INSTANTIATE_TEST_SUITE_P(
    Entries, SchedulerBadEntryTest,
    ::testing::Values(
        BadEntryCase{"TensorOutOfRange",
                     [](InMemoryTrainer& t) { ASSERT_TRUE(t.PostRaw(NextEntry(t, 99)).ok()); },
                     "sent a bad readiness entry: readiness entry names tensor 99 of 6"},
        BadEntryCase{"WrongIteration",
                     [](InMemoryTrainer& t) {
                       ipc::ReadyEvent e = NextEntry(t, 0);
                       e.iteration = 5;
                       ASSERT_TRUE(t.PostRaw(e).ok());
                     },
                     "is for iteration 5, expected 0"},
        BadEntryCase{"SequenceGap",
                     [](InMemoryTrainer& t) {
                       ipc::ReadyEvent e = NextEntry(t, 0);
                       e.sequence += 6;
                       ASSERT_TRUE(t.PostRaw(e).ok());
                     },
                     "has sequence 7, expected 1"},
        BadEntryCase{"UnknownKind",
                     [](InMemoryTrainer& t) {
                       ipc::ReadyEvent e = NextEntry(t, 0);
                       e.kind = 9;
                       ASSERT_TRUE(t.PostRaw(e).ok());
                     },
                     "unknown kind 9"},
        BadEntryCase{"MarkedTwice",
                     [](InMemoryTrainer& t) { ASSERT_TRUE(t.PostRaw(NextEntry(t, 2)).ok()); },
                     "marked tensor 2 'fc1.bias' twice in iteration 0"},
        BadEntryCase{"CorruptRing",
                     [](InMemoryTrainer& t) {
                       // A head far past the tail: the ring's control block was scribbled on.
                       auto* base = reinterpret_cast<uint8_t*>(t.segment().header());
                       auto* control = reinterpret_cast<ipc::RingControl*>(
                           base + t.segment().header()->ready_offset);
                       control->head.store(uint64_t{1} << 40, std::memory_order_release);
                       t.RingNodeBell();
                     },
                     "its readiness ring is corrupt"}),
    [](const ::testing::TestParamInfo<BadEntryCase>& info) { return info.param.name; });

}  // namespace
}  // namespace testing
}  // namespace gradsync
