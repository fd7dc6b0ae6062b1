// The trainer's side of the local trust boundary: connect to the daemon's
// unix socket ourselves and check who listens there before gRPC uses the
// very same connection (no window between the check and the use).
//
// A trainer trusts a daemon run by root, by its own user, by the user
// $GRADSYNC_DAEMON_UID names (a uid or a user name), or, on the system
// socket (kSystemSocketPath), by the owner of its directory: /run/gradsync
// is created by root (systemd's RuntimeDirectory=) and handed to the
// daemon's user. Every segment the trainer then maps must belong to the
// daemon's uid (SharedSegment::Open's `owner`).
#ifndef GRADSYNC_CLIENT_DAEMON_CONNECTION_H_
#define GRADSYNC_CLIENT_DAEMON_CONNECTION_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/peer_credentials.h"

namespace gradsync {

struct DaemonConnection {
  int fd = -1;  // connected; the caller owns it (gRPC takes it over)
  PeerCredentials daemon;
};

// Connects to `socket_path`, waiting until `deadline` (monotonic, see
// common/monotonic.h) for a daemon to listen there, and verifies it.
// UNAVAILABLE when nobody answers or an untrusted user does (the message
// names the socket, the peer's uid and pid, and whom this process trusts);
// INVALID_ARGUMENT for a bad $GRADSYNC_DAEMON_UID; the daemon's own code
// and reason when it turned the connection away (RESOURCE_EXHAUSTED: out
// of file descriptors); TIMEOUT when it sent nothing by `deadline`.
absl::StatusOr<DaemonConnection> ConnectToDaemon(const std::string& socket_path,
                                                 absl::Time deadline);

// The uids this process trusts to run the daemon at `socket_path`.
absl::StatusOr<std::vector<uid_t>> TrustedDaemonUids(const std::string& socket_path);

}  // namespace gradsync

#endif  // GRADSYNC_CLIENT_DAEMON_CONNECTION_H_
