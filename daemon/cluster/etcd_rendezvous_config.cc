#include "daemon/cluster/etcd_rendezvous_config.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "daemon/rendezvous_address.h"

namespace gradsync {
namespace {

// One attempt of a call on one member: a dead or blackholed member is left
// for the next one after this long at most.
constexpr absl::Duration kEtcdAttemptTimeout = absl::Milliseconds(1500);
// The shortest budget of a whole call: two members' attempts.
constexpr absl::Duration kEtcdMinCallTimeout = absl::Seconds(3);

// What the daemon's etcd clients share: where calls start, per endpoint
// list (the daemon has one; tools and tests may have others), and the
// shutdown budget.
struct DaemonEtcdShared {
  absl::Mutex mu;
  std::map<std::vector<std::string>, std::shared_ptr<EtcdMemberOrder>> orders ABSL_GUARDED_BY(mu);
  const std::shared_ptr<EtcdShutdownBudget> shutdown = std::make_shared<EtcdShutdownBudget>();
};

DaemonEtcdShared& Shared() {
  static DaemonEtcdShared* shared = new DaemonEtcdShared;
  return *shared;
}

std::shared_ptr<EtcdMemberOrder> MemberOrderOf(const std::vector<std::string>& endpoints) {
  DaemonEtcdShared& shared = Shared();
  absl::MutexLock lock(&shared.mu);
  std::shared_ptr<EtcdMemberOrder>& order = shared.orders[endpoints];
  if (order == nullptr) order = std::make_shared<EtcdMemberOrder>(endpoints.size());
  return order;
}

}  // namespace

void BeginEtcdShutdown() { Shared().shutdown->Begin(kEtcdShutdownBudget); }

absl::StatusOr<std::shared_ptr<EtcdRendezvous>> ConnectEtcdRendezvous(const DaemonConfig& config) {
  ASSIGN_OR_RETURN(EtcdRendezvousAddress address, ParseEtcdRendezvous(config.rendezvous));
  EtcdRendezvousOptions options;
  options.etcd.endpoints = address.endpoints;
  options.etcd.tls = TlsFiles{config.etcd_cert, config.etcd_key, config.etcd_ca};
  options.etcd.user = config.etcd_user;
  options.etcd.password = config.etcd_password;
  options.prefix = address.prefix;
  options.job_id = config.job_id;
  options.job_token = config.job_token;
  // The embedded leader's heartbeat timeout (daemon.cc).
  options.lease_ttl = std::min(absl::Milliseconds(config.timeout_ms), absl::Seconds(10));
  // A call retries across the members for as long as this node's lease
  // lives (--timeout-s, at most 10 s): a member's death, or an election on
  // a loaded machine, costs retries rather than the job. Past it the other
  // nodes count this node dead anyway.
  options.etcd.call_timeout = std::max(kEtcdMinCallTimeout, options.lease_ttl);
  options.etcd.attempt_timeout = kEtcdAttemptTimeout;
  options.etcd.member_order = MemberOrderOf(address.endpoints);
  options.etcd.shutdown = Shared().shutdown;
  options.min_nodes = config.min_nodes_or_num();
  options.max_nodes = config.max_nodes_or_num();
  return EtcdRendezvous::Connect(std::move(options));
}

}  // namespace gradsync
