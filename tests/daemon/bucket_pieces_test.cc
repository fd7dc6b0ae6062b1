// The cut every node must agree on, and the pipeline's order: sum k+1 and
// write-back k-1 around collective k, awaits in issue order, and the first
// error ends the bucket with nothing more issued or written back.
#include "daemon/engine/bucket_pieces.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/monotonic.h"

namespace gradsync {
namespace {

TEST(CutBucketPieces, CoversTheBucketWithQuarterEndPiecesAroundNearEqualPiecesOfAtMostTheCap) {
  const uint64_t elements = 100'000'000 / 4;  // 100 MB of fp32
  const uint64_t cap = 8 << 20;
  std::vector<BucketPiece> pieces;
  CutBucketPieces(elements, 4, cap, &pieces);
  // 2 MiB, then 100 MB - 4 MiB in 12 pieces of at most 8 MiB, then 2 MiB.
  ASSERT_EQ(pieces.size(), 14u);
  EXPECT_EQ(pieces.front().count * 4, cap / kEndPieceDivisor);
  // The last piece ends the bucket in the middle of a page.
  EXPECT_LE(pieces.back().count * 4, cap / kEndPieceDivisor);
  EXPECT_GT(pieces.back().count * 4, cap / kEndPieceDivisor - 4096);
  uint64_t next = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("piece ", i));
    EXPECT_EQ(pieces[i].first, next);
    EXPECT_LE(pieces[i].count * 4, cap);
    if (i > 0 && i + 1 < pieces.size()) {
      EXPECT_GE(pieces[i].count * 4, cap * 9 / 10);  // near-equal, no sliver
    }
    if (i + 1 < pieces.size()) {
      EXPECT_EQ(pieces[i].count * 4 % 4096, 0u);
    }
    next += pieces[i].count;
  }
  EXPECT_EQ(next, elements);
  EXPECT_EQ(CountBucketPieces(elements, 4, cap), pieces.size());
}

TEST(CutBucketPieces, ABucketOfTwoPiecesHasNoEndPiecesAndOneOfThreeHas) {
  const uint64_t cap = 8 << 20;
  std::vector<BucketPiece> pieces;
  // 16 MiB of fp64: two pieces of 8 MiB (end pieces would add two collectives).
  CutBucketPieces(2 * cap / 8, 8, cap, &pieces);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].count * 8, cap);
  EXPECT_EQ(pieces[1].first, pieces[0].count);
  EXPECT_EQ(pieces[1].count * 8, cap);
  // One element more needs three: 2 MiB, two near-equal middle pieces, 2 MiB.
  const uint64_t elements = 2 * cap / 8 + 1;
  CutBucketPieces(elements, 8, cap, &pieces);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[0].count * 8, cap / kEndPieceDivisor);
  EXPECT_EQ(pieces[1].first, pieces[0].count);
  EXPECT_EQ(pieces[1].count * 8, 6u << 20);
  EXPECT_EQ(pieces[2].first, pieces[1].first + pieces[1].count);
  EXPECT_EQ(pieces[2].count * 8, (6u << 20) + 4096);  // the bucket's last, partial page
  EXPECT_EQ(pieces[3].first, pieces[2].first + pieces[2].count);
  EXPECT_EQ(pieces[3].first + pieces[3].count, elements);
  EXPECT_LE(pieces[3].count * 8, cap / kEndPieceDivisor);
  EXPECT_EQ(CountBucketPieces(elements, 8, cap), 4u);
}

TEST(CutBucketPieces, ASmallBucketIsOnePieceAndAnEmptyOneNone) {
  std::vector<BucketPiece> pieces;
  CutBucketPieces(1000, 4, 8 << 20, &pieces);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].first, 0u);
  EXPECT_EQ(pieces[0].count, 1000u);
  CutBucketPieces((8 << 20) / 8, 8, 8 << 20, &pieces);  // exactly the cap
  EXPECT_EQ(pieces.size(), 1u);
  CutBucketPieces(0, 4, 8 << 20, &pieces);
  EXPECT_TRUE(pieces.empty());
}

TEST(CutBucketPieces, DependsOnlyOnItsArguments) {
  // Every node computes it from the plan: the same input, the same cut.
  std::vector<BucketPiece> a, b;
  CutBucketPieces(12'345'679, 4, 8 << 20, &a);
  CutBucketPieces(777, 4, 8 << 20, &b);  // reused vector: no leftovers
  CutBucketPieces(12'345'679, 4, 8 << 20, &b);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(CountBucketPieces(12'345'679, 4, 8 << 20), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].count, b[i].count);
  }
}

// Collectives that complete only when awaited, as a worker process's do
// from the scheduler's point of view; records every step.
class QueuedBackend final : public Backend {
 public:
  std::string name() const override { return "queued"; }
  int num_nodes() const override { return 2; }
  absl::Status AllreduceSum(void*, size_t, DType) override {
    return absl::InternalError("the pipeline must issue, not call AllreduceSum");
  }
  absl::Status IssueAllreduceSum(void*, size_t count, DType) override {
    log.push_back(absl::StrCat("launch ", count));
    queue_.push_back(count);
    return absl::OkStatus();
  }
  absl::Status AwaitIssued() override {
    if (queue_.empty()) return absl::InternalError("awaited with none issued");
    const size_t count = queue_.front();
    queue_.pop_front();
    log.push_back(absl::StrCat("await ", count));
    if (++awaits_ == fail_at_await) {
      return absl::Status(absl::StatusCode::kUnavailable, "node_rank=1 died");
    }
    return absl::OkStatus();
  }
  void Abort(const std::string&) override {}

  std::vector<std::string> log;
  int fail_at_await = 0;  // 1-based; 0: never

 private:
  std::deque<size_t> queue_;
  int awaits_ = 0;
};

absl::Status RunLogged(const std::vector<BucketPiece>& pieces, QueuedBackend& backend) {
  auto sum = [&](const BucketPiece& p) { backend.log.push_back(absl::StrCat("sum ", p.count)); };
  auto issue = [&](const BucketPiece& p) {
    return backend.IssueAllreduceSum(nullptr, p.count, DType::kFloat32);
  };
  auto write_back = [&](const BucketPiece& p) {
    backend.log.push_back(absl::StrCat("write_back ", p.count));
  };
  PipelineTimings timings;
  return RunPiecePipeline(pieces, backend, PieceSteps{sum, issue, write_back}, &timings);
}

TEST(RunPiecePipeline, SumsTheNextAndWritesBackThePreviousAroundEachCollective) {
  QueuedBackend backend;
  ASSERT_TRUE(RunLogged({{0, 1}, {1, 2}, {3, 3}}, backend).ok());
  const std::vector<std::string> expected = {"sum 1",   "launch 1",     "sum 2",   "launch 2",
                                             "await 1", "write_back 1", "sum 3",   "launch 3",
                                             "await 2", "write_back 2", "await 3", "write_back 3"};
  EXPECT_EQ(backend.log, expected);
}

// Spins until `ns` have passed on the clock the pipeline reads.
void Busy(int64_t ns) {
  const int64_t until = MonotonicNowNs() + ns;
  while (MonotonicNowNs() < until) {
  }
}

TEST(RunPiecePipeline, TheCriticalPathIsTheFirstSumTheCollectivesSpanAndTheLastWriteBack) {
  QueuedBackend backend;
  constexpr int64_t kStep = 2'000'000;  // each sum and write-back spins 2 ms
  auto sum = [&](const BucketPiece&) { Busy(kStep); };
  auto issue = [&](const BucketPiece& p) {
    return backend.IssueAllreduceSum(nullptr, p.count, DType::kFloat32);
  };
  auto write_back = [&](const BucketPiece&) { Busy(kStep); };
  PipelineTimings t;
  const int64_t start = MonotonicNowNs();
  ASSERT_TRUE(
      RunPiecePipeline({{0, 1}, {1, 2}, {3, 3}}, backend, PieceSteps{sum, issue, write_back}, &t)
          .ok());
  const int64_t wall = MonotonicNowNs() - start;
  // The daemon's own work: three sums and three write-backs.
  EXPECT_GE(t.sum_ns, 3 * kStep);
  EXPECT_GE(t.write_back_ns, 3 * kStep);
  // Exposed: only the first sum and the last write-back; the two later sums
  // and the two earlier write-backs ran with a collective in flight.
  EXPECT_GE(t.exposed_sum_ns, kStep);
  EXPECT_GE(t.exposed_write_back_ns, kStep);
  EXPECT_GE(t.collective_span_ns, 4 * kStep);
  // The three parts of the critical path do not overlap: the span holds
  // the four hidden steps, not the exposed two.
  EXPECT_LE(t.exposed_sum_ns + t.collective_span_ns + t.exposed_write_back_ns, wall);
}

TEST(RunPiecePipeline, OnePieceIsSumIssueAwaitWriteBack) {
  QueuedBackend backend;
  ASSERT_TRUE(RunLogged({{0, 5}}, backend).ok());
  const std::vector<std::string> expected = {"sum 5", "launch 5", "await 5", "write_back 5"};
  EXPECT_EQ(backend.log, expected);
}

TEST(RunPiecePipeline, AFailedPieceEndsTheBucketWithItsError) {
  QueuedBackend backend;
  backend.fail_at_await = 2;  // the second piece's collective fails
  const absl::Status st = RunLogged({{0, 1}, {1, 2}, {3, 3}, {6, 4}}, backend);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "node_rank=1 died");
  // Piece 2 is not written back; nothing after the failure is issued.
  const std::vector<std::string> expected = {"sum 1",    "launch 1", "sum 2",
                                             "launch 2", "await 1",  "write_back 1",
                                             "sum 3",    "launch 3", "await 2"};
  EXPECT_EQ(backend.log, expected);
}

}  // namespace
}  // namespace gradsync
