// EtcdMemberOrder: which member of an etcd cluster calls start at (the one
// that answered last), shared by every EtcdClient of one daemon, so that a
// client built for a re-formation starts where the previous one left off
// instead of at the first endpoint again (a dead or blackholed first member
// would otherwise cost one attempt per re-formation).
//
// Thread-safe.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_MEMBER_ORDER_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_MEMBER_ORDER_H_

#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradsync {

class EtcdMemberOrder {
 public:
  // For a cluster of `members` endpoints (at least one), in their order.
  explicit EtcdMemberOrder(size_t members);

  size_t members() const { return members_; }
  // The index of the member calls start at.
  size_t preferred() const ABSL_LOCKS_EXCLUDED(mu_);
  // Member `index` answered: calls start there from now on.
  void MarkHealthy(size_t index) ABSL_LOCKS_EXCLUDED(mu_);
  // Member `index` failed an attempt: if calls started there, they start at
  // the next member from now on.
  void MarkFailed(size_t index) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t members_;
  mutable absl::Mutex mu_;
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_MEMBER_ORDER_H_
