// GlooStore: Gloo's rendezvous::Store over the job's key-value store
// (KeyValueStore: the leader's or etcd's, a JobRendezvous), so Gloo's context setup needs no file
// system, Redis or extra port. Gloo's Store reports failures by throwing: a failed call throws
// GlooStoreError, a gloo::IoException that keeps the absl::Status (TIMEOUT naming the missing keys,
// PEER_FAILED when the generation aborted, UNAVAILABLE when the leader is gone) for GlooBackend to
// hand on.
#ifndef GRADSYNC_DAEMON_BACKENDS_GLOO_STORE_H_
#define GRADSYNC_DAEMON_BACKENDS_GLOO_STORE_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/backends/key_value_store.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"

namespace gradsync {

class GlooStoreError : public gloo::IoException {
 public:
  explicit GlooStoreError(absl::Status status)
      : gloo::IoException(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class GlooStore final : public gloo::rendezvous::Store {
 public:
  // `default_timeout` bounds get() and the wait() overload without timeout.
  GlooStore(std::shared_ptr<KeyValueStore> store, absl::Duration default_timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits for the key (up to the default timeout) when it is not set yet.
  // A key a wait() fetched is answered from memory, once: Gloo waits for
  // its peers' addresses and then gets each, and the wait brought them.
  std::vector<char> get(const std::string& key) override ABSL_LOCKS_EXCLUDED(mu_);
  void wait(const std::vector<std::string>& keys) override ABSL_LOCKS_EXCLUDED(mu_);
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void WaitAndKeep(const std::vector<std::string>& keys, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::shared_ptr<KeyValueStore> store_;
  const absl::Duration default_timeout_;
  absl::Mutex mu_;  // Gloo may call from several threads
  std::map<std::string, std::string> fetched_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GLOO_STORE_H_
