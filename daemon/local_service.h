// LocalService: the gradsync.v1.Local gRPC service on the daemon's unix
// socket — trainers attach, register their layout, detach, and hold a Watch
// stream open through which the daemon pushes errors and notices a
// trainer's death the moment its connection closes.
#ifndef GRADSYNC_DAEMON_LOCAL_SERVICE_H_
#define GRADSYNC_DAEMON_LOCAL_SERVICE_H_

#include "daemon/engine/job_registry.h"
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
  grpc::Status Watch(grpc::ServerContext* ctx, const v1::WatchRequest* req,
                     grpc::ServerWriter<v1::WatchEvent>* writer) override;

 private:
  JobRegistry* jobs_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_LOCAL_SERVICE_H_
