#include "daemon/control_service.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "daemon/observe/job_stats.h"
#include "grpc/grpc.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// A GetTrace reply must fit gRPC's default 4 MiB receive limit, which every
// client has unless it raises it: the JSON gets 4 MiB less room for the
// rest of the message.
constexpr size_t kMaxTraceJsonBytes = (size_t{4} << 20) - (size_t{64} << 10);

template <typename Response>
grpc::Status Reply(Response* resp, const absl::Status& status) {
  ToProto(status, resp->mutable_error());
  return grpc::Status::OK;
}

bool ValidLogLevel(const std::string& level) {
  for (const char* l : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (level == l) return true;
  }
  return false;
}

}  // namespace

ControlService::ControlService(JobRegistry* jobs, std::function<void()> drain,
                               PublishCaps publish_caps,
                               std::function<std::vector<std::string>()> job_stalls, CallAuth auth,
                               ControlLimits limits)
    : jobs_(jobs),
      drain_(std::move(drain)),
      publish_caps_(std::move(publish_caps)),
      job_stalls_(std::move(job_stalls)),
      auth_(std::move(auth)),
      started_(std::chrono::steady_clock::now()),
      admission_(limits),
      renders_(kMaxQueuedRenders) {}

namespace {

// A Control call's reactor: frees the call's admission when gRPC is done
// with it (answered, failed or cancelled).
class ControlReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit ControlReactor(ControlAdmission* admission) : admission_(admission) {}
  void set_id(uint64_t id) { id_ = id; }
  void OnDone() override {
    if (id_ != 0) admission_->Leave(id_);
    delete this;
  }

 private:
  ControlAdmission* const admission_;
  uint64_t id_ = 0;  // 0: not admitted
};

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace

grpc::ServerUnaryReactor* ControlService::Serve(grpc::CallbackServerContext* context,
                                                absl::string_view rpc,
                                                google::protobuf::MessageLite* resp,
                                                std::function<grpc::Status()> body, bool render) {
  auto* reactor = new ControlReactor(&admission_);
  absl::StatusOr<uint64_t> id = admission_.Enter(PeerAddress(context->peer()), rpc);
  if (!id.ok()) {
    reactor->Finish(ToGrpc(id.status()));
    return reactor;
  }
  reactor->set_id(*id);
  // Sends `status` (and `resp` when OK) within the bytes bound, under the
  // reply deadline. `reactor`, `context` and `resp` live until Finish.
  auto finish = [this, reactor, context, resp, id = *id](grpc::Status status) {
    // The call stays alive until its reactor's OnDone, which Leave precedes:
    // the watchdog takes its own reference under the admission's lock and
    // cancels outside it (a cancel may complete the call inline).
    grpc_call* call = context->c_call();
    const int64_t deadline_ms = admission_.limits().reply_deadline.count();
    ControlAdmission::Overdue overdue = [call, deadline_ms]() -> std::function<void()> {
      grpc_call_ref(call);
      return [call, deadline_ms] {
        const std::string why = absl::StrCat("the reply was not read within ", deadline_ms,
                                             " ms (the Control reply deadline)");
        grpc_call_cancel_with_status(call, GRPC_STATUS_DEADLINE_EXCEEDED, why.c_str(), nullptr);
        grpc_call_unref(call);
      };
    };
    if (absl::Status held =
            admission_.Reply(id, status.ok() ? resp->ByteSizeLong() : 0, std::move(overdue));
        !held.ok()) {
      resp->Clear();
      status = ToGrpc(held);
    }
    reactor->Finish(status);
  };
  // Runs the body unless the daemon is stopping or the caller left.
  auto answer = [finish, context, body = std::move(body)](bool run) {
    if (!run) {
      finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "gradsyncd is shutting down"));
    } else if (context->IsCancelled()) {
      finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
    } else {
      finish(body());
    }
  };
  if (!render) {
    answer(!stopping_.load());
  } else if (!renders_.Post(answer)) {
    finish(ToGrpc(admission_.Refused(
        *id, absl::StrCat(kMaxQueuedRenders,
                          " traces wait to be rendered already, the most this daemon queues "
                          "(max_queued_traces); retry later"))));
  }
  return reactor;
}

void ControlService::Stop() {
  stopping_.store(true);
  renders_.Stop();
}

grpc::ServerUnaryReactor* ControlService::GetStats(grpc::CallbackServerContext* context,
                                                   const v1::GetStatsRequest*,
                                                   v1::GetStatsResponse* resp) {
  return Serve(context, "Control.GetStats", resp,
               [this, context, resp] { return DoGetStats(*context, resp); });
}

grpc::ServerUnaryReactor* ControlService::GetConfig(grpc::CallbackServerContext* context,
                                                    const v1::GetConfigRequest*,
                                                    v1::GetConfigResponse* resp) {
  return Serve(context, "Control.GetConfig", resp,
               [this, context, resp] { return DoGetConfig(*context, resp); });
}

grpc::ServerUnaryReactor* ControlService::SetConfig(grpc::CallbackServerContext* context,
                                                    const v1::SetConfigRequest* req,
                                                    v1::SetConfigResponse* resp) {
  return Serve(context, "Control.SetConfig", resp,
               [this, context, req, resp] { return DoSetConfig(*context, req, resp); });
}

grpc::ServerUnaryReactor* ControlService::GetTrace(grpc::CallbackServerContext* context,
                                                   const v1::GetTraceRequest*,
                                                   v1::GetTraceResponse* resp) {
  return Serve(
      context, "Control.GetTrace", resp,
      [this, context, resp] { return DoGetTrace(*context, resp); }, /*render=*/true);
}

grpc::ServerUnaryReactor* ControlService::Drain(grpc::CallbackServerContext* context,
                                                const v1::DrainRequest*, v1::DrainResponse* resp) {
  return Serve(context, "Control.Drain", resp,
               [this, context, resp] { return DoDrain(*context, resp); });
}

grpc::ServerUnaryReactor* ControlService::GetStragglers(grpc::CallbackServerContext* context,
                                                        const v1::GetStragglersRequest*,
                                                        v1::GetStragglersResponse* resp) {
  return Serve(context, "Control.GetStragglers", resp,
               [this, context, resp] { return DoGetStragglers(*context, resp); });
}

grpc::Status ControlService::DoGetStragglers(const grpc::ServerContextBase& context,
                                             v1::GetStragglersResponse* resp) {
  if (grpc::Status st = auth_.CheckRead(context, "Control.GetStragglers"); !st.ok()) return st;
  const DaemonConfig c = jobs_->config();
  resp->set_job_id(c.job_id);
  resp->set_node_rank(c.node_rank);
  resp->set_num_nodes(c.num_nodes);
  v1::StragglerSettings* settings = resp->mutable_settings();
  settings->set_window(static_cast<uint32_t>(c.straggler_window));
  settings->set_share(c.straggler_share);
  settings->set_late_us(c.straggler_late_ms * 1000);
  // The current job's (or the last one's, which stays readable).
  v1::Stats stats;
  if (std::shared_ptr<Job> job = jobs_->Current()) job->FillStats(&stats);
  *resp->mutable_trainers() = stats.stragglers();
  return Reply(resp, absl::OkStatus());
}

grpc::Status ControlService::DoGetStats(const grpc::ServerContextBase& context,
                                        v1::GetStatsResponse* resp) {
  if (grpc::Status st = auth_.CheckRead(context, "Control.GetStats"); !st.ok()) return st;
  FillStats(resp->mutable_stats());
  return Reply(resp, absl::OkStatus());
}

void ControlService::FillStats(v1::Stats* s) const {
  const DaemonConfig c = jobs_->config();
  s->set_node_rank(c.node_rank);
  s->set_num_nodes(c.num_nodes);
  s->set_local_size(c.local_size);
  s->set_job_id(c.job_id);
  s->set_backend(c.backend);
  s->set_world_size(c.num_nodes * c.local_size);
  s->set_uptime_s(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  if (std::shared_ptr<Job> job = jobs_->Current()) job->FillStats(s);
  if (iteration_durations_ != nullptr) {
    FillLatencyStats(*iteration_durations_, s->mutable_iteration_duration());
  }
  if (extra_stats_) extra_stats_(s);
  if (job_stalls_) {
    // The leader also lists the stalls every node reported.
    for (const std::string& report : job_stalls_()) {
      v1::StallReport* r = s->add_stalls();
      r->set_description(report);
    }
  }
}

void ControlService::FillConfig(v1::Config* out) const {
  const DaemonConfig c = jobs_->config();
  out->set_bucket_cap_mb(c.bucket_cap_mb);
  out->set_first_bucket_cap_mb(c.first_bucket_cap_mb);
  out->set_timeout_ms(c.timeout_ms);
  out->set_stall_threshold_s(c.stall_threshold_s);
  out->set_log_level(c.log_level);
  out->set_version(config_version_.load());
}

grpc::Status ControlService::DoGetConfig(const grpc::ServerContextBase& context,
                                         v1::GetConfigResponse* resp) {
  if (grpc::Status st = auth_.CheckRead(context, "Control.GetConfig"); !st.ok()) return st;
  FillConfig(resp->mutable_config());
  return Reply(resp, absl::OkStatus());
}

grpc::Status ControlService::DoSetConfig(const grpc::ServerContextBase& context,
                                         const v1::SetConfigRequest* req,
                                         v1::SetConfigResponse* resp) {
  if (grpc::Status st = auth_.CheckChange(context, "Control.SetConfig"); !st.ok()) return st;
  absl::MutexLock serialize(&set_mu_);
  // All or nothing: parse and validate every key on a copy first.
  DaemonConfig next = jobs_->config();
  std::vector<std::string> changed;
  for (const auto& entry : req->values()) {
    // (Not a structured binding: clang before 16 cannot capture one in `bad`.)
    const std::string& value = entry.second;
    const std::string key = absl::AsciiStrToLower(entry.first);
    double number = 0;
    const bool numeric = absl::SimpleAtod(value, &number);
    auto bad = [&](const std::string& why) {
      return Reply(resp, MakeError(v1::INVALID_ARGUMENT,
                                   absl::StrCat("config ", key, "=", value, ": ", why)));
    };
    if (key == "bucket_cap_mb") {
      if (!numeric) return bad("not a number");
      next.bucket_cap_mb = number;
    } else if (key == "first_bucket_cap_mb") {
      if (!numeric) return bad("not a number");
      next.first_bucket_cap_mb = number;
    } else if (key == "timeout_s" || key == "timeout_ms") {
      if (!numeric) return bad("not a number");
      const double ms = key == "timeout_s" ? number * 1000 : number;
      // Checked before the cast: converting NaN or an out-of-range double to
      // an integer is undefined. ValidateConfig checks the real range.
      if (!(std::fabs(ms) <= 1e15)) return bad("out of range (use [0.1, 86400] seconds)");
      next.timeout_ms = static_cast<int64_t>(ms);
    } else if (key == "stall_threshold_s") {
      if (!numeric) return bad("not a number");
      next.stall_threshold_s = number;
    } else if (key == "log_level") {
      const std::string level = absl::AsciiStrToLower(value);
      if (!ValidLogLevel(level)) return bad("use trace, debug, info, warn, error, critical or off");
      next.log_level = level;
    } else {
      return bad(
          "unknown key (settable: bucket_cap_mb, first_bucket_cap_mb, timeout_s, "
          "stall_threshold_s, log_level)");
    }
    changed.push_back(absl::StrCat(key, "=", value));
  }
  if (absl::Status st = ValidateConfig(next); !st.ok()) {
    return Reply(resp, MakeError(v1::INVALID_ARGUMENT, st.message()));
  }
  const DaemonConfig before = jobs_->config();
  const bool caps_changed = next.bucket_cap_mb != before.bucket_cap_mb ||
                            next.first_bucket_cap_mb != before.first_bucket_cap_mb;
  if (caps_changed && publish_caps_) {
    // Several nodes: the leader publishes the caps with the iteration every
    // node switches at; other daemons refuse.
    if (absl::Status st = publish_caps_(next, config_version_.load() + 1); !st.ok()) {
      return Reply(resp, st);
    }
  }
  jobs_->UpdateConfig([&](DaemonConfig& c) {
    c.bucket_cap_mb = next.bucket_cap_mb;
    c.first_bucket_cap_mb = next.first_bucket_cap_mb;
    c.timeout_ms = next.timeout_ms;
    c.stall_threshold_s = next.stall_threshold_s;
    c.log_level = next.log_level;
  });
  spdlog::set_level(spdlog::level::from_str(next.log_level));
  if (caps_changed && !publish_caps_) {
    // One node: the running job re-plans at its next iteration boundary.
    if (std::shared_ptr<Job> job = jobs_->Current()) {
      job->SetCaps(BucketCaps{next.bucket_cap_bytes(), next.first_bucket_cap_bytes()});
    }
  }
  if (!changed.empty()) config_version_.fetch_add(1);
  spdlog::info("event=config_set changes={} version={}", LogValue(absl::StrJoin(changed, " ")),
               config_version_.load());
  FillConfig(resp->mutable_config());
  return Reply(resp, absl::OkStatus());
}

grpc::Status ControlService::DoGetTrace(const grpc::ServerContextBase& context,
                                        v1::GetTraceResponse* resp) {
  if (grpc::Status st = auth_.CheckRead(context, "Control.GetTrace"); !st.ok()) return st;
  std::shared_ptr<Job> job = jobs_->Current();
  if (!job) return Reply(resp, MakeError(v1::STATE, "no job has run on this daemon yet"));
  absl::StatusOr<JobStats::BoundedTrace> trace = job->TraceJson(kMaxTraceJsonBytes);
  if (!trace.ok()) return Reply(resp, trace.status());
  resp->set_trace_json(std::move(trace->json));
  resp->set_dropped_events(trace->dropped_events);
  return Reply(resp, absl::OkStatus());
}

grpc::Status ControlService::DoDrain(const grpc::ServerContextBase& context,
                                     v1::DrainResponse* resp) {
  if (grpc::Status st = auth_.CheckChange(context, "Control.Drain"); !st.ok()) return st;
  spdlog::info("event=drain_requested peer={}", context.peer());
  drain_();
  return Reply(resp, absl::OkStatus());
}

}  // namespace gradsync
