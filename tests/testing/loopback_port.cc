#include "tests/testing/loopback_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsync::testing {
namespace {

// A socket bound to 127.0.0.1 on a port the kernel picks; -1 on failure.
int BindLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

LoopbackPort LoopbackPort::Refusing() {
  LoopbackPort p;
  int port = 0;
  p.fd_ = BindLoopback(&port);
  if (p.fd_ >= 0) p.address_ = absl::StrCat("127.0.0.1:", port);
  return p;
}

LoopbackPort LoopbackPort::Listening() {
  LoopbackPort p = Refusing();
  if (p.fd_ < 0 || listen(p.fd_, 16) != 0) p.address_.clear();
  return p;
}

LoopbackPort LoopbackPort::Unanswering() {
  LoopbackPort p = Refusing();
  // Backlog 0: one established, never accepted connection fills the queue.
  if (p.fd_ < 0 || listen(p.fd_, 0) != 0) {
    p.address_.clear();
    return p;
  }
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(p.fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  const int filler = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  p.queued_.push_back(filler);
  if (filler < 0 || connect(filler, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    p.address_.clear();
  }
  return p;
}

LoopbackPort::LoopbackPort(LoopbackPort&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      queued_(std::move(other.queued_)),
      address_(std::move(other.address_)) {
  other.queued_.clear();
}

LoopbackPort::~LoopbackPort() {
  for (int fd : queued_) {
    if (fd >= 0) close(fd);
  }
  if (fd_ >= 0) close(fd_);
}

}  // namespace gradsync::testing
