// WorkerPool: a fixed set of threads that run one fork-join task at a time.
// The reducer splits a bucket into one slice per thread; the calling thread
// takes slice 0 so a pool of N threads uses N cores with N-1 helpers.
// No allocation per task: the task is a function pointer + context.
//
// Threads: Run is called by one thread at a time (the scheduler's); the
// helpers wait for a round under mu_ and run their slice without it.
#ifndef GRADSYNC_DAEMON_ENGINE_WORKER_POOL_H_
#define GRADSYNC_DAEMON_ENGINE_WORKER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class WorkerPool {
 public:
  using Task = void (*)(void* context, size_t slice, size_t slices);

  // `threads` >= 1 including the caller.
  explicit WorkerPool(size_t threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  size_t size() const { return helpers_.size() + 1; }

  // Runs task(context, i, slices) for i in [0, slices) with slices <= size(),
  // and returns when all are done. One Run at a time.
  void Run(Task task, void* context, size_t slices) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop(size_t index) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::CondVar start_cv_;  // a new round, or stop
  absl::CondVar done_cv_;   // pending_ reached 0
  Task task_ ABSL_GUARDED_BY(mu_) = nullptr;
  void* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t slices_ ABSL_GUARDED_BY(mu_) = 0;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> helpers_;  // fixed after construction
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_WORKER_POOL_H_
