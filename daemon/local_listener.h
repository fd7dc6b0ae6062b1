// LocalListener: the unix socket trainers attach to, accepted by us rather
// than by gRPC so that every connection is checked (trainer_admission.h)
// before gRPC reads a byte of it; an admitted connection is handed to the
// Local gRPC server as is (grpc::AddInsecureChannelFromFd), a refused one is
// logged (once per uid and pid) and closed.
//
// Threads: one accept thread between Start and Stop; Stop is idempotent and
// safe from any thread but the accept thread.
#ifndef GRADSYNC_DAEMON_LOCAL_LISTENER_H_
#define GRADSYNC_DAEMON_LOCAL_LISTENER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/peer_credentials.h"
#include "grpcpp/grpcpp.h"

namespace gradsync {

class LocalListener {
 public:
  using Admit = std::function<absl::Status(const PeerCredentials&)>;

  // Binds and listens on `path` (which must not exist), with file mode
  // `mode` set before anyone can connect.
  static absl::StatusOr<std::unique_ptr<LocalListener>> Listen(const std::string& path,
                                                               mode_t mode);
  ~LocalListener();  // Stop()
  LocalListener(const LocalListener&) = delete;
  LocalListener& operator=(const LocalListener&) = delete;

  // Starts accepting: connections `admit` approves go to `server` (which
  // must outlive Stop).
  void Start(grpc::Server* server, Admit admit);
  // Stops accepting and joins the accept thread; established connections
  // stay with the server.
  void Stop();

 private:
  LocalListener(std::string path, int listen_fd, int wake_fd)
      : path_(std::move(path)), listen_fd_(listen_fd), wake_fd_(wake_fd) {}
  void AcceptLoop(grpc::Server* server, const Admit& admit);
  void Refused(const PeerCredentials& peer, const absl::Status& why);

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // eventfd: Stop wakes the accept thread's poll
  std::thread thread_;
  // (uid, pid) pairs already logged: a peer retrying in a loop is logged once.
  absl::Mutex refused_mu_;
  std::set<std::pair<uid_t, pid_t>> refused_ ABSL_GUARDED_BY(refused_mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_LOCAL_LISTENER_H_
