// EtcdLeaseKeeper: keeps one etcd lease alive from its own thread, and says
// when it could not.
//
// It renews the lease every third of its TTL (monotonic clock); a renewal
// that fails is tried again soon (EtcdClient moves on to the next member)
// while the lease lives. The lease is reported lost — `on_lost` runs once,
// on the keeper's thread, and the keeper stops — when etcd answers that
// the lease no longer exists (NotFound naming etcd and the lease), or when
// no renewal has succeeded for a whole TTL since the last one was sent, so
// that etcd may already have expired it (Unavailable naming etcd and the
// lease, with the last error). Destroying the keeper stops it without
// revoking the lease.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_LEASE_KEEPER_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_LEASE_KEEPER_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/monotonic_mutex.h"
#include "daemon/cluster/etcd/etcd_client.h"

namespace gradsync {

class EtcdLeaseKeeper {
 public:
  // `client` must outlive the keeper; `lease` as GrantLease returned it.
  EtcdLeaseKeeper(EtcdClient* client, EtcdLease lease, std::function<void(absl::Status)> on_lost);
  ~EtcdLeaseKeeper();
  EtcdLeaseKeeper(const EtcdLeaseKeeper&) = delete;
  EtcdLeaseKeeper& operator=(const EtcdLeaseKeeper&) = delete;

  // Stops renewing (idempotent); returns once the thread has ended.
  void Stop();

  int64_t lease_id() const { return lease_.id; }
  // Successful renewals so far.
  int64_t renewals() const;
  // Whether the lease was reported lost.
  bool lost() const;

 private:
  void Run();

  EtcdClient* const client_;
  const EtcdLease lease_;
  const std::function<void(absl::Status)> on_lost_;
  mutable MonotonicMutex mu_;
  MonotonicCondVar wake_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  int64_t renewals_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_LEASE_KEEPER_H_
