// StragglerTracker on hand-made timestamps: lateness against the job's
// first trainer, share last (a tie names nobody), the usual bucket, the
// window, the verdict, and two nodes whose clocks differ by hours agreeing
// through the slots they would sum in the per-iteration allreduce.
#include "daemon/observe/straggler_tracker.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

namespace gradsync {
namespace {

constexpr int64_t kMs = 1000000;

struct Mark {
  int local_rank;
  uint32_t bucket;
  int64_t ns;
};

// One iteration: the marks, then each bucket's reduction returning at
// `bucket_done_ns` (the last at `done_ns`, the default for every bucket).
void Iteration(StragglerTracker& t, const std::vector<Mark>& marks, int64_t done_ns,
               std::vector<int64_t> bucket_done_ns = {}) {
  uint32_t buckets = 0;
  for (const Mark& m : marks) {
    t.OnMark(m.local_rank, m.bucket, m.ns);
    buckets = std::max(buckets, m.bucket + 1);
  }
  std::vector<BucketTimeline> timelines(buckets);
  for (uint32_t b = 0; b < buckets; ++b) {
    timelines[b].bucket = b;
    timelines[b].done_ns = b < bucket_done_ns.size() ? bucket_done_ns[b] : done_ns;
  }
  t.OnIterationDone(static_cast<uint64_t>(done_ns / (100 * kMs)), timelines);
}

std::vector<v1::TrainerLateness> Rows(const StragglerTracker& t, v1::StragglerSettings* set) {
  google::protobuf::RepeatedPtrField<v1::TrainerLateness> rows;
  t.Fill(&rows, set);
  return {rows.begin(), rows.end()};
}

std::unique_ptr<StragglerTracker> OneNode(int trainers, StragglerOptions options = {}) {
  auto t = std::make_unique<StragglerTracker>("job", 0, 1);
  t->SetOptions(options);
  std::vector<StragglerTracker::TrainerId> ids;
  for (int r = 0; r < trainers; ++r) ids.push_back({r, r, 100 + r});
  t->Begin(ids, /*exchanged=*/false);
  return t;
}

TEST(StragglerTrackerTest, TheTrainerLateForBucket1IsNamedWithItsLatenessAndBucket) {
  std::unique_ptr<StragglerTracker> owned = OneNode(3);
  StragglerTracker& t = *owned;
  std::vector<std::pair<uint64_t, int>> named;
  t.set_named_listener([&](uint64_t it, int rank) { named.push_back({it, rank}); });
  for (int it = 0; it < 12; ++it) {
    const int64_t base = it * 100 * kMs;
    // Bucket 0 together; trainer 2 completes bucket 1 15 ms after the others.
    Iteration(t,
              {{0, 0, base + 1 * kMs},
               {1, 0, base + 1 * kMs},
               {2, 0, base + 1 * kMs},
               {0, 1, base + 2 * kMs},
               {1, 1, base + 3 * kMs},
               {2, 1, base + 17 * kMs}},
              base + 20 * kMs);
  }
  v1::StragglerSettings set;
  const std::vector<v1::TrainerLateness> rows = Rows(t, &set);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(set.window(), 100u);
  EXPECT_EQ(rows[2].window_iterations(), 12u);
  EXPECT_DOUBLE_EQ(rows[2].late_mean_us(), 15000);
  EXPECT_DOUBLE_EQ(rows[2].late_p99_us(), 15000);
  EXPECT_DOUBLE_EQ(rows[2].share_last(), 1);
  EXPECT_EQ(rows[2].usual_bucket(), 1);
  EXPECT_TRUE(rows[2].straggler());
  EXPECT_EQ(rows[2].pid(), 102);
  EXPECT_EQ(rows[2].scope(), "node clock");
  EXPECT_EQ(rows[2].lateness().histogram_count(), 12u);
  // Trainer 0 marked first: never late; trainer 1 1 ms late, never last.
  EXPECT_DOUBLE_EQ(rows[0].late_mean_us(), 0);
  EXPECT_EQ(rows[0].usual_bucket(), -1);
  EXPECT_DOUBLE_EQ(rows[1].late_mean_us(), 1000);
  EXPECT_DOUBLE_EQ(rows[1].share_last(), 0);
  EXPECT_EQ(rows[1].usual_bucket(), 1);
  EXPECT_FALSE(rows[0].straggler());
  EXPECT_FALSE(rows[1].straggler());
  // Named once (with its log line), as soon as the window held enough
  // iterations: the 10th, iteration 9.
  EXPECT_EQ(named, (std::vector<std::pair<uint64_t, int>>{{9, 2}}));
}

TEST(StragglerTrackerTest, MarksSeenAtTheSameInstantNameNobodyLast) {
  std::unique_ptr<StragglerTracker> owned = OneNode(2);
  StragglerTracker& t = *owned;
  for (int it = 0; it < 12; ++it) {
    Iteration(t, {{0, 0, it * kMs}, {1, 0, it * kMs}}, it * kMs + 500000);
  }
  v1::StragglerSettings set;
  for (const v1::TrainerLateness& row : Rows(t, &set)) {
    EXPECT_DOUBLE_EQ(row.share_last(), 0);
    EXPECT_DOUBLE_EQ(row.late_mean_us(), 0);
    EXPECT_FALSE(row.straggler());
  }
}

TEST(StragglerTrackerTest, FewerIterationsThanTheMinimumNameNobody) {
  std::unique_ptr<StragglerTracker> owned = OneNode(2);
  StragglerTracker& t = *owned;
  for (uint32_t it = 0; it + 1 < StragglerTracker::kMinVerdictIterations; ++it) {
    const int64_t base = it * 100 * kMs;
    Iteration(t, {{0, 0, base}, {1, 0, base + 50 * kMs}}, base + 60 * kMs);
  }
  v1::StragglerSettings set;
  const std::vector<v1::TrainerLateness> rows = Rows(t, &set);
  EXPECT_DOUBLE_EQ(rows[1].share_last(), 1);
  EXPECT_FALSE(rows[1].straggler());
}

TEST(StragglerTrackerTest, TheWindowKeepsOnlyTheLatestIterations) {
  StragglerOptions options;
  options.window = 10;
  std::unique_ptr<StragglerTracker> owned = OneNode(2, options);
  StragglerTracker& t = *owned;
  for (int it = 0; it < 30; ++it) {
    const int64_t base = it * 100 * kMs;
    // Trainer 1 is late by 40 ms in the first 20 iterations only.
    const int64_t late = it < 20 ? 40 * kMs : 0;
    Iteration(t, {{0, 0, base}, {1, 0, base + late}}, base + 50 * kMs);
  }
  v1::StragglerSettings set;
  const std::vector<v1::TrainerLateness> rows = Rows(t, &set);
  EXPECT_EQ(rows[1].window_iterations(), 10u);
  EXPECT_DOUBLE_EQ(rows[1].late_mean_us(), 0);
  EXPECT_DOUBLE_EQ(rows[1].share_last(), 0);
  EXPECT_FALSE(rows[1].straggler());
  // The histogram counts every iteration.
  EXPECT_EQ(rows[1].lateness().histogram_count(), 30u);
}

TEST(StragglerTrackerTest, TwoNodesWithUnrelatedClocksAgreeThroughTheirSlots) {
  StragglerTracker node0("job", 0, 2), node1("job", 1, 2);
  node0.Begin({{0, 0, 10}}, /*exchanged=*/true);
  node1.Begin({{0, 1, 11}}, /*exchanged=*/true);
  const int64_t offset1 = 3600000 * kMs;  // node 1's clock reads an hour ahead
  for (int it = 0; it < 12; ++it) {
    const int64_t base = it * 100 * kMs;
    // In true time: both trainers mark bucket 0 at +2 ms, whose reduction
    // returns at +3 ms on both nodes; node 0's trainer marks bucket 1 at
    // +5 ms, node 1's at +18 ms, and bucket 1 returns on both at +20 ms.
    Iteration(node0, {{0, 0, base + 2 * kMs}, {0, 1, base + 5 * kMs}}, base + 20 * kMs,
              {base + 3 * kMs, base + 20 * kMs});
    Iteration(node1, {{0, 0, offset1 + base + 2 * kMs}, {0, 1, offset1 + base + 18 * kMs}},
              offset1 + base + 20 * kMs, {offset1 + base + 3 * kMs, offset1 + base + 20 * kMs});
    // The next iteration's agreement: each writes its slots, the allreduce sums.
    std::vector<double> a(node0.agreement_slots()), b(node1.agreement_slots()), sum(a.size());
    node0.WriteAgreement(a.data());
    node1.WriteAgreement(b.data());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = a[i] + b[i];
    node0.ReadAgreement(sum.data());
    node1.ReadAgreement(sum.data());
  }
  v1::StragglerSettings set;
  const std::vector<v1::TrainerLateness> rows0 = Rows(node0, &set);
  const std::vector<v1::TrainerLateness> rows1 = Rows(node1, &set);
  ASSERT_EQ(rows0.size(), 1u);
  ASSERT_EQ(rows1.size(), 1u);
  EXPECT_DOUBLE_EQ(rows0[0].late_mean_us(), 0);
  EXPECT_DOUBLE_EQ(rows0[0].share_last(), 0);
  EXPECT_EQ(rows0[0].usual_bucket(), -1);
  EXPECT_FALSE(rows0[0].straggler());
  EXPECT_EQ(rows1[0].rank(), 1);
  EXPECT_EQ(rows1[0].node_rank(), 1);
  EXPECT_DOUBLE_EQ(rows1[0].late_mean_us(), 13000);
  EXPECT_DOUBLE_EQ(rows1[0].share_last(), 1);
  // Alone on its node, it is late for bucket 1 against node 0's trainer.
  EXPECT_EQ(rows1[0].usual_bucket(), 1);
  EXPECT_TRUE(rows1[0].straggler());
  EXPECT_EQ(rows1[0].scope(), "job");
}

TEST(StragglerTrackerTest, AnExchangedIterationWaitsForTheAgreement) {
  StragglerTracker node0("job", 0, 2);
  node0.Begin({{0, 0, 10}}, /*exchanged=*/true);
  Iteration(node0, {{0, 0, 5 * kMs}}, 20 * kMs);
  v1::StragglerSettings set;
  EXPECT_EQ(Rows(node0, &set)[0].window_iterations(), 0u);
  // A node whose trainers all joined sends zeros: only node 0's figures count.
  std::vector<double> slots(node0.agreement_slots());
  node0.WriteAgreement(slots.data());
  EXPECT_EQ(slots[0], 1);
  node0.ReadAgreement(slots.data());
  const v1::TrainerLateness row = Rows(node0, &set)[0];
  EXPECT_EQ(row.window_iterations(), 1u);
  EXPECT_DOUBLE_EQ(row.late_mean_us(), 0);
}

// Nodes 0 and 2 of a 3-node job after node 1 died: the survivors' slots
// are their places among the two members (node 2 at place 1), and node 2's
// late trainer is named by its node rank, its windows going on from before.
TEST(StragglerTrackerTest, AfterAReformationSlotsArePlacesAmongTheMembers) {
  StragglerTracker node0("job", 0, 3), node2("job", 2, 3);
  node0.Begin({{0, 0, 10}}, /*exchanged=*/true);
  node2.Begin({{0, 2, 12}}, /*exchanged=*/true);
  node0.SetWorld(/*node_index=*/0, /*num_nodes=*/2, /*exchanged=*/true);
  node2.SetWorld(/*node_index=*/1, /*num_nodes=*/2, /*exchanged=*/true);
  ASSERT_EQ(node0.agreement_slots(), node2.agreement_slots());
  EXPECT_EQ(node2.agreement_slots(),
            StragglerTracker::kHeadSlots +
                2 * (StragglerTracker::kSlotsPerNode + StragglerTracker::kExchangedBuckets));
  for (int it = 0; it < 12; ++it) {
    const int64_t base = it * 100 * kMs;
    Iteration(node0, {{0, 0, base + 5 * kMs}}, base + 25 * kMs);
    Iteration(node2, {{0, 0, base + 20 * kMs}}, base + 25 * kMs);
    std::vector<double> a(node0.agreement_slots()), b(node2.agreement_slots()), sum(a.size());
    node0.WriteAgreement(a.data());
    node2.WriteAgreement(b.data());
    // Node 2 writes at place 1, never past the two members' slots.
    EXPECT_GT(b[StragglerTracker::kHeadSlots + StragglerTracker::kSlotsPerNode], 0);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = a[i] + b[i];
    node0.ReadAgreement(sum.data());
    node2.ReadAgreement(sum.data());
  }
  v1::StragglerSettings set;
  const std::vector<v1::TrainerLateness> rows2 = Rows(node2, &set);
  ASSERT_EQ(rows2.size(), 1u);
  EXPECT_EQ(rows2[0].node_rank(), 2);
  EXPECT_EQ(rows2[0].rank(), 2);
  EXPECT_EQ(rows2[0].window_iterations(), 12u);
  EXPECT_DOUBLE_EQ(rows2[0].late_mean_us(), 15000);
  EXPECT_TRUE(rows2[0].straggler());
  EXPECT_FALSE(Rows(node0, &set)[0].straggler());
}

}  // namespace
}  // namespace gradsync
