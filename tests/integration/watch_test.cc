// The Local service in-process over real gRPC: a session holds at most one
// Watch stream. A second one is refused at once (it must not hold an RPC
// thread for the session's life) and the first keeps serving.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "daemon/config.h"
#include "daemon/engine/job_registry.h"
#include "daemon/local_service.h"
#include "gradsync/v1/local.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "ipc/node_segment.h"
#include "ipc/shared_segment.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

class WatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.local_size = 2;  // the job never starts: only one trainer attaches
    config_.shm_prefix = absl::StrFormat("gsw%d", getpid());
    auto node =
        ipc::NodeSegment::Create(ipc::SegmentName(config_.shm_prefix, getpid(), "node"), getpid());
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

TEST_F(WatchTest,
       SecondWatchOnASessionIsRefusedWithFailedPreconditionNamingItWhileTheFirstKeepsServing) {
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

// A client asking for a second Watch in a loop used to write one warning
// per refusal (799 lines in one probe). Now the lines are bounded and
// carry the count: every refusal up to the last line is accounted for.
TEST_F(WatchTest, AFloodOfRefusedWatchesLogsBoundedLinesWithTheCount) {
  std::ostringstream captured;
  const std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured)));
  const uint64_t session = Attach(0);
  v1::WatchRequest req;
  req.set_session_id(session);
  grpc::ClientContext first_ctx;
  auto first = stub_->Watch(&first_ctx, req);
  v1::WatchEvent event;
  ASSERT_TRUE(first->Read(&event));

  constexpr int kRefusals = 300;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRefusals; ++i) {
    grpc::ClientContext ctx;
    auto again = stub_->Watch(&ctx, req);
    ASSERT_FALSE(again->Read(&event));
    ASSERT_EQ(again->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::default_logger()->flush();
  spdlog::set_default_logger(previous);
  first_ctx.TryCancel();
  while (first->Read(&event)) {
  }
  first->Finish();

  std::vector<std::string> refusals;
  std::istringstream in(captured.str());
  for (std::string line; std::getline(in, line);) {
    if (line.find("event=watch_refused") != std::string::npos) refusals.push_back(line);
  }
  // A burst of 10, a line each time the count doubles (20 .. 160), and at
  // most one per 10 s of the flood.
  const size_t bound = 10 + 4 + static_cast<size_t>(elapsed_s / 10) + 1;
  ASSERT_LE(refusals.size(), bound) << kRefusals << " refused Watch streams";
  ASSERT_FALSE(refusals.empty());
  std::vector<std::pair<uint64_t, uint64_t>> lines;  // refused=, suppressed=
  for (const std::string& line : refusals) {
    const size_t r = line.find(" refused="), q = line.find(" suppressed=");
    ASSERT_NE(r, std::string::npos) << line;
    ASSERT_NE(q, std::string::npos) << line;
    lines.emplace_back(std::stoull(line.substr(r + 9)), std::stoull(line.substr(q + 12)));
  }
  uint64_t accounted = 0;
  for (const auto& [count, suppressed] : lines) accounted += 1 + suppressed;
  EXPECT_EQ(accounted, lines.back().first) << captured.str();
  EXPECT_GE(lines.back().first, 160u) << captured.str();
  EXPECT_LE(lines.back().first, static_cast<uint64_t>(kRefusals));
}

}  // namespace
}  // namespace gradsync
