// --rendezvous: where a multi-node job's rendezvous lives. Empty (the
// default) is the embedded leader, node 0's daemon; "etcd://HOST:PORT
// [,HOST:PORT...]/PREFIX" is an etcd cluster (its client URLs), every
// daemon of the job talking to it and none special. Checked for form at
// start, nothing resolved.
#ifndef GRADSYNC_DAEMON_RENDEZVOUS_ADDRESS_H_
#define GRADSYNC_DAEMON_RENDEZVOUS_ADDRESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync {

struct EtcdRendezvousAddress {
  std::vector<std::string> endpoints;  // HOST:PORT of each etcd member
  std::string prefix;                  // every key of the job lives under it
};

// INVALID_ARGUMENT naming --rendezvous and what is wrong with `value`.
absl::StatusOr<EtcdRendezvousAddress> ParseEtcdRendezvous(const std::string& value);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_RENDEZVOUS_ADDRESS_H_
