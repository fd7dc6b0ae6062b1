#include "daemon/local_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// How often a Watch stream checks for cancellation (a dead trainer) and
// sends a heartbeat.
constexpr absl::Duration kWatchPoll = absl::Milliseconds(100);
constexpr int kHeartbeatEvery = 10;  // polls

template <typename Response>
grpc::Status Reply(Response* resp, const absl::Status& status) {
  ToProto(status, resp->mutable_error());
  return grpc::Status::OK;
}

}  // namespace

bool LocalService::ClaimWaiter(int local_rank) {
  absl::MutexLock lock(&waiting_mu_);
  return waiting_ranks_.insert(local_rank).second;
}

void LocalService::ReleaseWaiter(int local_rank) {
  absl::MutexLock lock(&waiting_mu_);
  waiting_ranks_.erase(local_rank);
}

grpc::Status LocalService::Attach(grpc::ServerContext* ctx, const v1::AttachRequest* req,
                                  v1::AttachResponse* resp) {
  if (req->protocol_version() != v1::PROTOCOL_VERSION_CURRENT) {
    return Reply(resp,
                 MakeError(v1::STATE, absl::StrCat("client speaks protocol version ",
                                                   req->protocol_version(), ", this daemon speaks ",
                                                   static_cast<int>(v1::PROTOCOL_VERSION_CURRENT),
                                                   ": upgrade the client or the daemon")));
  }
  // A previous job may still be running or winding down (its trainers'
  // departures take a moment to be noticed): wait for it, within the
  // caller's deadline, instead of refusing a trainer that is merely early.
  // The caller's deadline becomes a time left, read once, so that the loop
  // below runs on the monotonic clock.
  const auto left = std::min<std::chrono::system_clock::duration>(
      ctx->deadline() - std::chrono::system_clock::now() - std::chrono::milliseconds(200),
      std::chrono::seconds(30));
  const auto deadline = std::chrono::steady_clock::now() + left;
  std::shared_ptr<Job> job;
  absl::StatusOr<uint64_t> session;
  bool waiting = false;
  absl::Cleanup release = [&] {
    if (waiting) ReleaseWaiter(req->local_rank());
  };
  while (true) {
    job = jobs_->JobForAttach();
    if (!job) {
      return Reply(resp,
                   MakeError(v1::UNAVAILABLE, "gradsyncd is draining: it accepts no new trainers"));
    }
    session = job->Attach(req->local_rank(), req->pid());
    if (session.ok() || (job->state() == JobState::kAttaching && !job->Finished()) ||
        std::chrono::steady_clock::now() >= deadline || ctx->IsCancelled()) {
      break;
    }
    if (!waiting) {
      // A rank no job has is refused now, not after a wait: only the job's
      // local ranks get a waiting slot, so waiters stay <= local_size.
      if (req->local_rank() < 0 || req->local_rank() >= jobs_->config().local_size) break;
      if (!ClaimWaiter(req->local_rank())) {
        spdlog::warn("event=attach_refused local_rank={} pid={} reason=waiter_exists",
                     req->local_rank(), req->pid());
        return grpc::Status(
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            absl::StrCat("local rank ", req->local_rank(),
                         " already has an Attach waiting for the running job to end (one "
                         "waiter per local rank); pid ",
                         req->pid(), " was refused"));
      }
      waiting = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!session.ok()) return Reply(resp, session.status());
  jobs_->AddSession(*session, job);
  const DaemonConfig c = jobs_->config();
  resp->set_session_id(*session);
  resp->set_node_rank(c.node_rank);
  resp->set_num_nodes(c.num_nodes);
  resp->set_local_size(c.local_size);
  resp->set_daemon_pid(getpid());
  resp->set_timeout_ms(c.timeout_ms);
  resp->set_job_id(c.job_id);
  return Reply(resp, absl::OkStatus());
}

grpc::Status LocalService::Register(grpc::ServerContext*, const v1::RegisterRequest* req,
                                    v1::RegisterResponse* resp) {
  std::shared_ptr<Job> job = jobs_->JobOf(req->session_id());
  if (!job) return Reply(resp, MakeError(v1::STATE, "unknown session: attach first"));
  absl::StatusOr<Layout> layout = LayoutFromProto(req->tensors());
  if (!layout.ok()) {
    spdlog::warn("event=bad_register session={:016x} error={}", req->session_id(),
                 LogValue(layout.status().message()));
    return Reply(resp, MakeError(v1::INVALID_ARGUMENT, layout.status().message()));
  }
  std::optional<GpuTrainerSpec> cuda;
  if (req->has_cuda()) {
    absl::StatusOr<GpuTrainerSpec> spec = GpuTrainerSpecFromProto(*req);
    if (!spec.ok()) return Reply(resp, spec.status());
    cuda = std::move(*spec);
  }
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(jobs_->config().timeout_ms);
  absl::StatusOr<RegisterResult> r =
      job->Register(req->session_id(), std::move(*layout), deadline, std::move(cuda));
  if (!r.ok()) return Reply(resp, r.status());
  resp->set_segment_name(r->segment_name);
  resp->set_node_segment_name(r->node_segment_name);
  resp->set_layout_hash(r->layout_hash);
  resp->set_arena_bytes(r->arena_bytes);
  for (uint64_t off : r->tensor_offsets) resp->add_tensor_offsets(off);
  resp->set_flat_buffer_handle(r->flat_buffer_handle);
  resp->set_flat_buffer_bytes(r->flat_buffer_bytes);
  resp->set_rank(r->rank);
  resp->set_world_size(r->world_size);
  resp->set_check_replicas_every(jobs_->config().check_replicas_every);
  resp->set_start_iteration(r->start_iteration);
  resp->set_joined_running_job(r->joined_running_job);
  resp->set_catch_up_root(r->catch_up_root);
  for (const PlannedBucket& b : r->plan.buckets) {
    v1::Bucket* pb = resp->add_buckets();
    pb->set_id(b.id);
    pb->set_bytes(b.bytes);
    for (uint32_t t : b.tensors) pb->add_tensor_indices(t);
  }
  return Reply(resp, absl::OkStatus());
}

grpc::Status LocalService::Detach(grpc::ServerContext*, const v1::DetachRequest* req,
                                  v1::DetachResponse* resp) {
  std::shared_ptr<Job> job = jobs_->JobOf(req->session_id());
  if (!job) return Reply(resp, MakeError(v1::STATE, "unknown session"));
  job->Leave(req->session_id(), /*graceful=*/true, "gs_close");
  jobs_->RemoveSession(req->session_id());
  return Reply(resp, absl::OkStatus());
}

grpc::Status LocalService::Broadcast(grpc::ServerContext*, const v1::BroadcastRequest* req,
                                     v1::BroadcastResponse* resp) {
  std::shared_ptr<Job> job = jobs_->JobOf(req->session_id());
  if (!job) return Reply(resp, MakeError(v1::STATE, "unknown session"));
  const int64_t timeout_ms = req->timeout_ms() > 0 ? req->timeout_ms() : jobs_->config().timeout_ms;
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(timeout_ms);
  // 1 + a slot (0 or 1); anything else is no fused call.
  const int fused_slot = req->fused_slot() == 1 || req->fused_slot() == 2
                             ? static_cast<int>(req->fused_slot()) - 1
                             : -1;
  absl::StatusOr<Broadcaster::StepResult> r =
      job->Broadcast(req->session_id(), req->bytes(), req->root_rank(), req->step(), req->device(),
                     fused_slot, deadline);
  if (!r.ok()) return Reply(resp, r.status());
  resp->set_segment_name(r->segment_name);
  resp->set_segment_bytes(r->segment_bytes);
  resp->set_piece_bytes(r->piece_bytes);
  resp->set_device_handle(r->device_handle);
  resp->set_fused(r->fused);
  resp->set_restart_from_root(r->restart_from_root + 1);
  return Reply(resp, absl::OkStatus());
}

grpc::Status LocalService::CheckReplicas(grpc::ServerContext*, const v1::CheckReplicasRequest* req,
                                         v1::CheckReplicasResponse* resp) {
  std::shared_ptr<Job> job = jobs_->JobOf(req->session_id());
  if (!job) return Reply(resp, MakeError(v1::STATE, "unknown session"));
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(jobs_->config().timeout_ms);
  const std::vector<uint64_t> hashes(req->hashes().begin(), req->hashes().end());
  return Reply(resp, job->CheckReplicas(req->session_id(), req->iteration(), hashes, deadline));
}

grpc::Status LocalService::Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                                 grpc::ServerWriter<v1::WatchEvent>* writer) {
  const uint64_t session = req->session_id();
  std::shared_ptr<Job> job = jobs_->JobOf(session);
  if (!job) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown session");
  // Refused before it holds this thread: one stream per session bounds the
  // threads a client can pin.
  if (absl::Status st = job->MarkWatched(session); !st.ok()) {
    if (std::optional<LogRateLimiter::Line> line = watch_refusals_.Admit()) {
      spdlog::warn("event=watch_refused session={:016x} error={} refused={} suppressed={}", session,
                   LogValue(st.message()), line->count, line->suppressed);
    }
    // absl and gRPC number their codes alike.
    return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
  }
  bool error_sent = false;
  uint64_t heartbeat = 0;
  {
    // The first event tells the client the daemon holds its stream.
    v1::WatchEvent hello;
    hello.set_heartbeat(heartbeat);
    if (!writer->Write(hello)) {
      job->Leave(session, /*graceful=*/false, "its Watch stream broke");
      jobs_->RemoveSession(session);
      return grpc::Status::CANCELLED;
    }
  }
  for (int poll = 0;; ++poll) {
    bool gone = false;
    absl::Status error = job->WaitForChange(session, kWatchPoll, &gone);
    if (gone) return grpc::Status::OK;  // detached
    if (ctx->IsCancelled()) {
      job->Leave(session, /*graceful=*/false,
                 "its connection to the daemon closed (the process exited or was killed)");
      jobs_->RemoveSession(session);
      return grpc::Status::CANCELLED;
    }
    v1::WatchEvent event;
    if (!error.ok() && !error_sent) {
      ToProto(error, event.mutable_error());
      error_sent = true;
    } else if (poll % kHeartbeatEvery == 0) {
      event.set_heartbeat(++heartbeat);
    } else {
      continue;
    }
    if (!writer->Write(event)) {
      job->Leave(session, /*graceful=*/false, "its Watch stream broke");
      jobs_->RemoveSession(session);
      return grpc::Status::CANCELLED;
    }
  }
}

}  // namespace gradsync
