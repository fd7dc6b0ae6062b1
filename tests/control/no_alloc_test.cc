// The hot-path promise: LatencyStats::Record and FlightRecorder::Record
// never allocate after construction. This binary replaces the global
// operator new to count allocations around the calls.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "daemon/observe/flight_recorder.h"
#include "daemon/observe/latency_stats.h"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace gradsync {
namespace {

TEST(NoAllocation, LatencyStatsRecord) {
  LatencyStats stats(1024);
  const long before = g_allocations.load();
  for (int i = 0; i < 10'000; ++i) stats.Record(i);  // wraps the window ~10 times
  EXPECT_EQ(g_allocations.load() - before, 0);
  // The reader side may allocate; it must still see the samples.
  EXPECT_EQ(stats.Summarize().count, 10'000u);
}

TEST(NoAllocation, FlightRecorderRecord) {
  FlightRecorder recorder(1024);
  const long before = g_allocations.load();
  for (uint32_t i = 0; i < 10'000; ++i) {
    recorder.Record(TraceEventType::kTrainerReady, i, 0, i);
    recorder.Record({MonotonicNowNs(), i, 1, kNoTensor, TraceEventType::kBucketComplete});
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
  EXPECT_EQ(recorder.recorded(), 20'000u);
}

}  // namespace
}  // namespace gradsync
