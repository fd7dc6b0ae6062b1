// ControlService: gradsync.v1.Control on the daemon's --listen port — what
// an operator (gradsyncctl, or any gRPC tool via reflection) uses to see and
// steer the node: stats, configuration, the flight-recorder trace, drain.
#ifndef GRADSYNC_DAEMON_CONTROL_SERVICE_H_
#define GRADSYNC_DAEMON_CONTROL_SERVICE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/auth/call_auth.h"
#include "daemon/engine/job_registry.h"
#include "gradsync/v1/control.grpc.pb.h"

namespace gradsync {

class ControlService final : public v1::Control::Service {
 public:
  // Makes new bucket caps job-wide (several nodes): returns an error when
  // this daemon cannot (not the leader). Empty on a single node.
  using PublishCaps = std::function<absl::Status(const DaemonConfig& next, uint64_t version)>;

  // `drain`: stop accepting trainers, finish the current iteration, exit 0.
  // `job_stalls`: on the leader, the stall reports of every node.
  // `auth`: who may SetConfig and Drain (and read, with --require-auth-for-reads).
  ControlService(JobRegistry* jobs, std::function<void()> drain, PublishCaps publish_caps = {},
                 std::function<std::vector<std::string>()> job_stalls = {},
                 CallAuth auth = CallAuth());

  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::GetStatsResponse*) override;
  grpc::Status GetConfig(grpc::ServerContext*, const v1::GetConfigRequest*,
                         v1::GetConfigResponse*) override;
  grpc::Status SetConfig(grpc::ServerContext*, const v1::SetConfigRequest*,
                         v1::SetConfigResponse*) override ABSL_LOCKS_EXCLUDED(set_mu_);
  grpc::Status GetTrace(grpc::ServerContext*, const v1::GetTraceRequest*,
                        v1::GetTraceResponse*) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest*, v1::DrainResponse*) override;

  // What GetStats answers (without the auth check): also the /metrics page.
  void FillStats(v1::Stats* s) const;
  // Adds more to every FillStats (the autotuner's fields). Set before serving.
  void set_extra_stats(std::function<void(v1::Stats*)> fill) { extra_stats_ = std::move(fill); }

 private:
  void FillConfig(v1::Config* out) const;

  JobRegistry* jobs_;
  std::function<void()> drain_;
  PublishCaps publish_caps_;
  std::function<std::vector<std::string>()> job_stalls_;
  std::function<void(v1::Stats*)> extra_stats_;
  const CallAuth auth_;
  // One SetConfig at a time: its read-validate-publish-update of the
  // registry's configuration is one step. Guards no field of its own.
  absl::Mutex set_mu_;
  const std::chrono::steady_clock::time_point started_;
  std::atomic<uint64_t> config_version_{1};
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CONTROL_SERVICE_H_
