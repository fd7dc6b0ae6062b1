// The judgement survivors make right after a re-formation
// (daemon/engine/split_iteration.h), the result an elastic node keeps for
// them (daemon/engine/kept_result.h), and the rendezvous rule that lets
// survivors one iteration apart form a generation (daemon/cluster/resume_rule.h).
#include "daemon/engine/split_iteration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/status_code.h"
#include "daemon/cluster/resume_rule.h"
#include "daemon/engine/kept_result.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

// Each survivor's slots summed, as the allreduce does.
std::vector<double> Summed(const std::vector<StoppedAt>& survivors) {
  const int nodes = static_cast<int>(survivors.size());
  std::vector<double> sum;
  for (int p = 0; p < nodes; ++p) {
    const std::vector<double> slots = StoppedAtSlots(survivors[p], p, nodes);
    if (sum.empty()) sum.assign(slots.size(), 0.0);
    for (size_t i = 0; i < slots.size(); ++i) sum[i] += slots[i];
  }
  return sum;
}

StoppedAt Survivor(int node_rank, uint64_t iteration, bool holds_previous) {
  StoppedAt s;
  s.node_rank = node_rank;
  s.iteration = iteration;
  s.holds_previous = holds_previous;
  s.divisor = 6;
  s.plan_version = 2;
  s.kept_bytes = 4096;
  return s;
}

TEST(JudgeSplit, SurvivorsInTheSameIterationHaveNothingToCommit) {
  absl::StatusOr<SplitVerdict> v =
      JudgeSplit(Summed({Survivor(0, 5, true), Survivor(1, 5, true)}), 2);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_FALSE(v->split);
}

TEST(JudgeSplit, OneApartTheFirstThatCompletedAndHoldsTheResultHandsItOverWithItsDivisor) {
  StoppedAt holder = Survivor(3, 6, true);
  holder.skipped = true;
  absl::StatusOr<SplitVerdict> v = JudgeSplit(
      Summed({Survivor(0, 5, true), Survivor(1, 6, false), holder, Survivor(4, 5, false)}), 4);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->split);
  EXPECT_EQ(v->iteration, 5u);
  EXPECT_EQ(v->root, 2);  // node 1 completed 5 but holds no result
  EXPECT_EQ(v->root_node_rank, 3);
  EXPECT_EQ(v->divisor, 6);
  EXPECT_TRUE(v->skipped);
  EXPECT_EQ(v->completed_by, "node_rank=1,node_rank=3");
  EXPECT_EQ(v->behind, "node_rank=0,node_rank=4");
}

TEST(JudgeSplit, NoSurvivorHoldingTheResultFailsNamingWhoCompletedIt) {
  absl::StatusOr<SplitVerdict> v =
      JudgeSplit(Summed({Survivor(0, 5, true), Survivor(1, 6, false)}), 2);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(CodeOf(v.status()), v1::PEER_FAILED);
  EXPECT_THAT(v.status().message(),
              HasSubstr("iteration 5 was completed by node_rank=1 but not by node_rank=0"));
  EXPECT_THAT(v.status().message(), HasSubstr("none of them still holds its result"));
}

TEST(JudgeSplit, APlanDecidedAtTheSplitIterationsEndFailsNamingBothVersions) {
  StoppedAt ahead = Survivor(1, 6, true);
  ahead.plan_version = 3;
  absl::StatusOr<SplitVerdict> v = JudgeSplit(Summed({Survivor(0, 5, true), ahead}), 2);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(CodeOf(v.status()), v1::PEER_FAILED);
  EXPECT_THAT(v.status().message(),
              HasSubstr("node_rank=1 decided a new plan at its end (plan version 3, node_rank=0 "
                        "has 2)"));
}

TEST(JudgeSplit, TheVerdictNamesTheRootsFirstGpuForTheDeviceBroadcast) {
  StoppedAt behind = Survivor(0, 5, true);
  behind.first_nccl_rank = 0;
  StoppedAt holder = Survivor(1, 6, true);
  holder.first_nccl_rank = 2;
  absl::StatusOr<SplitVerdict> v = JudgeSplit(Summed({behind, holder}), 2);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->split);
  EXPECT_EQ(v->root, 1);
  EXPECT_EQ(v->root_nccl_rank, 2);
}

TEST(JudgeSplit, MoreThanOneApartFailsNamingBoth) {
  absl::StatusOr<SplitVerdict> v =
      JudgeSplit(Summed({Survivor(0, 5, true), Survivor(1, 7, true)}), 2);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(CodeOf(v.status()), v1::PEER_FAILED);
  EXPECT_THAT(v.status().message(),
              HasSubstr("stopped in iterations 5 (node_rank=0) and up to 7 (node_rank=1)"));
}

// What the reducer's write-back writes through the sink: `spans` of `arena`.
void WriteThroughSink(KeptResult& kept, const uint8_t* arena,
                      const std::vector<ReduceSpan>& spans) {
  KeptResultSink* sink = kept.sink();
  sink->written = true;
  for (const ReduceSpan& s : spans) std::memcpy(sink->base + s.offset, arena + s.offset, s.bytes);
}

TEST(KeptResult, HoldsAnIterationOnlyOnceEveryBucketWasKeptAndUntilTheNextOneBegins) {
  KeptResult kept;
  kept.Resize(64);
  std::vector<uint8_t> arena(64);
  for (size_t i = 0; i < arena.size(); ++i) arena[i] = static_cast<uint8_t>(i + 1);
  const std::vector<ReduceSpan> first = {{0, 16}}, second = {{32, 32}};
  WriteThroughSink(kept, arena.data(), first);
  kept.Kept(4, 0);
  kept.Complete(4, 2, 6, false);
  EXPECT_FALSE(kept.Holds(4));  // bucket 1 missing
  WriteThroughSink(kept, arena.data(), second);
  kept.Kept(4, 1);
  kept.Complete(4, 2, 6, false);
  EXPECT_TRUE(kept.Holds(4));
  EXPECT_EQ(kept.divisor(), 6);
  std::vector<uint8_t> other(64, 0);
  kept.WriteBack(other.data(), first);
  kept.WriteBack(other.data(), second);
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(other[i], (i < 16 || i >= 32) ? arena[i] : 0) << "byte " << i;
  }
  WriteThroughSink(kept, arena.data(), first);
  kept.Kept(5, 0);
  EXPECT_FALSE(kept.Holds(4));
  EXPECT_FALSE(kept.Holds(5));
}

TEST(KeptResult, HoldsNothingOnceTheNextIterationsWriteBackBeganEvenIfItsReductionFailed) {
  KeptResult kept;
  kept.Resize(16);
  std::vector<uint8_t> arena(16, 7);
  WriteThroughSink(kept, arena.data(), {{0, 16}});
  kept.Kept(4, 0);
  kept.Complete(4, 1, 2, false);
  ASSERT_TRUE(kept.Holds(4));
  // Iteration 5's first piece was written back, then its collective failed:
  // Kept is never called, and the buffer is no longer iteration 4's.
  WriteThroughSink(kept, arena.data(), {{0, 8}});
  EXPECT_FALSE(kept.Holds(4));
  // A result received whole holds again.
  kept.Drop();
  kept.Received(4, 2, false);
  EXPECT_TRUE(kept.Holds(4));
}

TEST(ResumeRule, SurvivorsAtMostOneIterationApartMayFormAGeneration) {
  EXPECT_EQ(CheckResumeIterations(1, {{0, 5}, {1, 5}}, "node_rank=2"), "");
  EXPECT_EQ(CheckResumeIterations(1, {{0, 5}, {1, 6}, {3, 6}}, "node_rank=2"), "");
  const std::string error = CheckResumeIterations(1, {{0, 7}, {1, 6}, {3, 5}}, "node_rank=2 (x)");
  EXPECT_THAT(error, HasSubstr("stopped in different iterations more than one apart (node_rank=3 "
                               "in 5, node_rank=0 in 7)"));
  EXPECT_THAT(error, HasSubstr("dead: node_rank=2 (x)"));
}

}  // namespace
}  // namespace gradsync
