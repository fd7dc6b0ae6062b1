// EtcdWatch: every change under a key prefix, from a revision on, delivered
// to a callback on the watch's own thread.
//
// Events arrive in revision order, each once. When the member serving the
// watch stream dies (or loses its cluster's leader), the watch is created
// again on another member from the revision after the last one delivered,
// so no event is lost or repeated across a failover (logged once,
// `event=etcd_failover ... op=Watch`). It ends — `on_end` runs once with
// the reason, naming etcd — when no member could serve it for the
// client's call_timeout, or when etcd cancels it (the start revision was
// compacted: FailedPrecondition). Stop() ends it without calling `on_end`.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_WATCH_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_WATCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/monotonic_mutex.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "grpcpp/client_context.h"

namespace gradsync {

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;  // for kDelete: the key, and the deletion's revision as mod_revision
};

class EtcdWatch {
 public:
  using EventsCallback = std::function<void(const std::vector<EtcdEvent>&)>;
  using EndCallback = std::function<void(absl::Status)>;

  // Watches every key under `prefix` (non-empty) from `start_revision`
  // (0: changes after now). Returns once etcd has created the watch (within
  // the client's call_timeout), or the error that kept it from doing so.
  // `client` must outlive the watch.
  static absl::StatusOr<std::unique_ptr<EtcdWatch>> Start(EtcdClient* client, std::string prefix,
                                                          int64_t start_revision,
                                                          EventsCallback on_events,
                                                          EndCallback on_end);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Ends the watch (idempotent); returns once its thread has ended, after
  // any callback in progress.
  void Stop();

  // The member serving the watch now ("" between streams).
  std::string endpoint() const;

 private:
  EtcdWatch(EtcdClient* client, std::string prefix, int64_t start_revision,
            EventsCallback on_events, EndCallback on_end);
  void Run();
  // One stream on one member until it breaks; OK when it broke through
  // Stop. Sets *created once etcd confirmed the watch.
  absl::Status Serve(const EtcdClient::Member& member, bool* created);

  EtcdClient* const client_;
  const std::string prefix_;
  const EventsCallback on_events_;
  const EndCallback on_end_;
  int64_t next_revision_;  // the watch thread's alone
  std::string served_by_;  // the member whose stream last served it; the thread's alone

  mutable MonotonicMutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;  // created once, or ended
  absl::Status start_status_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open stream's
  std::string endpoint_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_WATCH_H_
