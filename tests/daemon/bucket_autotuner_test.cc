// The autotuner's pure core: which caps it tries, how it scores them from
// iteration completion times, and that the choice is the fastest candidate.
#include "daemon/engine/bucket_autotuner.h"

#include <gtest/gtest.h>

#include <vector>

namespace gradsync {
namespace {

constexpr int64_t kMs = 1000000;

TEST(AutotuneCandidates, LogSpacedFromQuarterMegabyteTo200WithSmallFirstCaps) {
  const std::vector<CapsCandidate> got = AutotuneCandidates(0.25, 200, 0);
  const std::vector<CapsCandidate> want = {{0.25, 0.25}, {0.25, 1},   {1, 1},  {0.25, 4},
                                           {1, 4},       {0.25, 16},  {1, 16}, {0.25, 64},
                                           {1, 64},      {0.25, 200}, {1, 200}};
  EXPECT_EQ(got, want);
}

TEST(AutotuneCandidates, CapsBeyondTheModelCollapseIntoOne) {
  // 3 MB of gradients: every cap >= 4 MB is one bucket; only 4 MB is kept.
  const std::vector<CapsCandidate> got = AutotuneCandidates(0.25, 200, 3);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back().bucket_cap_mb, 4);
  for (const CapsCandidate& c : got) EXPECT_LE(c.bucket_cap_mb, 4);
}

TEST(ChooseBest, LowestScoreAndFirstOnTies) {
  EXPECT_EQ(ChooseBest({0.3, 0.2, 0.25}), 1u);
  EXPECT_EQ(ChooseBest({0.2, 0.3, 0.2}), 0u);
  EXPECT_FALSE(ChooseBest({}).has_value());
}

TEST(Median, OddEvenEmpty) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({}), 0);
}

// Feeds completion times where iteration i takes step_ms(i) and returns the
// tuner's state after iteration `last`.
template <typename StepMs>
BucketAutotuner FeedSteps(BucketAutotuner tuner, uint64_t last, StepMs step_ms) {
  int64_t t = 0;
  for (uint64_t it = 0; it <= last; ++it) {
    t += step_ms(it) * kMs;
    tuner.OnIterationDone(it, t);
  }
  return tuner;
}

TEST(BucketAutotuner, ScoresTheMedianSkippingTheReplanIterationAndPicksTheFastest) {
  // Three candidates, 1 skipped + 3 scored iterations each, at 10, 14, 18.
  BucketAutotuner tuner({{1, 1}, {1, 4}, {1, 16}}, 1, 3);
  tuner.Place(0, 10);
  tuner.Place(1, 14);
  tuner.Place(2, 18);
  const BucketAutotuner done = FeedSteps(tuner, 21, [](uint64_t it) -> int64_t {
    if (it == 10 || it == 14 || it == 18) return 900;  // re-plan: never scored
    if (it == 12) return 500;                          // one outlier: the median ignores it
    if (it >= 10 && it < 14) return 100;
    if (it >= 14 && it < 18) return 80;
    if (it >= 18) return 120;
    return 1000;
  });
  ASSERT_TRUE(done.done());
  EXPECT_EQ(done.choice(), 1u);
  const auto& r = done.results();
  EXPECT_EQ(r[0].step_s.size(), 3u);
  EXPECT_DOUBLE_EQ(r[0].score_s, 0.1);
  EXPECT_DOUBLE_EQ(r[1].score_s, 0.08);
  EXPECT_DOUBLE_EQ(r[2].score_s, 0.12);
}

TEST(BucketAutotuner, NotDoneUntilTheLastCandidateHasItsIterations) {
  BucketAutotuner tuner({{1, 1}, {1, 4}}, 1, 3);
  tuner.Place(0, 5);
  tuner.Place(1, 9);
  EXPECT_FALSE(FeedSteps(tuner, 11, [](uint64_t) { return 10; }).done());
  EXPECT_TRUE(FeedSteps(tuner, 12, [](uint64_t) { return 10; }).done());
}

TEST(BucketAutotuner, AnUnplacedCandidateIsNeverScored) {
  BucketAutotuner tuner({{1, 1}, {1, 4}}, 1, 3);
  tuner.Place(0, 5);
  const BucketAutotuner after = FeedSteps(tuner, 50, [](uint64_t) { return 10; });
  EXPECT_FALSE(after.done());
  EXPECT_TRUE(after.results()[1].step_s.empty());
  // The first candidate stopped at its 3 iterations.
  EXPECT_EQ(after.results()[0].step_s.size(), 3u);
}

TEST(BucketAutotuner, SameTimesGiveTheSameChoice) {
  auto step = [](uint64_t it) -> int64_t { return 50 + static_cast<int64_t>((it * 7919) % 13); };
  BucketAutotuner a(AutotuneCandidates(), 1, 3);
  BucketAutotuner b(AutotuneCandidates(), 1, 3);
  for (size_t i = 0; i < a.results().size(); ++i) {
    a.Place(i, 3 + 4 * i);
    b.Place(i, 3 + 4 * i);
  }
  const uint64_t last = 3 + 4 * a.results().size();
  const BucketAutotuner ra = FeedSteps(a, last, step), rb = FeedSteps(b, last, step);
  ASSERT_TRUE(ra.done());
  EXPECT_EQ(ra.choice(), rb.choice());
}

}  // namespace
}  // namespace gradsync
