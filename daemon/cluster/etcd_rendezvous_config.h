// The daemon's EtcdRendezvous, made from its flags: --rendezvous (etcd's
// endpoints and the key prefix), --etcd-* (TLS, etcd auth), the job's id
// and token, --min-nodes, and the lease TTL (the embedded leader's
// heartbeat timeout, so a silent node is dead after as long on either),
// which is also how long each etcd call retries across the members.
//
// One daemon per process: every EtcdRendezvous made here shares which etcd
// member calls start at (so a re-formation's new client starts where the
// last one left off) and the daemon's shutdown budget.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_CONFIG_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_CONFIG_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/etcd_rendezvous.h"
#include "daemon/config.h"

namespace gradsync {

// `config.rendezvous` must be an etcd:// address (ValidateConfig checked it).
absl::StatusOr<std::shared_ptr<EtcdRendezvous>> ConnectEtcdRendezvous(const DaemonConfig& config);

// All the etcd calls a daemon makes once it shuts down (its Leave or
// Depart, the final LeaseRevoke, a heartbeat in flight) end within this,
// together: `systemctl stop` is not held up a lease TTL per call by an
// unreachable etcd, and the lease's expiry tells the others instead.
inline constexpr absl::Duration kEtcdShutdownBudget = absl::Seconds(2);

// Starts kEtcdShutdownBudget for every EtcdRendezvous made here (and any
// made later); once.
void BeginEtcdShutdown();

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_CONFIG_H_
