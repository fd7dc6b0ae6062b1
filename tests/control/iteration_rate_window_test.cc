// IterationRateWindow: the rate of the last completions, not of the job
// since its start (a slow start-up must not hide a fast steady state).
#include "daemon/observe/iteration_rate_window.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

constexpr int64_t kMs = 1000000;

TEST(IterationRateWindow, NoCompletionIsZero) {
  IterationRateWindow w;
  EXPECT_EQ(w.PerSecond(), 0);
}

TEST(IterationRateWindow, OneCompletionIsOneOverItsDuration) {
  IterationRateWindow w;
  w.Record(3000 * kMs, 3004 * kMs);  // 4 ms
  EXPECT_DOUBLE_EQ(w.PerSecond(), 250);
}

TEST(IterationRateWindow, ASlowStartIsForgottenOnceTheWindowHasFilled) {
  IterationRateWindow w;
  // Iteration 0 ends 5 s in (start-up), then one iteration per ms.
  int64_t t = 5000 * kMs;
  w.Record(t - kMs, t);
  for (int i = 0; i < 40; ++i) {
    w.Record(t, t + kMs);
    t += kMs;
  }
  EXPECT_DOUBLE_EQ(w.PerSecond(), 1000);
}

TEST(IterationRateWindow, ASpeedUpShowsThroughTheShortWindow) {
  IterationRateWindow w;
  int64_t t = 0;
  for (size_t i = 0; i < IterationRateWindow::kWindow; ++i) {
    t += 10 * kMs;
    w.Record(t - 10 * kMs, t);
  }
  EXPECT_DOUBLE_EQ(w.PerSecond(), 100);
  for (size_t i = 0; i < IterationRateWindow::kShort; ++i) {
    t += kMs;
    w.Record(t - kMs, t);
  }
  // The last kShort completions are 1 ms apart; the long window still
  // averages mostly 10 ms gaps.
  EXPECT_DOUBLE_EQ(w.PerSecond(), 1000);
}

}  // namespace
}  // namespace gradsync
