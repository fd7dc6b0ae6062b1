// ControlService: gradsync.v1.Control on the daemon's --listen port — what
// an operator (gradsyncctl, or any gRPC tool via reflection) uses to see and
// steer the node: stats, configuration, the flight-recorder trace, drain.
//
// It runs on gRPC's callback API: a call whose reply its peer does not read
// holds no server thread, only its admitted slot and bytes, until its reply
// deadline (ControlAdmission). The server's threads stay for the job's
// rendezvous.
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
#include "daemon/control_admission.h"
#include "daemon/engine/job_registry.h"
#include "daemon/observe/latency_stats.h"
#include "daemon/serial_worker.h"
#include "gradsync/v1/control.grpc.pb.h"

namespace gradsync {

class ControlService final : public v1::Control::CallbackService {
 public:
  // Makes new bucket caps job-wide (several nodes): returns an error when
  // this daemon cannot (not the leader). Empty on a single node.
  using PublishCaps = std::function<absl::Status(const DaemonConfig& next, uint64_t version)>;

  // `drain`: stop accepting trainers, finish the current iteration, exit 0.
  // `job_stalls`: on the leader, the stall reports of every node.
  // `auth`: who may SetConfig and Drain (and read, with --require-auth-for-reads).
  // `limits`: what its callers may hold (ControlAdmission).
  ControlService(JobRegistry* jobs, std::function<void()> drain, PublishCaps publish_caps = {},
                 std::function<std::vector<std::string>()> job_stalls = {},
                 CallAuth auth = CallAuth(), ControlLimits limits = ControlLimits());

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext*, const v1::GetStatsRequest*,
                                     v1::GetStatsResponse*) override;
  grpc::ServerUnaryReactor* GetConfig(grpc::CallbackServerContext*, const v1::GetConfigRequest*,
                                      v1::GetConfigResponse*) override;
  grpc::ServerUnaryReactor* SetConfig(grpc::CallbackServerContext*, const v1::SetConfigRequest*,
                                      v1::SetConfigResponse*) override;
  grpc::ServerUnaryReactor* GetTrace(grpc::CallbackServerContext*, const v1::GetTraceRequest*,
                                     v1::GetTraceResponse*) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext*, const v1::DrainRequest*,
                                  v1::DrainResponse*) override;
  grpc::ServerUnaryReactor* GetStragglers(grpc::CallbackServerContext*,
                                          const v1::GetStragglersRequest*,
                                          v1::GetStragglersResponse*) override;

  // From now on calls are answered UNAVAILABLE without doing their work,
  // and queued trace renders are dropped: before the server shuts down, so
  // it does not wait for them. Idempotent.
  void Stop();

  // What GetStats answers (without the auth check): also the /metrics page.
  void FillStats(v1::Stats* s) const;
  // Adds more to every FillStats (the autotuner's fields). Set before serving.
  void set_extra_stats(std::function<void(v1::Stats*)> fill) { extra_stats_ = std::move(fill); }
  // The daemon's iteration-duration histogram (Stats.iteration_duration),
  // which outlives this service. Set before serving; null = not reported.
  void set_iteration_durations(const LatencyStats* durations) { iteration_durations_ = durations; }

 private:
  // Admits the call `rpc`, runs `body` (which fills `resp`; on renders_
  // when `render`) and sends its answer within the admission's bounds.
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, absl::string_view rpc,
                                  google::protobuf::MessageLite* resp,
                                  std::function<grpc::Status()> body, bool render = false);
  grpc::Status DoGetStats(const grpc::ServerContextBase& context, v1::GetStatsResponse* resp);
  grpc::Status DoGetConfig(const grpc::ServerContextBase& context, v1::GetConfigResponse* resp);
  grpc::Status DoSetConfig(const grpc::ServerContextBase& context, const v1::SetConfigRequest* req,
                           v1::SetConfigResponse* resp) ABSL_LOCKS_EXCLUDED(set_mu_);
  grpc::Status DoGetTrace(const grpc::ServerContextBase& context, v1::GetTraceResponse* resp);
  grpc::Status DoDrain(const grpc::ServerContextBase& context, v1::DrainResponse* resp);
  grpc::Status DoGetStragglers(const grpc::ServerContextBase& context,
                               v1::GetStragglersResponse* resp);
  void FillConfig(v1::Config* out) const;

  JobRegistry* jobs_;
  std::function<void()> drain_;
  PublishCaps publish_caps_;
  std::function<std::vector<std::string>()> job_stalls_;
  std::function<void(v1::Stats*)> extra_stats_;
  const LatencyStats* iteration_durations_ = nullptr;  // see set_iteration_durations
  const CallAuth auth_;
  // One SetConfig at a time: its read-validate-publish-update of the
  // registry's configuration is one step. Guards no field of its own.
  absl::Mutex set_mu_;
  const std::chrono::steady_clock::time_point started_;
  std::atomic<uint64_t> config_version_{1};
  std::atomic<bool> stopping_{false};
  ControlAdmission admission_;
  // GetTrace's JSON is rendered here, at most this many waiting: seconds of
  // CPU each for a large job, kept off gRPC's threads and out of shutdown.
  static constexpr size_t kMaxQueuedRenders = 4;
  SerialWorker renders_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CONTROL_SERVICE_H_
