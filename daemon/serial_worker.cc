#include "daemon/serial_worker.h"

#include <utility>

namespace gradsync {

SerialWorker::SerialWorker(size_t max_queued)
    : max_queued_(max_queued), thread_([this] { Loop(); }) {}

SerialWorker::~SerialWorker() { Stop(); }

bool SerialWorker::Post(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      if (queue_.size() >= max_queued_) return false;
      queue_.push_back(std::move(task));
      return true;
    }
  }
  task(false);
  return true;
}

void SerialWorker::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock join(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool SerialWorker::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void SerialWorker::Loop() {
  while (true) {
    Task task;
    bool run = false;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      run = !stopping_;
    }
    task(run);
  }
}

}  // namespace gradsync
