// JobRegistry: which Job each trainer session belongs to, and the job new
// trainers attach to. A job that has finished (every trainer left) is
// replaced by a fresh one on the next Attach: the daemon outlives jobs.
//
// Threads: every method is thread-safe. The registry's lock is taken before
// a job's own lock (JobForAttach and DepartAll call into the job under it),
// never the other way round.
#ifndef GRADSYNC_DAEMON_ENGINE_JOB_REGISTRY_H_
#define GRADSYNC_DAEMON_ENGINE_JOB_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/config.h"
#include "daemon/engine/job.h"
#include "ipc/node_segment.h"

namespace gradsync {

// The node segment a fresh job hands its trainers (checked, and recreated
// if damaged, by its owner). Called under the registry's lock.
using NodeSegmentSource = std::function<std::shared_ptr<ipc::NodeSegment>()>;

class JobRegistry {
 public:
  JobRegistry(const DaemonConfig& config, NodeSegmentSource node, WorldFormer former,
              JobHooks hooks);

  // The job accepting trainers (a fresh one if the last has finished);
  // nullptr while draining.
  std::shared_ptr<Job> JobForAttach() ABSL_LOCKS_EXCLUDED(mu_);
  // Stop accepting trainers (Drain).
  void StopAccepting() ABSL_LOCKS_EXCLUDED(mu_);
  void AddSession(uint64_t session, std::shared_ptr<Job> job) ABSL_LOCKS_EXCLUDED(mu_);
  // nullptr when unknown.
  std::shared_ptr<Job> JobOf(uint64_t session) const ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveSession(uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);
  // The current job (may be finished), for stats.
  std::shared_ptr<Job> Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // Stops every job (daemon shutdown): trainers see the error, and this
  // node leaves its multi-node job (Job::Depart); returns once the
  // rendezvous has heard it (Job::AwaitDeparted), at most
  // kAwaitDepartedLimit, so that the daemon closes its ports only then.
  void DepartAll(const absl::Status& error) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kAwaitDepartedLimit = absl::Seconds(1);
  // The configuration new jobs get (a copy: it changes at run time).
  DaemonConfig config() const ABSL_LOCKS_EXCLUDED(mu_);
  // Applies `update` to the configuration under the lock.
  void UpdateConfig(const std::function<void(DaemonConfig&)>& update) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const NodeSegmentSource node_;
  const WorldFormer former_;
  const JobHooks hooks_;
  mutable absl::Mutex mu_;
  DaemonConfig config_ ABSL_GUARDED_BY(mu_);
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t next_job_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::shared_ptr<Job> current_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Job>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_JOB_REGISTRY_H_
