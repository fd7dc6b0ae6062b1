// Node 0 given a --leader that names itself: every node of a job can then
// share one --leader (as torchrun's ranks share MASTER_ADDR), so a k8s
// manifest or a config file needs no shell to leave it out on node 0.
#ifndef GRADSYNC_DAEMON_LEADER_SELF_H_
#define GRADSYNC_DAEMON_LEADER_SELF_H_

#include "absl/status/status.h"
#include "daemon/config.h"

namespace gradsync {

// On node 0 of several with a --leader: clears config->leader (node 0
// leads) when it names this daemon — its port is --listen's and its host
// is --listen's or --host's, or resolves to an address of this host's
// interfaces. Otherwise InvalidArgument naming --leader, what it resolved
// to and --listen. A name that does not resolve yet (a Pod's DNS record
// lags its start) is retried for up to 30 s. Other configs are untouched.
absl::Status AdoptLeaderNamingSelf(DaemonConfig* config);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_LEADER_SELF_H_
