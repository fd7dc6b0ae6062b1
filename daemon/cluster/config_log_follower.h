// ConfigLogFollower: one node's reader of the leader's ordered job-wide
// config log (ConfigKey: "g<gen>/config/<version>", rendezvous_records.h).
// The heartbeat says how far the log goes; CatchUp fetches every version
// after the last one read, in order, and hands each to the job's listener
// exactly once, in order.
//
// Versions read before the job listens are kept, not dropped: the log can
// grow while the nodes still form the world, and a node's first heartbeat
// can come back before its job has started. Every node must hand its job
// every version, or the nodes count their plan decisions differently and
// one waits on the other's plan check until the timeout.
//
// Threads: CatchUp belongs to one thread (the heartbeat's); SetListener may
// be called from any other. The listener runs under the follower's lock,
// so it must not call back into the follower.
#ifndef GRADSYNC_DAEMON_CLUSTER_CONFIG_LOG_FOLLOWER_H_
#define GRADSYNC_DAEMON_CLUSTER_CONFIG_LOG_FOLLOWER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/bucket_planner.h"

namespace gradsync {

class ConfigLogFollower {
 public:
  // A version's caps, the iteration they start at, and the version; `grow`:
  // not caps but nodes joining the running job at that iteration.
  using Listener = std::function<void(const BucketCaps& caps, uint64_t at_iteration,
                                      uint64_t version, bool grow)>;
  // Reads one key of the rendezvous store; nullopt when it is not set.
  using Getter = std::function<absl::StatusOr<std::optional<std::string>>(const std::string& key)>;

  ConfigLogFollower(uint64_t generation, int node_rank, Getter get);

  // Reads every version after the last one read, up to `newest`, in order,
  // and hands them on (or keeps them until there is a listener). An error
  // (a version gone from the leader's log, a record out of order) means
  // this node cannot follow the job's plan; a transport error leaves the
  // rest for the next call.
  absl::Status CatchUp(uint64_t newest) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `listener` every version read so far, then each one read later.
  void SetListener(Listener listener) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Change {
    BucketCaps caps;
    uint64_t at_iteration = 0;
    uint64_t version = 0;
    bool grow = false;
  };
  void DeliverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t generation_;
  const int node_rank_;
  const Getter get_;
  // CatchUp's thread only: the last version read and its iteration.
  uint64_t read_version_ = 0;
  uint64_t read_at_ = 0;
  absl::Mutex mu_;
  Listener listener_ ABSL_GUARDED_BY(mu_);
  std::vector<Change> undelivered_ ABSL_GUARDED_BY(mu_);  // in version order
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_CONFIG_LOG_FOLLOWER_H_
