#include "daemon/backends/average_writer.h"

#include <utility>

#include "common/status_code.h"

namespace gradsync {

AverageWriter::AverageWriter(WorkerChannel& channel, const WorkerArenas& arenas)
    : channel_(channel), arenas_(arenas), thread_([this] { Run(); }) {}

AverageWriter::~AverageWriter() {
  Drain();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void AverageWriter::Post(Job& job) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](AverageWriter* w)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->tail_ - w->head_ < kSlots; },
      this));
  std::swap(slots_[tail_ % kSlots], job);
  ++tail_;
}

void AverageWriter::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](AverageWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->head_ == w->tail_; },
      this));
}

void AverageWriter::Run() {
  while (true) {
    Job* job = nullptr;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](AverageWriter* w)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stop_ || w->head_ != w->tail_; },
          this));
      if (head_ == tail_) return;     // stopped, nothing left
      job = &slots_[head_ % kSlots];  // Post never touches a queued slot
    }
    Complete(*job);
    absl::MutexLock lock(&mu_);
    ++head_;
  }
}

void AverageWriter::WriteNow(Job& job) {
  Drain();
  Complete(job);
}

void AverageWriter::Complete(Job& job) {
  const bool non_finite =
      job.divided ? CopyAverage(job.sum, job.count, job.dtype, job.checked_begin, job.checked_end,
                                job.copies, job.check) ||
                        job.ring_non_finite
                  : WriteAverage(job.sum, job.count, job.dtype, job.divisor, job.copies, job.check);
  absl::Status whole;
  for (int arena : job.arenas) {
    if (whole.ok()) whole = arenas_.CheckWhole(arena);
  }
  if (whole.ok()) {
    job.done.set_result_non_finite(non_finite);
  } else {
    job.done.clear_counts();
    ToProto(whole, job.done.mutable_done());
  }
  // A failed send: the daemon is gone, and the worker exits with it.
  channel_.Send(job.done).IgnoreError();
}

}  // namespace gradsync
