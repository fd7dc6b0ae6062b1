// AverageWriter: the Gloo worker's second thread. It writes a piece's
// average into the trainers' arenas (WriteAverage; CopyAverage where the
// ring already divided) and sends that
// request's `done`, while the worker's main thread already runs the next
// piece's collective: a large bucket's write-back overlaps its pieces'
// collectives, as the daemon's own write-back did before the worker wrote
// the averages.
//
// Answers stay in request order: the main thread answers a request itself
// only after Drain (everything posted written and answered), and remaps
// the arenas only then too.
//
// Threads: Post, WriteNow and Drain from the worker's main thread.
#ifndef GRADSYNC_DAEMON_BACKENDS_AVERAGE_WRITER_H_
#define GRADSYNC_DAEMON_BACKENDS_AVERAGE_WRITER_H_

#include <cstddef>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "daemon/backends/worker_arenas.h"
#include "daemon/backends/worker_channel.h"
#include "gradsync/v1/gloo_worker.pb.h"

namespace gradsync {

class AverageWriter {
 public:
  // One request whose collective is done: its sum at `sum`, to divide and
  // copy; then `done` (OK, with the request's summed counts) is sent.
  struct Job {
    char* sum = nullptr;
    size_t count = 0;
    DType dtype = DType::kFloat32;
    int divisor = 1;
    bool check = false;
    // The ring already divided (ring_average.h): copy only, and test only
    // outside [checked_begin, checked_end), which it tested (finding
    // ring_non_finite).
    bool divided = false;
    size_t checked_begin = 0;
    size_t checked_end = 0;
    bool ring_non_finite = false;
    std::vector<char*> copies;
    std::vector<int> arenas;  // checked whole once written (WorkerArenas)
    v1::GlooWorkerEvent done;
  };

  AverageWriter(WorkerChannel& channel, const WorkerArenas& arenas);
  ~AverageWriter();  // drains, then stops the thread
  AverageWriter(const AverageWriter&) = delete;
  AverageWriter& operator=(const AverageWriter&) = delete;

  // Queues `job` (its contents are swapped in: the caller gets a used slot's
  // capacity back). Waits while kSlots jobs are queued.
  void Post(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes and answers `job` on the calling thread, after every job posted:
  // where no next collective is waiting, a hand-off to the thread would
  // only add a wake-up.
  void WriteNow(Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every posted job is written and answered.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The daemon keeps at most two requests in flight.
  static constexpr size_t kSlots = 4;
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `job`'s average, checks its arenas and sends its answer.
  void Complete(Job& job);

  WorkerChannel& channel_;
  const WorkerArenas& arenas_;
  absl::Mutex mu_;
  Job slots_[kSlots];
  size_t head_ ABSL_GUARDED_BY(mu_) = 0;    // next to write
  size_t tail_ ABSL_GUARDED_BY(mu_) = 0;    // next free; queued: tail_ - head_
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // the thread holds slots_[head_]
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_AVERAGE_WRITER_H_
