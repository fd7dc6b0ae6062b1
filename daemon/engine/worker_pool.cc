#include "daemon/engine/worker_pool.h"

namespace gradsync {

WorkerPool::WorkerPool(size_t threads) {
  for (size_t i = 1; i < threads; ++i) helpers_.emplace_back([this, i] { Loop(i); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.SignalAll();
  for (auto& t : helpers_) t.join();
}

void WorkerPool::Run(Task task, void* context, size_t slices) {
  if (slices <= 1 || helpers_.empty()) {
    for (size_t i = 0; i < slices; ++i) task(context, i, slices);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    task_ = task;
    context_ = context;
    slices_ = slices;
    pending_ = slices - 1;
    ++round_;
  }
  start_cv_.SignalAll();
  task(context, 0, slices);
  absl::MutexLock lock(&mu_);
  while (pending_ != 0) done_cv_.Wait(&mu_);
}

void WorkerPool::Loop(size_t index) {
  uint64_t seen = 0;
  while (true) {
    Task task;
    void* context;
    size_t slices;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && round_ == seen) start_cv_.Wait(&mu_);
      if (stop_) return;
      seen = round_;
      if (index >= slices_) continue;
      task = task_;
      context = context_;
      slices = slices_;
    }
    task(context, index, slices);
    {
      absl::MutexLock lock(&mu_);
      if (--pending_ == 0) done_cv_.Signal();
    }
  }
}

}  // namespace gradsync
