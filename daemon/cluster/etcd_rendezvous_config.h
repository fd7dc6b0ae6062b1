// The daemon's EtcdRendezvous, made from its flags: --rendezvous (etcd's
// endpoints and the key prefix), --etcd-* (TLS, etcd auth), the job's id
// and token, --min-nodes, and the lease TTL (the embedded leader's
// heartbeat timeout, so a silent node is dead after as long on either),
// which is also how long each etcd call retries across the members.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_CONFIG_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_CONFIG_H_

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/cluster/etcd_rendezvous.h"
#include "daemon/config.h"

namespace gradsync {

// `config.rendezvous` must be an etcd:// address (ValidateConfig checked it).
absl::StatusOr<std::shared_ptr<EtcdRendezvous>> ConnectEtcdRendezvous(const DaemonConfig& config);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_CONFIG_H_
