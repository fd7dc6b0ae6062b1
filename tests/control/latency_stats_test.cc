// LatencyStats: nearest-rank percentiles over a ring window, last sample,
// window wrap-around, and concurrent Record/Summarize.
#include "daemon/observe/latency_stats.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace gradsync {
namespace {

TEST(LatencyStats, EmptyIsAllZero) {
  LatencyStats stats(8);
  const LatencyStats::Summary s = stats.Summarize();
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.window, 0u);
  EXPECT_EQ(s.last_us, 0);
  EXPECT_EQ(s.p50_us, 0);
  EXPECT_EQ(s.p99_us, 0);
}

TEST(LatencyStats, NearestRankPercentiles) {
  LatencyStats stats(1024);
  // 1..100 µs in a scrambled order: percentiles must not depend on order.
  for (int i = 0; i < 100; ++i) stats.Record(((i * 37) % 100 + 1) * 1000);
  const LatencyStats::Summary s = stats.Summarize();
  EXPECT_EQ(s.count, 100u);
  EXPECT_EQ(s.window, 100u);
  EXPECT_DOUBLE_EQ(s.p50_us, 50);
  EXPECT_DOUBLE_EQ(s.p99_us, 99);
  EXPECT_DOUBLE_EQ(s.last_us, ((99 * 37) % 100 + 1));
}

TEST(LatencyStats, SingleSample) {
  LatencyStats stats(4);
  stats.Record(1500);  // 1.5 µs
  const LatencyStats::Summary s = stats.Summarize();
  EXPECT_DOUBLE_EQ(s.last_us, 1.5);
  EXPECT_DOUBLE_EQ(s.p50_us, 1.5);
  EXPECT_DOUBLE_EQ(s.p99_us, 1.5);
}

TEST(LatencyStats, WindowKeepsOnlyTheMostRecentSamples) {
  LatencyStats stats(10);
  for (int i = 0; i < 10; ++i) stats.Record(1'000'000);  // old: 1 s each
  for (int i = 1; i <= 10; ++i) stats.Record(i * 1000);  // recent: 1..10 µs
  const LatencyStats::Summary s = stats.Summarize();
  EXPECT_EQ(s.count, 20u);
  EXPECT_EQ(s.window, 10u);
  EXPECT_DOUBLE_EQ(s.p50_us, 5);
  EXPECT_DOUBLE_EQ(s.p99_us, 10);  // the 1 s samples have left the window
  EXPECT_DOUBLE_EQ(s.last_us, 10);
}

TEST(LatencyStats, NegativeDurationCountsAsZeroAndIntervalHelper) {
  LatencyStats stats(4);
  stats.Record(-5);
  EXPECT_EQ(stats.Summarize().last_us, 0);
  stats.RecordInterval(1000, 4000);
  EXPECT_DOUBLE_EQ(stats.Summarize().last_us, 3);
}

TEST(LatencyStats, ResetForgets) {
  LatencyStats stats(4);
  stats.Record(1000);
  stats.Reset();
  EXPECT_EQ(stats.Summarize().count, 0u);
  stats.Record(2000);
  EXPECT_DOUBLE_EQ(stats.Summarize().p99_us, 2);
}

TEST(LatencyStats, ZeroWindowIsClampedToOne) {
  LatencyStats stats(0);
  EXPECT_EQ(stats.capacity(), 1u);
  stats.Record(1000);
  stats.Record(3000);
  EXPECT_DOUBLE_EQ(stats.Summarize().p50_us, 3);
}

TEST(LatencyStats, ConcurrentRecordAndSummarize) {
  LatencyStats stats(64);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 200'000; ++i) stats.Record(7000);
    done = true;
  });
  while (!done) {
    const LatencyStats::Summary s = stats.Summarize();
    if (s.count > 0) {
      ASSERT_DOUBLE_EQ(s.p50_us, 7);
      ASSERT_DOUBLE_EQ(s.p99_us, 7);
    }
  }
  writer.join();
  EXPECT_EQ(stats.Summarize().count, 200'000u);
}

}  // namespace
}  // namespace gradsync
