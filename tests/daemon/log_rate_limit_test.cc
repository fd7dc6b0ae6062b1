// LogRateLimiter on an injected monotonic clock: a flood is logged in a
// bounded number of lines that account for every event.
#include "daemon/log_rate_limit.h"

#include <gtest/gtest.h>

#include <vector>

namespace gradsync {
namespace {

struct FakeClock {
  absl::Time now = absl::UnixEpoch();
  MonotonicClock Get() {
    return [this] { return now; };
  }
};

TEST(LogRateLimiter, AFloodIsABurstThenLinesAtDoublingCountsThatAccountForEveryEvent) {
  FakeClock clock;
  LogRateLimiter limiter(10, absl::Seconds(10), absl::Seconds(60), clock.Get());
  std::vector<LogRateLimiter::Line> lines;
  for (int i = 0; i < 1000; ++i) {
    if (auto line = limiter.Admit()) lines.push_back(*line);
  }
  // 1..10, then 20, 40, 80, 160, 320, 640.
  ASSERT_EQ(lines.size(), 16u);
  uint64_t accounted = 0;
  for (const auto& l : lines) accounted += 1 + l.suppressed;
  EXPECT_EQ(lines.back().count, 640u);
  EXPECT_EQ(lines.back().suppressed, 319u);
  EXPECT_EQ(accounted, 640u);
  // The rest (641..1000) is reported with the next episode's first line.
  clock.now += absl::Seconds(60);
  auto next = limiter.Admit();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->count, 1u);
  EXPECT_EQ(next->suppressed, 360u);
}

TEST(LogRateLimiter, ASlowSteadyFloodGetsALineEveryInterval) {
  FakeClock clock;
  LogRateLimiter limiter(2, absl::Seconds(10), absl::Seconds(60), clock.Get());
  int logged = 0;
  // 1 event per second for 100 s: never quiet, never a doubling after 64.
  for (int i = 0; i < 100; ++i) {
    if (limiter.Admit()) ++logged;
    clock.now += absl::Seconds(1);
  }
  // Events 1, 2 (the burst), 4, 8, 16, 32, 64 (doubling counts) and 26, 42,
  // 52, 62, 74, 84, 94 (10 s after the previous line).
  EXPECT_EQ(logged, 14);
}

}  // namespace
}  // namespace gradsync
