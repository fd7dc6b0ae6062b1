#include "daemon/connection_acceptor.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/refusal_note.h"
#include "common/status_macros.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Out of descriptors and no reserve to make room: how long the loop waits
// before trying again (connections wait in the backlog meanwhile).
constexpr int kExhaustedBackoffMs = 100;

// A trainer turned away says why (common/refusal_note.h) rather than
// blaming its own user; gRPC clients on TCP would only read it as a broken
// HTTP/2 preface, so they just see the connection close.
void TellOutOfFds(int fd, int err) {
  const std::string note = FormatRefusalNote(
      v1::RESOURCE_EXHAUSTED,
      absl::StrCat("gradsyncd (pid ", getpid(), ") ran out of file descriptors (",
                   std::strerror(err),
                   ") and turned this connection away: it serves again "
                   "once connections are released (see event=accept_out_of_fds in its log)"));
  // A fresh socket's buffer is empty: this never blocks, and a peer already
  // gone (EPIPE) is no signal.
  (void)!send(fd, note.data(), note.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

absl::Status ErrnoError(int err, const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

int OpenReserve() { return open("/dev/null", O_RDONLY | O_CLOEXEC); }

// Splits HOST:PORT, removing the brackets of an IPv6 host.
absl::Status SplitHostPort(const std::string& host_port, std::string* host, std::string* port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", host_port, "' has no :PORT"));
  }
  *host = host_port.substr(0, colon);
  *port = host_port.substr(colon + 1);
  if (!host->empty() && host->front() == '[') {
    if (host->back() != ']') {
      return absl::InvalidArgumentError(
          absl::StrCat("listen address '", host_port, "' has an unclosed '['"));
    }
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> BindTcp(const addrinfo& ai, int port, const std::string& what) {
  const int fd =
      socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("socket for ", what));
  const int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // "[::]" serves IPv4 too, as gRPC's own listener does.
  if (ai.ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  sockaddr_storage addr{};
  std::memcpy(&addr, ai.ai_addr, ai.ai_addrlen);
  if (ai.ai_family == AF_INET) reinterpret_cast<sockaddr_in*>(&addr)->sin_port = htons(port);
  if (ai.ai_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = htons(port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), ai.ai_addrlen) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoError(err, absl::StrCat("listen on ", what));
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> ConnectionAcceptor::ListenTcp(
    const std::string& host_port) {
  std::string host, port_text;
  RETURN_IF_ERROR(SplitHostPort(host_port, &host, &port_text));
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", host_port, "' has a bad port"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc =
      getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve --listen ", host_port, ": ", gai_strerror(rc)));
  }
  std::vector<int> fds;
  absl::Status last;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    // Port 0: the first address picks it, the others follow.
    absl::StatusOr<int> fd = BindTcp(*ai, port, host_port);
    if (!fd.ok()) {
      last = fd.status();
      continue;
    }
    fds.push_back(*fd);
    if (port == 0) port = BoundPort(*fd);
  }
  freeaddrinfo(found);
  if (fds.empty()) return last.ok() ? absl::UnavailableError("no address to listen on") : last;
  return std::unique_ptr<ConnectionAcceptor>(new ConnectionAcceptor(std::move(fds), port, true));
}

absl::StatusOr<std::unique_ptr<ConnectionAcceptor>> ConnectionAcceptor::ListenUnix(
    const std::string& path, mode_t mode) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path ", path, " is longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoError(errno, "socket");
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoError(err, absl::StrCat("bind unix socket ", path));
  }
  // Before listen(): nobody can connect while the mode is still the umask's.
  if (chmod(path.c_str(), mode) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    close(fd);
    unlink(path.c_str());
    return ErrnoError(err, absl::StrCat("listen on unix socket ", path));
  }
  return std::unique_ptr<ConnectionAcceptor>(new ConnectionAcceptor({fd}, 0, false));
}

ConnectionAcceptor::ConnectionAcceptor(std::vector<int> listeners, int port, bool tcp)
    : listeners_(std::move(listeners)), port_(port), tcp_(tcp) {
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  reserve_fd_ = OpenReserve();
}

ConnectionAcceptor::~ConnectionAcceptor() {
  Stop();
  if (stop_fd_ >= 0) close(stop_fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void ConnectionAcceptor::Start(grpc::Server* server, Admit admit) {
  admit_ = std::move(admit);
  thread_ = std::thread([this, server] { Loop(server); });
}

bool ConnectionAcceptor::Admitted(int fd) {
  if (!admit_) return true;
  const Verdict verdict = admit_(fd);
  if (verdict.status.ok()) return true;
  close(fd);
  // A peer retrying in a loop is logged once; the memory is bounded.
  if (refusals_logged_.size() >= 1024) refusals_logged_.clear();
  if (refusals_logged_.insert(verdict.peer).second) {
    spdlog::warn("event=peer_refused {} reason={}", verdict.peer,
                 LogValue(verdict.status.message()));
  }
  return false;
}

void ConnectionAcceptor::Stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int fd : listeners_) close(fd);
  listeners_.clear();
}

void ConnectionAcceptor::Loop(grpc::Server* server) {
  std::vector<pollfd> fds;
  for (int fd : listeners_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({stop_fd_, POLLIN, 0});
  int timeout_ms = -1;
  while (true) {
    const int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) {
      spdlog::error("event=accept_poll_failed error={}", LogValue(std::strerror(errno)));
      timeout_ms = kExhaustedBackoffMs;
      continue;
    }
    if (fds.back().revents != 0) return;
    timeout_ms = -1;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      // After a back-off every listener is tried: poll said nothing new.
      if (n > 0 && fds[i].revents == 0) continue;
      if (!AcceptAll(fds[i].fd, server)) timeout_ms = kExhaustedBackoffMs;
    }
  }
}

void ConnectionAcceptor::NoteOutOfFds(int listener, int err) {
  if (out_of_fds_) return;
  out_of_fds_ = true;
  spdlog::warn(
      "event=accept_out_of_fds listener={} error={} action=\"closing new "
      "connections until descriptors free up\"",
      listener, LogValue(std::strerror(err)));
}

bool ConnectionAcceptor::AcceptAll(int listener, grpc::Server* server) {
  while (true) {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (reserve_fd_ < 0 && (reserve_fd_ = OpenReserve()) < 0) {
        // This connection took the last descriptor: give it back (header).
        NoteOutOfFds(listener, EMFILE);
        if (!tcp_) TellOutOfFds(fd, EMFILE);
        close(fd);
        reserve_fd_ = OpenReserve();
        continue;
      }
      if (out_of_fds_) {
        out_of_fds_ = false;
        spdlog::info("event=accept_recovered listener={}", listener);
      }
      if (tcp_) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      if (Admitted(fd)) grpc::AddInsecureChannelFromFd(server, fd);  // gRPC owns fd now
      continue;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) {
      if (reserve_fd_ < 0) reserve_fd_ = OpenReserve();
      return true;
    }
    if (err == EMFILE || err == ENFILE) {
      NoteOutOfFds(listener, err);
      if (reserve_fd_ < 0 && (reserve_fd_ = OpenReserve()) < 0) {
        return false;  // nothing to give up: wait for descriptors to free
      }
      // Make room for one descriptor, turn the connection away, take it back.
      close(reserve_fd_);
      reserve_fd_ = -1;
      const int victim = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (victim >= 0) {
        if (!tcp_) TellOutOfFds(victim, err);
        close(victim);
      }
      reserve_fd_ = OpenReserve();
      continue;
    }
    spdlog::error("event=accept_failed listener={} error={}", listener,
                  LogValue(std::strerror(err)));
    return false;  // ENOBUFS, ENOMEM: back off rather than spin
  }
}

}  // namespace gradsync
