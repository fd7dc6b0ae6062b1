#include "gpu/sim/sim_stream.h"

#include <algorithm>
#include <set>
#include <utility>

namespace gradsync::gpu::sim {
namespace {

// Live streams, so that a stale or foreign Stream* is refused rather than
// dereferenced.
absl::Mutex live_mu(absl::kConstInit);
std::set<SimStream*>& Live() ABSL_EXCLUSIVE_LOCKS_REQUIRED(live_mu) {
  static auto* live = new std::set<SimStream*>();
  return *live;
}

}  // namespace

SimStream::SimStream(int device_index, absl::Duration min_delay, absl::Duration max_delay)
    : device_index_(device_index),
      min_delay_(min_delay),
      max_delay_(std::max(min_delay, max_delay)),
      rng_(std::random_device{}()) {
  {
    absl::MutexLock lock(&live_mu);
    Live().insert(this);
  }
  worker_ = std::thread([this] { Run(); });
}

SimStream::~SimStream() {
  {
    absl::MutexLock lock(&live_mu);
    Live().erase(this);
  }
  {
    MonotonicMutexLock lock(&mu_);
    stopping_ = true;
    paused_ = false;
  }
  worker_.join();
}

SimStream* SimStream::FromHandle(Stream* stream) {
  auto* s = reinterpret_cast<SimStream*>(stream);
  absl::MutexLock lock(&live_mu);
  return Live().count(s) != 0 ? s : nullptr;
}

void SimStream::Enqueue(std::function<void()> op) {
  MonotonicMutexLock lock(&mu_);
  queue_.push_back(std::move(op));
}

bool SimStream::Idle() {
  MonotonicMutexLock lock(&mu_);
  return queue_.empty() && !busy_;
}

bool SimStream::WaitIdle(absl::Duration timeout) {
  MonotonicMutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && !busy_; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

void SimStream::Pause() {
  MonotonicMutexLock lock(&mu_);
  paused_ = true;
}

void SimStream::Resume() {
  MonotonicMutexLock lock(&mu_);
  paused_ = false;
}

void SimStream::Run() {
  const int64_t min_us = absl::ToInt64Microseconds(min_delay_);
  const int64_t max_us = absl::ToInt64Microseconds(max_delay_);
  std::uniform_int_distribution<int64_t> delay_us(min_us, max_us);
  MonotonicMutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (!paused_ && !queue_.empty()) || (stopping_ && queue_.empty());
    };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) return;  // stopping, drained
    std::function<void()> op = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    mu_.Unlock();
    const int64_t us = delay_us(rng_);
    if (us > 0) absl::SleepFor(absl::Microseconds(us));
    op();
    op = nullptr;  // release what the operation held (regions, events)
    mu_.Lock();
    busy_ = false;
  }
}

}  // namespace gradsync::gpu::sim
