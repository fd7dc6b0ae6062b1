#include "daemon/local_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Refused peers remembered for "log once"; past this the memory starts over.
constexpr size_t kMaxRemembered = 1024;

}  // namespace

absl::StatusOr<std::unique_ptr<LocalListener>> LocalListener::Listen(const std::string& path,
                                                                     mode_t mode) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path ", path, " is too long"));
  }
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  auto fail = [&](const std::string& what) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on unix socket ", path, ": ", what, ": ", std::strerror(err)));
  };
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return fail("bind");
  // Before listen(): nobody can connect while the mode is still the umask's.
  if (chmod(path.c_str(), mode) != 0) {
    absl::Status st = fail("chmod");
    unlink(path.c_str());
    return st;
  }
  if (listen(fd, SOMAXCONN) != 0) {
    absl::Status st = fail("listen");
    unlink(path.c_str());
    return st;
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    absl::Status st = fail("eventfd");
    unlink(path.c_str());
    return st;
  }
  return std::unique_ptr<LocalListener>(new LocalListener(path, fd, wake));
}

LocalListener::~LocalListener() {
  Stop();
  close(listen_fd_);
  close(wake_fd_);
}

void LocalListener::Start(grpc::Server* server, Admit admit) {
  thread_ = std::thread([this, server, admit = std::move(admit)] { AcceptLoop(server, admit); });
}

void LocalListener::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    spdlog::error("event=listener_wake_failed error=\"{}\"", std::strerror(errno));
  }
  thread_.join();
}

void LocalListener::AcceptLoop(grpc::Server* server, const Admit& admit) {
  pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (true) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("event=listener_poll_failed path={} error=\"{}\"", path_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // Stop
    // Non-blocking: gRPC polls it and expects reads never to block.
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // EAGAIN: the peer gave up between poll and accept; EMFILE and the
      // like: the next poll retries (logged, they need an operator).
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        spdlog::warn("event=accept_failed path={} error=\"{}\"", path_, std::strerror(errno));
        // The listen fd stays readable: back off instead of spinning (Stop still wakes us).
        if (poll(&fds[1], 1, 100) > 0) return;
      }
      continue;
    }
    absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);
    if (!peer.ok()) {
      spdlog::warn("event=peer_unknown path={} error=\"{}\"", path_,
                   std::string(peer.status().message()));
      close(fd);
      continue;
    }
    if (absl::Status st = admit(*peer); !st.ok()) {
      Refused(*peer, st);
      close(fd);
      continue;
    }
    grpc::AddInsecureChannelFromFd(server, fd);  // the server owns fd now
  }
}

void LocalListener::Refused(const PeerCredentials& peer, const absl::Status& why) {
  absl::MutexLock lock(&refused_mu_);
  if (refused_.size() >= kMaxRemembered) refused_.clear();
  if (!refused_.insert({peer.uid, peer.pid}).second) return;
  spdlog::warn("event=peer_refused uid={} pid={} socket={} reason=\"{}\"", peer.uid, peer.pid,
               path_, std::string(why.message()));
}

}  // namespace gradsync
