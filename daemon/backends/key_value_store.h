// KeyValueStore: what a backend needs of the job's key-value store to set
// itself up (Gloo's rendezvous, NCCL's unique id): set, get, and wait for
// keys with a deadline. The store lives above the backends (the job's
// rendezvous, the leader's or etcd's: daemon/cluster's JobRendezvous), so the
// backends see only this interface and never depend on the cluster layer.
//
// Errors are the store's own: TIMEOUT naming the missing keys, PEER_FAILED
// when the generation was aborted, UNAVAILABLE when the store is gone.
// Thread-safe implementations only: Gloo calls it from its own threads.
#ifndef GRADSYNC_DAEMON_BACKENDS_KEY_VALUE_STORE_H_
#define GRADSYNC_DAEMON_BACKENDS_KEY_VALUE_STORE_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gradsync {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  virtual absl::Status Set(std::string_view key, std::string_view value) = 0;
  // nullopt when the key is not set.
  virtual absl::StatusOr<std::optional<std::string>> Get(std::string_view key) = 0;
  // Blocks until every key is set; TIMEOUT (after `timeout`, which must be
  // positive) names the missing keys.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Wait, then every key's value (key -> value): one round trip where the
  // store can answer with the values.
  virtual absl::StatusOr<std::map<std::string, std::string>> WaitForValues(
      const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_KEY_VALUE_STORE_H_
