// A simulated stream: one worker thread running queued operations in order,
// each after a random delay, so that asynchrony is real — whoever reads
// device memory before the right event or stream has completed sees stale
// data, as on a GPU.
//
// Threads: Enqueue, Idle, WaitIdle, Pause and Resume from any thread.
// Operations run on the worker thread, one at a time, in enqueue order.
#ifndef GRADSYNC_GPU_SIM_SIM_STREAM_H_
#define GRADSYNC_GPU_SIM_SIM_STREAM_H_

#include <deque>
#include <functional>
#include <random>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/monotonic_mutex.h"
#include "gpu/device.h"

namespace gradsync::gpu::sim {

class SimStream {
 public:
  SimStream(int device_index, absl::Duration min_delay, absl::Duration max_delay);
  ~SimStream();  // runs what is queued (resuming a paused stream), then stops
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  // The opaque handle the device interfaces pass around, and back. FromHandle
  // refuses (returns null for) anything that is not a live SimStream.
  Stream* handle() { return reinterpret_cast<Stream*>(this); }
  static SimStream* FromHandle(Stream* stream);

  int device_index() const { return device_index_; }

  void Enqueue(std::function<void()> op);
  // Nothing queued or running.
  bool Idle();
  // False if still busy after `timeout`.
  bool WaitIdle(absl::Duration timeout);

  // Holds queued work until Resume (test hook: makes "not yet written"
  // deterministic instead of likely).
  void Pause();
  void Resume();

 private:
  void Run();

  const int device_index_;
  const absl::Duration min_delay_;
  const absl::Duration max_delay_;
  std::mt19937_64 rng_;  // worker thread only

  MonotonicMutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace gradsync::gpu::sim

#endif  // GRADSYNC_GPU_SIM_SIM_STREAM_H_
