// SerialWorker: tasks run in order on its thread, the queue is bounded, and
// Stop answers what is still queued (run=false) instead of running it.
#include "daemon/serial_worker.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace gradsync {
namespace {

TEST(SerialWorkerTest, RunsInOrderBoundsTheQueueAndStopAnswersTheRest) {
  SerialWorker worker(2);
  absl::Notification started, release;
  absl::Mutex mu;
  std::vector<std::pair<int, bool>> ran;
  auto record = [&](int n) {
    return [&, n](bool run) {
      absl::MutexLock lock(&mu);
      ran.emplace_back(n, run);
    };
  };
  // The first task holds the thread, so the next two wait in the queue.
  ASSERT_TRUE(worker.Post([&](bool) {
    started.Notify();
    release.WaitForNotification();
  }));
  started.WaitForNotification();
  ASSERT_TRUE(worker.Post(record(1)));
  ASSERT_TRUE(worker.Post(record(2)));
  EXPECT_FALSE(worker.Post(record(3)));  // the queue holds 2
  release.Notify();
  {
    absl::MutexLock lock(&mu);
    auto both = [&] { return ran.size() == 2; };
    mu.Await(absl::Condition(&both));
    EXPECT_EQ(ran, (std::vector<std::pair<int, bool>>{{1, true}, {2, true}}));
  }

  // Queued behind a running task at Stop: answered with run=false.
  absl::Notification started2, release2;
  ASSERT_TRUE(worker.Post([&](bool) {
    started2.Notify();
    release2.WaitForNotification();
  }));
  started2.WaitForNotification();
  ASSERT_TRUE(worker.Post(record(4)));
  std::thread stopper([&] { worker.Stop(); });
  while (!worker.stopping()) std::this_thread::yield();
  release2.Notify();
  stopper.join();
  // After Stop a task is answered at once, on the caller's thread.
  EXPECT_TRUE(worker.Post(record(5)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(ran, (std::vector<std::pair<int, bool>>{{1, true}, {2, true}, {4, false}, {5, false}}));
}

}  // namespace
}  // namespace gradsync
