// JobRegistry: which Job each trainer session belongs to, and the job new
// trainers attach to. A job that has finished (every trainer left) is
// replaced by a fresh one on the next Attach: the daemon outlives jobs.
#ifndef GRADSYNC_DAEMON_ENGINE_JOB_REGISTRY_H_
#define GRADSYNC_DAEMON_ENGINE_JOB_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "daemon/config.h"
#include "daemon/engine/job.h"
#include "ipc/node_segment.h"

namespace gradsync {

class JobRegistry {
 public:
  JobRegistry(const DaemonConfig& config, ipc::NodeSegment* node, WorldFormer former,
              JobHooks hooks);

  // The job accepting trainers (a fresh one if the last has finished);
  // nullptr while draining.
  std::shared_ptr<Job> JobForAttach();
  // Stop accepting trainers (Drain).
  void StopAccepting();
  void AddSession(uint64_t session, std::shared_ptr<Job> job);
  // nullptr when unknown.
  std::shared_ptr<Job> JobOf(uint64_t session) const;
  void RemoveSession(uint64_t session);
  // The current job (may be finished), for stats.
  std::shared_ptr<Job> Current() const;
  // Stops every job (daemon shutdown): trainers see the error.
  void FailAll(const absl::Status& error);
  // The configuration new jobs get (a copy: it changes at run time).
  DaemonConfig config() const;
  // Applies `update` to the configuration under the lock.
  void UpdateConfig(const std::function<void(DaemonConfig&)>& update);

 private:
  DaemonConfig config_;
  ipc::NodeSegment* node_;
  WorldFormer former_;
  JobHooks hooks_;
  mutable std::mutex mu_;
  bool accepting_ = true;
  uint64_t next_job_id_ = 1;
  std::shared_ptr<Job> current_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Job>> sessions_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_JOB_REGISTRY_H_
