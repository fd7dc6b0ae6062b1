// EtcdOperationDeadline: the deadline of the operation (a rendezvous Join,
// a Wait for keys, a Leave, ...) whose etcd calls run on this thread while
// the object lives. EtcdClient cuts each call's retry budget to what the
// innermost operation has left, so one call started late in an operation
// cannot overrun it by a whole call budget, and the error of a call it cut
// names the operation beside etcd.
//
// Scoped to the calling thread: an operation's calls are synchronous on
// it, while the lease keeper's and the watch's threads keep their own
// bounds. Scopes nest; an inner one never extends an outer one's deadline.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_OPERATION_DEADLINE_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_OPERATION_DEADLINE_H_

#include <string>

#include "absl/time/time.h"

namespace gradsync {

class EtcdOperationDeadline {
 public:
  // `deadline` is on the monotonic clock (common/monotonic.h); `budget`
  // is how long the operation had in all, as its errors say.
  EtcdOperationDeadline(std::string operation, absl::Time deadline, absl::Duration budget);
  ~EtcdOperationDeadline();

  EtcdOperationDeadline(const EtcdOperationDeadline&) = delete;
  EtcdOperationDeadline& operator=(const EtcdOperationDeadline&) = delete;

  // The innermost operation on this thread; nullptr outside any.
  static const EtcdOperationDeadline* Current();

  // The earlier of this operation's deadline and its enclosing one's.
  absl::Time deadline() const { return deadline_; }
  // The operation that deadline belongs to, as errors name it ("join").
  const std::string& operation() const { return operation_; }
  // How long that operation had in all.
  absl::Duration budget() const { return budget_; }

 private:
  const EtcdOperationDeadline* const outer_;
  std::string operation_;
  absl::Time deadline_;
  absl::Duration budget_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_OPERATION_DEADLINE_H_
