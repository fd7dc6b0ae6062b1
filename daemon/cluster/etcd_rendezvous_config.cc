#include "daemon/cluster/etcd_rendezvous_config.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "daemon/rendezvous_address.h"

namespace gradsync {
namespace {

// Each etcd call, failover included. Short: an unreachable etcd must not
// hold up a node's shutdown for long (as the leader's RPCs).
constexpr absl::Duration kEtcdCallTimeout = absl::Seconds(3);

}  // namespace

absl::StatusOr<std::shared_ptr<EtcdRendezvous>> ConnectEtcdRendezvous(const DaemonConfig& config) {
  ASSIGN_OR_RETURN(EtcdRendezvousAddress address, ParseEtcdRendezvous(config.rendezvous));
  EtcdRendezvousOptions options;
  options.etcd.endpoints = address.endpoints;
  options.etcd.tls = TlsFiles{config.etcd_cert, config.etcd_key, config.etcd_ca};
  options.etcd.user = config.etcd_user;
  options.etcd.password = config.etcd_password;
  options.etcd.call_timeout = kEtcdCallTimeout;
  options.etcd.attempt_timeout = kEtcdCallTimeout / 2;
  options.prefix = address.prefix;
  options.job_id = config.job_id;
  options.job_token = config.job_token;
  // The embedded leader's heartbeat timeout (daemon.cc).
  options.lease_ttl = std::min(absl::Milliseconds(config.timeout_ms), absl::Seconds(10));
  options.min_nodes = config.min_nodes_or_num();
  options.max_nodes = config.max_nodes_or_num();
  return EtcdRendezvous::Connect(std::move(options));
}

}  // namespace gradsync
