// The Local service in-process over real gRPC: a session holds at most one
// Watch stream. A second one is refused at once (it must not hold an RPC
// thread for the session's life) and the first keeps serving.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "daemon/config.h"
#include "daemon/engine/job_registry.h"
#include "daemon/local_service.h"
#include "gradsync/v1/local.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "ipc/node_segment.h"
#include "ipc/shared_segment.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

class WatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.local_size = 2;  // the job never starts: only one trainer attaches
    config_.shm_prefix = absl::StrFormat("gsw%d", getpid());
    auto node = ipc::NodeSegment::Create(ipc::SegmentName(config_.shm_prefix, getpid(), "node"),
                                         getpid());
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = std::make_shared<ipc::NodeSegment>(std::move(*node));
    jobs_ = std::make_unique<JobRegistry>(
        config_, [this] { return node_; },
        [](const Layout&, uint64_t, std::function<void(const absl::Status&)>)
            -> absl::StatusOr<JobWorld> { return absl::InternalError("not formed in this test"); },
        JobHooks{});
    service_ = std::make_unique<LocalService>(jobs_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Local::NewStub(grpc::CreateChannel(absl::StrFormat("127.0.0.1:%d", port),
                                                   grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    jobs_.reset();
    if (node_) ipc::SharedSegment::Remove(node_->name()).IgnoreError();
  }

  uint64_t Attach(int local_rank) {
    v1::AttachRequest req;
    req.set_local_rank(local_rank);
    req.set_pid(getpid());
    req.set_protocol_version(v1::PROTOCOL_VERSION_CURRENT);
    v1::AttachResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status st = stub_->Attach(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(resp.error().code(), 0) << resp.error().message();
    return resp.session_id();
  }

  DaemonConfig config_;
  std::shared_ptr<ipc::NodeSegment> node_;
  std::unique_ptr<JobRegistry> jobs_;
  std::unique_ptr<LocalService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Local::Stub> stub_;
};

TEST_F(WatchTest, SecondWatchOnASessionIsRefusedWithFailedPreconditionNamingItWhileTheFirstKeepsServing) {
  const uint64_t session = Attach(0);
  v1::WatchRequest req;
  req.set_session_id(session);

  grpc::ClientContext first_ctx;
  auto first = stub_->Watch(&first_ctx, req);
  v1::WatchEvent event;
  ASSERT_TRUE(first->Read(&event));  // the daemon holds the first stream

  grpc::ClientContext second_ctx;
  auto second = stub_->Watch(&second_ctx, req);
  const bool streamed = second->Read(&event);
  EXPECT_FALSE(streamed) << "the daemon held a second Watch stream for the session";
  if (streamed) second_ctx.TryCancel();  // else Finish would wait for the session's end
  const grpc::Status refused = second->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr(absl::StrFormat("session %016x", session)));
  EXPECT_THAT(refused.error_message(), HasSubstr("already has a Watch stream"));

  // The refusal left the session alone: the first stream still delivers
  // heartbeats, and a graceful Detach ends it cleanly.
  ASSERT_TRUE(first->Read(&event));
  EXPECT_EQ(event.event_case(), v1::WatchEvent::kHeartbeat);
  {
    v1::DetachRequest detach;
    detach.set_session_id(session);
    v1::DetachResponse detached;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Detach(&ctx, detach, &detached).ok());
    EXPECT_EQ(detached.error().code(), 0) << detached.error().message();
  }
  while (first->Read(&event)) {
  }
  const grpc::Status ended = first->Finish();
  EXPECT_TRUE(ended.ok()) << ended.error_message();
}

}  // namespace
}  // namespace gradsync
