#include "daemon/cluster/config_log_follower.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "spdlog/spdlog.h"

namespace gradsync {

ConfigLogFollower::ConfigLogFollower(uint64_t generation, int node_rank, Getter get)
    : generation_(generation), node_rank_(node_rank), get_(std::move(get)) {}

absl::Status ConfigLogFollower::CatchUp(uint64_t newest) {
  while (read_version_ < newest) {
    const uint64_t version = read_version_ + 1;
    const std::string key = ConfigKey(generation_, version);
    absl::StatusOr<std::optional<std::string>> value = get_(key);
    if (!value.ok()) {
      spdlog::warn("event=config_fetch_failed version={} error={}", version,
                   LogValue(value.status().message()));
      return absl::OkStatus();  // the next heartbeat retries from here
    }
    if (!value->has_value()) {
      return MakeError(
          v1::STATE,
          absl::StrCat("job-wide config version ", version, " of generation ", generation_,
                       " is no longer in the leader's log (it keeps the last ", kConfigLogKeep,
                       "; node_rank=", node_rank_, " applied up to version ", read_version_,
                       "): it cannot change its bucket plan with the other nodes"));
    }
    ASSIGN_OR_RETURN(const JobConfigChange change, DecodeConfig(key, *value));
    if (change.at_iteration <= read_at_) {
      return MakeError(v1::INTERNAL,
                       absl::StrCat("job-wide config version ", version, " switches at iteration ",
                                    change.at_iteration, ", not after version ", version - 1,
                                    "'s iteration ", read_at_));
    }
    if (change.grow) {
      spdlog::info("event=job_grow_read version={} at_iteration={}", version, change.at_iteration);
    } else {
      spdlog::info(
          "event=job_config version={} at_iteration={} bucket_cap_mb={} "
          "first_bucket_cap_mb={}",
          version, change.at_iteration, change.bucket_cap_mb, change.first_bucket_cap_mb);
    }
    {
      absl::MutexLock lock(&mu_);
      undelivered_.push_back(Change{change.caps, change.at_iteration, version, change.grow});
      DeliverLocked();
    }
    read_version_ = version;
    read_at_ = change.at_iteration;
  }
  return absl::OkStatus();
}

void ConfigLogFollower::SetListener(Listener listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
  DeliverLocked();
}

void ConfigLogFollower::DeliverLocked() {
  if (!listener_) return;  // kept for the job: it has not started listening
  for (const Change& c : undelivered_) listener_(c.caps, c.at_iteration, c.version, c.grow);
  undelivered_.clear();
}

}  // namespace gradsync
