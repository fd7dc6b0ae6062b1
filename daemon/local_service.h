// LocalService: the gradsync.v1.Local gRPC service on the daemon's unix
// socket — trainers attach, register their layout, detach, and hold a Watch
// stream open through which the daemon pushes errors and notices a
// trainer's death the moment its connection closes.
//
// An Attach while a job runs waits (up to 30 s) for it to end, holding a
// server thread: one such waiter per local rank, the others are refused at
// once with gRPC RESOURCE_EXHAUSTED naming the rank — a flood of Attach
// calls cannot pin more than local_size threads. A refused Watch (a second
// stream for a session) is logged rate-limited (daemon/log_rate_limit.h).
#ifndef GRADSYNC_DAEMON_LOCAL_SERVICE_H_
#define GRADSYNC_DAEMON_LOCAL_SERVICE_H_

#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/job_registry.h"
#include "daemon/log_rate_limit.h"
#include "gradsync/v1/local.grpc.pb.h"

namespace gradsync {

class LocalService final : public v1::Local::Service {
 public:
  explicit LocalService(JobRegistry* jobs) : jobs_(jobs) {}

  grpc::Status Attach(grpc::ServerContext* ctx, const v1::AttachRequest* req,
                      v1::AttachResponse* resp) override;
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                        v1::RegisterResponse* resp) override;
  grpc::Status Detach(grpc::ServerContext* ctx, const v1::DetachRequest* req,
                      v1::DetachResponse* resp) override;
  // gs_broadcast, one step per call (daemon/engine/broadcaster.h).
  grpc::Status Broadcast(grpc::ServerContext* ctx, const v1::BroadcastRequest* req,
                         v1::BroadcastResponse* resp) override;
  grpc::Status CheckReplicas(grpc::ServerContext* ctx, const v1::CheckReplicasRequest* req,
                             v1::CheckReplicasResponse* resp) override;
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::WatchEvent>* writer) override;

 private:
  // Claims the waiting slot of `local_rank`; false if another Attach holds it.
  bool ClaimWaiter(int local_rank) ABSL_LOCKS_EXCLUDED(waiting_mu_);
  void ReleaseWaiter(int local_rank) ABSL_LOCKS_EXCLUDED(waiting_mu_);

  JobRegistry* jobs_;
  // A client can ask for a refused Watch in a loop: bounded log lines.
  LogRateLimiter watch_refusals_{10, absl::Seconds(10), absl::Seconds(60)};
  absl::Mutex waiting_mu_;
  std::set<int> waiting_ranks_ ABSL_GUARDED_BY(waiting_mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_LOCAL_SERVICE_H_
