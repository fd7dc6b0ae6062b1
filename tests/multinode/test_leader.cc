#include "tests/multinode/test_leader.h"

#include <utility>

#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace gradsync::testing {

TestLeader::TestLeader(const std::string& job_id, const std::string& job_token, int num_nodes,
                       absl::Duration default_timeout, absl::Duration heartbeat_timeout,
                       MonotonicClock clock, int port, RendezvousStoreLimits limits)
    : service_(std::make_unique<RendezvousService>(job_id, CallAuth(CallAuthPolicy{job_token}),
                                                   num_nodes, default_timeout, heartbeat_timeout,
                                                   std::move(clock), limits)) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:" + std::to_string(port), grpc::InsecureServerCredentials(),
                           &port_);
  builder.SetMaxReceiveMessageSize(kMaxRendezvousMessageBytes);  // as the daemon's
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ != nullptr && port_ > 0) address_ = "127.0.0.1:" + std::to_string(port_);
}

TestLeader::~TestLeader() {
  // Cancels calls still blocked in Join/Wait; they notice within 100 ms.
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
}

}  // namespace gradsync::testing
