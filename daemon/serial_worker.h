// SerialWorker: one thread that runs posted tasks in order, with a bounded
// queue. Control's GetTrace renders its JSON here (seconds for a large job
// on a loaded node) instead of on gRPC's callback threads, which also carry
// the server's other work; a flood queues at most `max_queued` renders, and
// a daemon shutting down does not wait for them.
//
// Threads: Post and Stop are thread-safe; mu_ guards the queue.
#ifndef GRADSYNC_DAEMON_SERIAL_WORKER_H_
#define GRADSYNC_DAEMON_SERIAL_WORKER_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class SerialWorker {
 public:
  // A task is told whether to do its work: false once Stop was called, when
  // it must only answer (and release what it holds).
  using Task = std::function<void(bool run)>;

  explicit SerialWorker(size_t max_queued);
  ~SerialWorker();  // Stop
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `task`; false (and `task` not taken) when `max_queued` tasks wait
  // already. After Stop, runs task(false) at once, here.
  bool Post(Task task) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs every queued task with false, lets the running one finish and joins
  // the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether Stop was called.
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex join_mu_;  // serializes Stop's join
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_SERIAL_WORKER_H_
