// The job state machine in-process: Attach and Register from threads as
// the Local service's RPC threads would, a WorldFormer that hands back a
// fake backend (this node is the last of two), and trainers played by the
// test through the segments registration returns. Failures must reach
// every trainer with the right code and a message naming the culprit.
#include "daemon/engine/job.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "daemon/config.h"
#include "ipc/shared_segment.h"
#include "tests/engine/fake_backend.h"
#include "tests/engine/gradients.h"
#include "tests/engine/in_memory_trainers.h"
#include "tests/engine/mt19937_64_predictor.h"
#include "tests/engine/patience.h"

namespace gradsync::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The timeout of tests that expect one: far above a passing iteration
// (milliseconds) even on a loaded machine.
constexpr int64_t kShortTimeoutMs = 500;
constexpr double kRemote = 0.75;
constexpr int kNodes = 2;

int64_t PidOf(int local_rank) { return 5000 + local_rank; }

class JobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = UniqueShmPrefix("job");
    auto node = ipc::NodeSegment::Create(ipc::SegmentName(prefix_, getpid(), "node"), getpid());
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::make_shared<ipc::NodeSegment>(std::move(*node));
  }

  void TearDown() override {
    {
      absl::MutexLock lock(&mu_);
      if (backend_ != nullptr) backend_->Release();
    }
    job_.reset();
    ipc::SharedSegment::Remove(node_->name()).IgnoreError();
    // The job removes every trainer segment it created.
    EXPECT_THAT(SegmentsWithPrefix(prefix_), IsEmpty());
    RemoveSegmentsWithPrefix(prefix_);
  }

  // A job for `local_size` trainers on the second of two nodes.
  void MakeJob(int local_size, int64_t timeout_ms = 60 * 1000) {
    config_.local_size = local_size;
    config_.node_rank = 1;
    config_.num_nodes = kNodes;
    config_.timeout_ms = timeout_ms;
    config_.shm_prefix = prefix_;
    config_.ring_capacity = 64;
    config_.reduce_threads = 1;
    config_.bucket_cap_mb = 1024.0 / (1 << 20);
    config_.first_bucket_cap_mb = 256.0 / (1 << 20);
    job_ = std::make_unique<Job>(
        config_, node_, /*id=*/1,
        [this](const Layout& layout, uint64_t hash,
               std::function<void(const absl::Status&)> on_failure) -> absl::StatusOr<JobWorld> {
          absl::MutexLock lock(&mu_);
          ++formed_;
          formed_hash_ = hash;
          EXPECT_EQ(hash, LayoutHash(layout));
          on_failure_ = std::move(on_failure);
          if (!former_error_.ok()) return former_error_;
          JobWorld world;
          world.world_size = config_.local_size * kNodes;
          world.rank_offset = config_.local_size * config_.node_rank;
          world.generation = 7;
          auto backend = std::make_unique<FakeBackend>(kNodes, kRemote);
          backend_ = backend.get();
          world.backend = std::move(backend);
          return world;
        },
        JobHooks{});
  }

  // Attaches every local rank, then registers each from its own thread
  // (Register blocks until all have). `layouts[r]` is rank r's layout.
  std::vector<absl::StatusOr<RegisterResult>> AttachAndRegister(const std::vector<Layout>& layouts,
                                                                absl::Duration deadline = kBound) {
    std::vector<absl::StatusOr<RegisterResult>> results(layouts.size(),
                                                        absl::UnknownError("not run"));
    sessions_.clear();
    for (size_t r = 0; r < layouts.size(); ++r) {
      absl::StatusOr<uint64_t> session = job_->Attach(static_cast<int>(r), PidOf(r));
      EXPECT_TRUE(session.ok()) << session.status();
      sessions_.push_back(session.value_or(0));
    }
    const absl::Time until = MonotonicNow() + deadline;
    std::vector<std::thread> threads;
    for (size_t r = 0; r < layouts.size(); ++r) {
      threads.emplace_back(
          [&, r] { results[r] = job_->Register(sessions_[r], layouts[r], until); });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  // A running job of `local_size` trainers with TestLayout, opened as
  // the client would open what registration returned.
  void StartRunning(int local_size, int64_t timeout_ms = 60 * 1000) {
    MakeJob(local_size, timeout_ms);
    const Layout layout = TestLayout(DType::kFloat32);
    auto results = AttachAndRegister(std::vector<Layout>(local_size, layout));
    for (int r = 0; r < local_size; ++r) {
      ASSERT_TRUE(results[r].ok()) << results[r].status();
      const RegisterResult& res = *results[r];
      auto t = InMemoryTrainer::Open({res.segment_name, res.node_segment_name, res.layout_hash,
                                      res.arena_bytes, res.tensor_offsets},
                                     layout);
      ASSERT_TRUE(t.ok()) << t.status();
      trainers_.push_back(std::move(*t));
      ranks_.push_back(res.rank);
    }
    ASSERT_EQ(job_->state(), JobState::kRunning);
  }

  FakeBackend& backend() {
    absl::MutexLock lock(&mu_);
    return *backend_;
  }
  // "rank 3 (local 1, pid 5001)", as the daemon names a trainer.
  std::string Name(int r) const {
    return absl::StrCat("rank ", config_.local_size * config_.node_rank + r, " (local ", r,
                        ", pid ", PidOf(r), ")");
  }

  Sums WriteAll(uint64_t it) {
    Sums sums = ZeroSums(trainers_[0]->layout());
    for (size_t r = 0; r < trainers_.size(); ++r)
      WriteGradients(*trainers_[r], ranks_[r], it, &sums);
    return sums;
  }
  void MarkAllExcept(int skip_rank = -1, size_t skip_tensor = 0) {
    const size_t n = trainers_[0]->layout().size();
    for (size_t k = 0; k < n; ++k) {
      const size_t t = n - 1 - k;  // backward: last layers first
      for (size_t r = 0; r < trainers_.size(); ++r) {
        if (static_cast<int>(r) == skip_rank && t == skip_tensor) continue;
        ASSERT_TRUE(trainers_[r]->MarkReady(t).ok());
      }
    }
  }

  std::string prefix_;
  std::shared_ptr<ipc::NodeSegment> node_;
  DaemonConfig config_;
  std::unique_ptr<Job> job_;
  std::vector<uint64_t> sessions_;
  std::vector<std::unique_ptr<InMemoryTrainer>> trainers_;
  std::vector<int> ranks_;

  absl::Mutex mu_;
  int formed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t formed_hash_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status former_error_ ABSL_GUARDED_BY(mu_);
  std::function<void(const absl::Status&)> on_failure_ ABSL_GUARDED_BY(mu_);
  FakeBackend* backend_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// A session id is all a Local RPC presents. While ids came from
// mt19937_64, the 312 ids a trainer could collect (attach after attach)
// predicted the next one, another trainer's; from the CSPRNG none does.
TEST_F(JobTest, SessionIdsDoNotPredictTheNextOne) {
  // The predictor is sound: it foresees a real mt19937_64.
  std::mt19937_64 reference(20261123);
  std::vector<uint64_t> outputs;
  for (size_t i = 0; i < kMt64StateWords + 1; ++i) outputs.push_back(reference());
  const uint64_t foreseen = outputs.back();
  outputs.pop_back();
  ASSERT_EQ(PredictNextMt64(outputs), foreseen);

  constexpr int kPerJob = 64;
  std::vector<uint64_t> ids;
  while (ids.size() < kMt64StateWords + 8) {
    MakeJob(kPerJob);
    for (int r = 0; r < kPerJob; ++r) {
      absl::StatusOr<uint64_t> session = job_->Attach(r, PidOf(r));
      ASSERT_TRUE(session.ok()) << session.status();
      ids.push_back(*session);
    }
    job_.reset();
  }
  int foreseen_ids = 0;
  for (size_t next = kMt64StateWords; next < ids.size(); ++next) {
    const std::vector<uint64_t> window(ids.begin() + (next - kMt64StateWords), ids.begin() + next);
    if (PredictNextMt64(window) == ids[next]) ++foreseen_ids;
  }
  EXPECT_EQ(foreseen_ids, 0) << "of " << ids.size() - kMt64StateWords << " session ids";
  EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), ids.size()) << "an id repeated";
}

TEST_F(JobTest, RunsOnceEveryLocalTrainerRegisteredAndAveragesAcrossTheWorld) {
  ASSERT_NO_FATAL_FAILURE(StartRunning(3));
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(formed_, 1);  // once, by the last trainer to register
    EXPECT_EQ(formed_hash_, LayoutHash(TestLayout(DType::kFloat32)));
  }
  EXPECT_THAT(ranks_, ElementsAre(3, 4, 5));
  EXPECT_EQ(job_->world_size(), 6);
  EXPECT_EQ(job_->backend_name(), "fake");
  for (uint64_t it = 0; it < 2; ++it) {
    const Sums sums = WriteAll(it);
    MarkAllExcept();
    for (size_t r = 0; r < trainers_.size(); ++r) {
      const absl::Status st = trainers_[r]->Wait(kBound);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_TRUE(HoldsAverage(*trainers_[r], sums, kRemote, 6)) << "iteration " << it;
    }
  }
  EXPECT_EQ(job_->iteration(), 2u);
  for (const Job::TrainerInfo& info : job_->Trainers()) EXPECT_EQ(info.iterations, 2u);
  EXPECT_TRUE(job_->error().ok());
}

TEST_F(JobTest, AttachRefusesARankOutOfRangeATakenRankAndAJobAlreadyRunning) {
  MakeJob(2);
  absl::StatusOr<uint64_t> st = job_->Attach(2, PidOf(2));
  EXPECT_EQ(CodeOf(st.status()), v1::INVALID_ARGUMENT) << st.status();
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("local rank 2 is not in [0, 2)"));
  ASSERT_TRUE(job_->Attach(0, PidOf(0)).ok());
  st = job_->Attach(0, 6000);
  EXPECT_EQ(CodeOf(st.status()), v1::STATE) << st.status();
  EXPECT_THAT(std::string(st.status().message()),
              HasSubstr("local rank 0 is already attached by pid 5000"));
  const absl::StatusOr<RegisterResult> unknown =
      job_->Register(/*session=*/12345, TestLayout(DType::kFloat32), MonotonicNow() + kBound);
  EXPECT_EQ(CodeOf(unknown.status()), v1::STATE) << unknown.status();
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown session"));
}

TEST_F(JobTest, RunningJobRefusesNewTrainersAndEndsOnceEveryTrainerHasLeft) {
  ASSERT_NO_FATAL_FAILURE(StartRunning(2));
  const absl::StatusOr<uint64_t> late = job_->Attach(1, 6001);
  EXPECT_EQ(CodeOf(late.status()), v1::STATE) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("a job is running"));
  WriteAll(0);
  MarkAllExcept();
  for (auto& t : trainers_) ASSERT_TRUE(t->Wait(kBound).ok());
  job_->Leave(sessions_[0], /*graceful=*/true, "closed");
  EXPECT_FALSE(job_->Finished());
  job_->Leave(sessions_[1], /*graceful=*/true, "closed");
  EXPECT_TRUE(job_->Finished());
  EXPECT_FALSE(job_->HasSession(sessions_[0]));
  const absl::StatusOr<uint64_t> next = job_->Attach(0, 6000);
  EXPECT_EQ(CodeOf(next.status()), v1::STATE) << next.status();
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("this job has ended"));
}

TEST_F(JobTest,
       ThousandTrainersAttachingRegisteringAndLeavingBeforeTheJobStartsLeaveOneRecordPerRank) {
  MakeJob(2);
  // Rank 1 stays attached, so the job keeps accepting while rank 0 comes
  // and goes; each rank 0 registers (holding its record while it waits)
  // and leaves, racing its own Register like a trainer killed mid-call.
  ASSERT_TRUE(job_->Attach(1, PidOf(1)).ok());
  const Layout layout = TestLayout(DType::kFloat32);
  for (int cycle = 0; cycle < 1000; ++cycle) {
    absl::StatusOr<uint64_t> session = job_->Attach(0, PidOf(0));
    ASSERT_TRUE(session.ok()) << "cycle " << cycle << ": " << session.status();
    absl::StatusOr<RegisterResult> registered = absl::UnknownError("not run");
    std::thread registering(
        [&] { registered = job_->Register(*session, layout, MonotonicNow() + kBound); });
    job_->Leave(*session, /*graceful=*/true, "closed");
    registering.join();
    // "unknown session" or "the trainer left during registration".
    ASSERT_EQ(CodeOf(registered.status()), v1::STATE) << registered.status();
  }
  EXPECT_EQ(job_->TrainerRecords(), 2u);
  EXPECT_EQ(job_->state(), JobState::kAttaching);
  EXPECT_TRUE(job_->Attach(0, PidOf(0)).ok());
  EXPECT_EQ(job_->TrainerRecords(), 2u);
}

TEST_F(JobTest, LayoutsThatDisagreeFailEveryTrainerWithMismatchNamingTheFirstDifference) {
  MakeJob(3);
  Layout other = TestLayout(DType::kFloat32);
  other[2].numel = 18;       // fc1.bias: the first difference
  other[5].name = "head.w";  // a later one, not reported
  const Layout same = TestLayout(DType::kFloat32);
  auto results = AttachAndRegister({same, same, other});
  for (size_t r = 0; r < results.size(); ++r) {
    const absl::Status st = results[r].status();
    EXPECT_EQ(CodeOf(st), v1::MISMATCH) << "local rank " << r << ": " << st;
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("local rank 2 (pid 5002) registered a different layout"));
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("first difference at tensor 2: 'fc1.bias' float32[17] vs "
                          "'fc1.bias' float32[18]"));
  }
  EXPECT_EQ(job_->state(), JobState::kFailed);
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(formed_, 0);  // never joined the other nodes
}

TEST_F(JobTest, RegistrationDeadlinePassingFailsWithTimeoutNamingTheMissingLocalRank) {
  MakeJob(3);
  const Layout layout = TestLayout(DType::kFloat32);
  // Local rank 2 attaches but never registers.
  std::vector<uint64_t> sessions;
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<uint64_t> session = job_->Attach(r, PidOf(r));
    ASSERT_TRUE(session.ok()) << session.status();
    sessions.push_back(*session);
  }
  std::vector<absl::StatusOr<RegisterResult>> results(2, absl::UnknownError("not run"));
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(kShortTimeoutMs);
  std::thread t0([&] { results[0] = job_->Register(sessions[0], layout, deadline); });
  std::thread t1([&] { results[1] = job_->Register(sessions[1], layout, deadline); });
  t0.join();
  t1.join();
  for (int r = 0; r < 2; ++r) {
    const absl::Status st = results[r].status();
    EXPECT_EQ(CodeOf(st), v1::TIMEOUT) << st;
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("2 of 3 local trainers registered; missing local ranks 2"));
  }
  EXPECT_EQ(job_->state(), JobState::kFailed);
}

// Detached (graceful) or died: either way the peers fail, naming it.
class JobLeaveTest : public JobTest, public ::testing::WithParamInterface<bool> {};

TEST_P(JobLeaveTest, TrainerLeavingMidIterationFailsItsPeersWithPeerFailedNamingIt) {
  const bool graceful = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartRunning(3));
  WriteAll(0);
  // Local rank 1 goes away halfway through its backward pass.
  MarkAllExcept(/*skip_rank=*/1, /*skip_tensor=*/0);
  job_->Leave(sessions_[1], graceful, "its process exited");
  for (int r : {0, 2}) {
    const absl::Status st = trainers_[r]->Wait(kBound);
    EXPECT_EQ(CodeOf(st), v1::PEER_FAILED) << st;
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
    EXPECT_THAT(
        std::string(st.message()),
        HasSubstr(absl::StrCat(Name(1), graceful ? " detached" : " died", ": its process exited")));
  }
  EXPECT_EQ(job_->state(), JobState::kFailed);
  EXPECT_FALSE(job_->Finished());  // its peers are still attached
}

INSTANTIATE_TEST_SUITE_P(Ways, JobLeaveTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Detached" : "Died";
                         });

TEST_F(JobTest, SkippedGradientTimesOutEveryTrainerNamingTheRankAndTheTensor) {
  ASSERT_NO_FATAL_FAILURE(StartRunning(2, kShortTimeoutMs));
  WriteAll(0);
  const size_t skipped = TensorIndex(trainers_[0]->layout(), "fc2.weight");
  MarkAllExcept(/*skip_rank=*/1, skipped);
  for (int r = 0; r < 2; ++r) {
    const absl::Status st = trainers_[r]->Wait(kBound);
    EXPECT_EQ(CodeOf(st), v1::TIMEOUT) << st;
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr(absl::StrCat(Name(1), " has not marked fc2.weight")));
  }
}

TEST_F(JobTest, BackendFailureReachesEveryTrainerWithTheBackendsError) {
  ASSERT_NO_FATAL_FAILURE(StartRunning(2));
  backend().FailWith(absl::UnavailableError("node 0 closed its connection"));
  WriteAll(0);
  MarkAllExcept();
  for (int r = 0; r < 2; ++r) {
    const absl::Status st = trainers_[r]->Wait(kBound);
    EXPECT_EQ(CodeOf(st), v1::UNAVAILABLE) << st;
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("bucket 0 of iteration 0: fake allreduce failed: node 0 closed its "
                          "connection"));
  }
}

TEST_F(JobTest, CollectiveThatNeverAnswersTimesOutEveryTrainerNamingTheBucket) {
  // The other node is gone without a word; the backend gives up after its
  // own timeout (the daemon gives Gloo its --timeout-s). The job's timeout
  // is out of reach, so the error must be the backend's.
  ASSERT_NO_FATAL_FAILURE(StartRunning(2));
  backend().Stall(absl::Milliseconds(kShortTimeoutMs));
  WriteAll(0);
  MarkAllExcept();
  for (int r = 0; r < 2; ++r) {
    const absl::Status st = trainers_[r]->Wait(kBound);
    EXPECT_EQ(CodeOf(st), v1::TIMEOUT) << st;
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(st.message()),
                HasSubstr("bucket 0 of iteration 0: fake allreduce failed"));
  }
}

TEST_F(JobTest, BadRingEntryFailsItsSenderWithInvalidArgumentAndItsPeersWithPeerFailed) {
  ASSERT_NO_FATAL_FAILURE(StartRunning(3));
  WriteAll(0);
  ipc::ReadyEvent e{};
  e.tensor = 99;
  e.kind = static_cast<uint32_t>(ipc::ReadyKind::kReady);
  ASSERT_TRUE(trainers_[1]->PostRaw(e).ok());
  const absl::Status mine = trainers_[1]->Wait(kBound);
  EXPECT_EQ(CodeOf(mine), v1::INVALID_ARGUMENT) << mine;
  EXPECT_THAT(std::string(mine.message()),
              HasSubstr(absl::StrCat(Name(1), " sent a bad readiness entry")));
  EXPECT_THAT(std::string(mine.message()), HasSubstr("names tensor 99 of 6"));
  for (int r : {0, 2}) {
    const absl::Status st = trainers_[r]->Wait(kBound);
    EXPECT_EQ(CodeOf(st), v1::PEER_FAILED) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(absl::StrCat(Name(1), " failed: ")));
    EXPECT_THAT(std::string(st.message()), HasSubstr("names tensor 99 of 6"));
  }
}

TEST_F(JobTest, AnotherNodeFailingAbortsAStalledCollectiveAndReachesEveryTrainer) {
  ASSERT_NO_FATAL_FAILURE(StartRunning(2));
  backend().Stall(absl::InfiniteDuration());
  WriteAll(0);
  MarkAllExcept();
  ASSERT_TRUE(backend().WaitUntilStalled(1, kBound));
  std::function<void(const absl::Status&)> on_failure;
  {
    absl::MutexLock lock(&mu_);
    on_failure = on_failure_;
  }
  on_failure(MakeError(v1::PEER_FAILED, "node 0 stopped heart-beating"));
  for (int r = 0; r < 2; ++r) {
    const absl::Status st = trainers_[r]->Wait(kBound);
    EXPECT_EQ(CodeOf(st), v1::PEER_FAILED) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("node 0 stopped heart-beating"));
  }
  EXPECT_THAT(backend().abort_reason(), HasSubstr("node 0 stopped heart-beating"));
}

TEST_F(JobTest, WorldFormingErrorIsWhatEveryRegistrationReturns) {
  MakeJob(2);
  {
    absl::MutexLock lock(&mu_);
    former_error_ = MakeError(v1::MISMATCH, "node 0 registered layout hash 0x1234");
  }
  const Layout layout = TestLayout(DType::kFloat32);
  auto results = AttachAndRegister({layout, layout});
  for (const auto& res : results) {
    EXPECT_EQ(CodeOf(res.status()), v1::MISMATCH) << res.status();
    EXPECT_THAT(std::string(res.status().message()),
                HasSubstr("node 0 registered layout hash 0x1234"));
  }
  EXPECT_EQ(job_->state(), JobState::kFailed);
}

}  // namespace
}  // namespace gradsync::testing
