// ConnectionAcceptor: accepts connections on the daemon's listening sockets
// itself and hands each one to a gRPC server (grpc::AddInsecureChannelFromFd),
// so that running out of file descriptors cannot deafen the daemon.
//
// gRPC 1.51's own listener treats EMFILE from accept4 as fatal: it stops
// accepting for good while the process lives on (and systemd, seeing it
// alive, never restarts it). Here, on EMFILE or ENFILE the acceptor gives
// up its reserve descriptor, accepts the waiting connection and closes it at
// once (the client sees the connection close instead of hanging in the
// backlog; on the unix socket a trainer first reads a note saying the
// daemon ran out of descriptors, common/refusal_note.h), takes the reserve
// back and keeps listening: once descriptors free up, the next connection
// is served. A connection accepted while the reserve is lost (another
// thread took the descriptor it freed) gets the same answer if the reserve
// cannot be taken back first: serving it would leave nothing to turn the
// next one away with, and that one would wait in the backlog until it
// timed out.
//
// An optional admission check runs on every accepted connection before gRPC
// reads a byte of it (the unix socket's peer-credential check,
// trainer_admission.h); a refused connection is closed and logged once per
// peer (`event=peer_refused uid=.. pid=.. reason=".."`).
//
// Threads: one accept thread per acceptor, started by Start and joined by
// Stop (or the destructor). Stop before shutting the server down: no
// connection may be handed to a server that is going away.
#ifndef GRADSYNC_DAEMON_CONNECTION_ACCEPTOR_H_
#define GRADSYNC_DAEMON_CONNECTION_ACCEPTOR_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server.h"

namespace gradsync {

class ConnectionAcceptor {
 public:
  // Listens on HOST:PORT (IPv6 hosts bracketed; PORT 0: a free port, the
  // same on every address HOST resolves to).
  static absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> ListenTcp(
      const std::string& host_port);
  // Listens on a unix socket at `path` (which must not exist), with file
  // mode `mode` set before anyone can connect.
  static absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> ListenUnix(const std::string& path,
                                                                        mode_t mode);
  // Whether the connection on an fd may go to gRPC: `peer` names who is on
  // the other end as key=value fields ("uid=1000 pid=42") for the log.
  struct Verdict {
    absl::Status status;
    std::string peer;
  };
  using Admit = std::function<Verdict(int fd)>;

  ~ConnectionAcceptor();
  ConnectionAcceptor(const ConnectionAcceptor&) = delete;
  ConnectionAcceptor& operator=(const ConnectionAcceptor&) = delete;

  // The TCP port bound (0 for a unix socket).
  int port() const { return port_; }
  // Starts accepting; every connection `admit` approves (all, when it is
  // empty) goes to `server`, which must outlive Stop.
  void Start(grpc::Server* server, Admit admit = {});
  // Stops accepting and closes the listening sockets. Idempotent.
  void Stop();

 private:
  ConnectionAcceptor(std::vector<int> listeners, int port, bool tcp);
  void Loop(grpc::Server* server);
  // Runs admit_ on a fresh connection; a refusal closes it.
  bool Admitted(int fd);
  // Drains one listener's backlog; returns false when out of descriptors
  // without a reserve to make room (the loop then backs off).
  bool AcceptAll(int listener, grpc::Server* server);
  // Logs the start of an out-of-descriptors episode (once per episode).
  void NoteOutOfFds(int listener, int err);

  std::vector<int> listeners_;  // closed by Stop
  const int port_;
  const bool tcp_;
  int stop_fd_ = -1;         // eventfd: Stop wakes the loop's poll
  int reserve_fd_ = -1;      // /dev/null, given up to accept-and-close on EMFILE
  bool out_of_fds_ = false;  // logged once per episode, not per connection
  Admit admit_;
  absl::flat_hash_set<std::string> refusals_logged_;  // accept thread only; bounded
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CONNECTION_ACCEPTOR_H_
