#include "daemon/engine/job_registry.h"

namespace gradsync {

JobRegistry::JobRegistry(const DaemonConfig& config, ipc::NodeSegment* node, WorldFormer former,
                         JobHooks hooks)
    : config_(config), node_(node), former_(std::move(former)), hooks_(std::move(hooks)) {}

std::shared_ptr<Job> JobRegistry::JobForAttach() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) return nullptr;
  if (!current_ || current_->Finished()) {
    current_ = std::make_shared<Job>(config_, node_, next_job_id_++, former_, hooks_);
  }
  return current_;
}

void JobRegistry::StopAccepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

DaemonConfig JobRegistry::config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_;
}

void JobRegistry::UpdateConfig(const std::function<void(DaemonConfig&)>& update) {
  std::lock_guard<std::mutex> lock(mu_);
  update(config_);
}

void JobRegistry::AddSession(uint64_t session, std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lock(mu_);
  sessions_[session] = std::move(job);
}

std::shared_ptr<Job> JobRegistry::JobOf(uint64_t session) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  return it == sessions_.end() ? nullptr : it->second;
}

void JobRegistry::RemoveSession(uint64_t session) {
  std::shared_ptr<Job> last;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  last = std::move(it->second);
  sessions_.erase(it);
}

std::shared_ptr<Job> JobRegistry::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void JobRegistry::FailAll(const absl::Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (current_) current_->Fail(error);
  for (auto& [session, job] : sessions_) job->Fail(error);
}

}  // namespace gradsync
