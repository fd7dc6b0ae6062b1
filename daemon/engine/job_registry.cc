#include "daemon/engine/job_registry.h"

#include <algorithm>
#include <vector>

#include "common/monotonic.h"

namespace gradsync {

JobRegistry::JobRegistry(const DaemonConfig& config, NodeSegmentSource node, WorldFormer former,
                         JobHooks hooks)
    : node_(std::move(node)),
      former_(std::move(former)),
      hooks_(std::move(hooks)),
      config_(config) {}

std::shared_ptr<Job> JobRegistry::JobForAttach() {
  absl::MutexLock lock(&mu_);
  if (!accepting_) return nullptr;
  if (!current_ || current_->Finished()) {
    // A fresh job: the one point where the node segment can be swapped
    // without disturbing a running job (each keeps the segment it started with).
    current_ = std::make_shared<Job>(config_, node_(), next_job_id_++, former_, hooks_);
  }
  return current_;
}

void JobRegistry::StopAccepting() {
  absl::MutexLock lock(&mu_);
  accepting_ = false;
}

DaemonConfig JobRegistry::config() const {
  absl::MutexLock lock(&mu_);
  return config_;
}

void JobRegistry::UpdateConfig(const std::function<void(DaemonConfig&)>& update) {
  absl::MutexLock lock(&mu_);
  update(config_);
}

void JobRegistry::AddSession(uint64_t session, std::shared_ptr<Job> job) {
  absl::MutexLock lock(&mu_);
  sessions_[session] = std::move(job);
}

std::shared_ptr<Job> JobRegistry::JobOf(uint64_t session) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? nullptr : it->second;
}

void JobRegistry::RemoveSession(uint64_t session) {
  std::shared_ptr<Job> last;  // destroyed outside the lock
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  last = std::move(it->second);
  sessions_.erase(it);
}

std::shared_ptr<Job> JobRegistry::Current() const {
  absl::MutexLock lock(&mu_);
  return current_;
}

void JobRegistry::DepartAll(const absl::Status& error) {
  std::vector<std::shared_ptr<Job>> departing;
  {
    absl::MutexLock lock(&mu_);
    if (current_) departing.push_back(current_);
    for (auto& [session, job] : sessions_) departing.push_back(job);
    for (const std::shared_ptr<Job>& job : departing) job->Depart(error);
  }
  const absl::Time until = MonotonicNow() + kAwaitDepartedLimit;
  for (const std::shared_ptr<Job>& job : departing) {
    job->AwaitDeparted(std::max(until - MonotonicNow(), absl::ZeroDuration()));
  }
}

}  // namespace gradsync
