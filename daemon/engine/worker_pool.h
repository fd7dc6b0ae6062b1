// WorkerPool: a fixed set of threads that run one fork-join task at a time.
// The reducer splits a bucket into one slice per thread; the calling thread
// takes slice 0 so a pool of N threads uses N cores with N-1 helpers.
// No allocation per task: the task is a function pointer + context.
#ifndef GRADSYNC_DAEMON_ENGINE_WORKER_POOL_H_
#define GRADSYNC_DAEMON_ENGINE_WORKER_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

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
  void Run(Task task, void* context, size_t slices);

 private:
  void Loop(size_t index);

  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  Task task_ = nullptr;
  void* context_ = nullptr;
  size_t slices_ = 0;
  size_t pending_ = 0;
  uint64_t round_ = 0;
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_WORKER_POOL_H_
