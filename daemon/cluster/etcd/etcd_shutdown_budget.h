// EtcdShutdownBudget: one short total budget for the etcd calls a daemon
// makes once it shuts down (its Leave or Depart, the final LeaseRevoke, a
// heartbeat still in flight), shared by every EtcdClient of the daemon, so
// that stopping it while etcd is unreachable takes about that long instead
// of a lease TTL per call. What those writes would have told the other
// nodes, the expiry of this node's lease tells them, as it tells them of a
// killed daemon.
//
// Thread-safe.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_SHUTDOWN_BUDGET_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_SHUTDOWN_BUDGET_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradsync {

class EtcdShutdownBudget {
 public:
  // Starts the budget: every call from now on ends within `total` of now.
  // Once; a later Begin changes nothing.
  void Begin(absl::Duration total) ABSL_LOCKS_EXCLUDED(mu_);
  // When the budget runs out (monotonic); InfiniteFuture before Begin.
  absl::Time deadline() const ABSL_LOCKS_EXCLUDED(mu_);
  // Call `op` to `etcd` failed because the budget ran out: logs
  // `event=etcd_leave_skipped`, once for the whole shutdown.
  void NoteSkipped(const std::string& op, const std::string& etcd, const std::string& error)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Duration total_ ABSL_GUARDED_BY(mu_);
  bool noted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_SHUTDOWN_BUDGET_H_
