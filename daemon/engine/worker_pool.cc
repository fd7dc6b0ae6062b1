#include "daemon/engine/worker_pool.h"

namespace gradsync {

WorkerPool::WorkerPool(size_t threads) {
  for (size_t i = 1; i < threads; ++i) helpers_.emplace_back([this, i] { Loop(i); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : helpers_) t.join();
}

void WorkerPool::Run(Task task, void* context, size_t slices) {
  if (slices <= 1 || helpers_.empty()) {
    for (size_t i = 0; i < slices; ++i) task(context, i, slices);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = task;
    context_ = context;
    slices_ = slices;
    pending_ = slices - 1;
    ++round_;
  }
  start_cv_.notify_all();
  task(context, 0, slices);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
}

void WorkerPool::Loop(size_t index) {
  uint64_t seen = 0;
  while (true) {
    Task task;
    void* context;
    size_t slices;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || round_ != seen; });
      if (stop_) return;
      seen = round_;
      if (index >= slices_) continue;
      task = task_;
      context = context_;
      slices = slices_;
    }
    task(context, index, slices);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace gradsync
