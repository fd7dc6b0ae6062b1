#include "tests/integration/recording_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace gradsync::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

RecordingProxy::RecordingProxy(int upstream_port) : upstream_port_(upstream_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Loopback(0);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 16) != 0) {
    return;
  }
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { Accept(); });
}

RecordingProxy::~RecordingProxy() {
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // shutdown() wakes the threads blocked in accept() and read().
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    if (listen_fd_ >= 0) shutdown(listen_fd_, SHUT_RDWR);
  }
  if (acceptor_.joinable()) acceptor_.join();
  {
    absl::MutexLock lock(&mu_);
    pumps.swap(pumps_);
  }
  for (auto& t : pumps) t.join();
  absl::MutexLock lock(&mu_);
  for (int fd : fds_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
}

std::string RecordingProxy::Recorded() {
  absl::MutexLock lock(&mu_);
  return recorded_;
}

void RecordingProxy::Accept() {
  for (;;) {
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EINTR) continue;
      return;  // shut down
    }
    const int upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(upstream_port_);
    if (upstream < 0 || connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(client);
      if (upstream >= 0) close(upstream);
      continue;
    }
    absl::MutexLock lock(&mu_);
    fds_.push_back(client);
    fds_.push_back(upstream);
    if (stopping_) {
      shutdown(client, SHUT_RDWR);
      shutdown(upstream, SHUT_RDWR);
      return;
    }
    pumps_.emplace_back([this, client, upstream] { Pump(client, upstream); });
    pumps_.emplace_back([this, client, upstream] { Pump(upstream, client); });
  }
}

void RecordingProxy::Pump(int from, int to) {
  char buffer[16384];
  for (;;) {
    const ssize_t n = read(from, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    {
      absl::MutexLock lock(&mu_);
      recorded_.append(buffer, static_cast<size_t>(n));
    }
    for (ssize_t sent = 0; sent < n;) {
      const ssize_t w = write(to, buffer + sent, static_cast<size_t>(n - sent));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        shutdown(from, SHUT_RDWR);
        return;
      }
      sent += w;
    }
  }
  // Half-close: the other side sees the end of this direction.
  shutdown(to, SHUT_WR);
}

}  // namespace gradsync::testing
