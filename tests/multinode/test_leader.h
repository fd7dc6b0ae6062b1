// TestLeader, for the multi-node tests: a leader (RendezvousService on a real
// gRPC server on 127.0.0.1, port picked by the kernel unless given: a
// restarted leader takes its predecessor's port). Node processes are
// spawned with tests/testing/process.h.
#ifndef GRADSYNC_TESTS_MULTINODE_TEST_LEADER_H_
#define GRADSYNC_TESTS_MULTINODE_TEST_LEADER_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/monotonic.h"
#include "daemon/cluster/rendezvous_service.h"
#include "grpcpp/server.h"

namespace gradsync::testing {

class TestLeader {
 public:
  // Calls need `job_token` in their metadata, as on a daemon.
  TestLeader(const std::string& job_id, const std::string& job_token, int num_nodes,
             absl::Duration default_timeout, absl::Duration heartbeat_timeout,
             MonotonicClock clock = MonotonicNow, int port = 0, RendezvousStoreLimits limits = {});
  ~TestLeader();

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  RendezvousService& service() { return *service_; }

 private:
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  int port_ = 0;
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_MULTINODE_TEST_LEADER_H_
