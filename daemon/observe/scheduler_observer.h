// SchedulerObserver: what the scheduler reports as it works, for stats and
// the flight recorder. Called on the scheduler thread: implementations must
// be quick and must not allocate in steady state.
#ifndef GRADSYNC_DAEMON_OBSERVE_SCHEDULER_OBSERVER_H_
#define GRADSYNC_DAEMON_OBSERVE_SCHEDULER_OBSERVER_H_

#include <cstdint>
#include <string>

namespace gradsync {

// Steady-clock nanoseconds of one bucket's life in one iteration.
struct BucketTimeline {
  uint64_t iteration = 0;
  uint32_t bucket = 0;
  uint64_t bytes = 0;          // payload bytes per trainer
  int64_t first_ready_ns = 0;  // first trainer marked a tensor of it
  int64_t last_ready_ns = 0;   // the last mark that completed it
  int64_t launch_ns = 0;       // the reduction started
  int64_t local_done_ns = 0;   // local sum done (= written back on one node)
  int64_t collective_done_ns = 0;
  int64_t done_ns = 0;        // completions posted
  int64_t write_back_ns = 0;  // of local_done..done: result copied into the arenas
  size_t reduce_threads = 1;  // threads the local reduction was split across
};

class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  virtual void OnReady(uint64_t /*iteration*/, int /*local_rank*/, uint32_t /*tensor*/,
                       bool /*unused*/, int64_t /*ns*/) {}
  // As they happen (so a stuck bucket is visible in a trace).
  virtual void OnBucketFirstReady(uint64_t /*iteration*/, uint32_t /*bucket*/, int64_t /*ns*/) {}
  virtual void OnBucketLastReady(uint64_t /*iteration*/, uint32_t /*bucket*/, int64_t /*ns*/) {}
  virtual void OnBucketDone(const BucketTimeline& /*timeline*/) {}
  virtual void OnIterationDone(uint64_t /*iteration*/, uint64_t /*bytes_per_trainer*/,
                               int64_t /*start_ns*/, int64_t /*end_ns*/) {}
  virtual void OnStall(uint64_t /*iteration*/, uint32_t /*bucket*/, double /*waited_s*/,
                       const char* /*description*/) {}
  // --nonfinite=skip skipped `iteration`; `trainer` names this node's
  // culprit ("": the culprit is another node's).
  virtual void OnNonFiniteSkipped(uint64_t /*iteration*/, const std::string& /*trainer*/) {}
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_OBSERVE_SCHEDULER_OBSERVER_H_
