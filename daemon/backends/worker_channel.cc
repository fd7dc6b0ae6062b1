#include "daemon/backends/worker_channel.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/monotonic.h"
#include "common/status_code.h"

namespace gradsync {

absl::StatusOr<std::pair<WorkerChannel, WorkerChannel>> WorkerChannel::CreatePair() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) {
    return MakeError(v1::INTERNAL, absl::StrCat("socketpair: ", std::strerror(errno)));
  }
  return std::make_pair(WorkerChannel(fds[0]), WorkerChannel(fds[1]));
}

WorkerChannel& WorkerChannel::operator=(WorkerChannel&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

void WorkerChannel::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status WorkerChannel::Send(const google::protobuf::MessageLite& message) {
  const std::string bytes = message.SerializeAsString();
  if (bytes.size() > kMaxRecordBytes) {
    return MakeError(v1::INTERNAL, absl::StrCat("worker message of ", bytes.size(),
                                                " bytes exceeds ", kMaxRecordBytes));
  }
  while (true) {
    // MSG_NOSIGNAL: a dead worker is an error here, not a SIGPIPE.
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(bytes.size())) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    return MakeError(v1::UNAVAILABLE, absl::StrCat("worker channel closed: ",
                                                   n < 0 ? std::strerror(errno) : "short write"));
  }
}

absl::Status WorkerChannel::Receive(google::protobuf::MessageLite* message, absl::Time deadline) {
  // Not zeroed: recv writes what it reads, so a small message touches one
  // page of the megabyte, not all 256 (each a page fault, at start-up).
  if (buffer_ == nullptr) buffer_.reset(new char[kMaxRecordBytes]);
  while (true) {
    int wait_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - MonotonicNow();
      wait_ms =
          left <= absl::ZeroDuration()
              ? 0
              : static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    }
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return MakeError(v1::INTERNAL, absl::StrCat("poll: ", std::strerror(errno)));
    if (ready == 0) {
      if (MonotonicNow() >= deadline) {
        return MakeError(v1::TIMEOUT, "no answer from the worker before the deadline");
      }
      continue;
    }
    const ssize_t n = ::recv(fd_, buffer_.get(), kMaxRecordBytes, MSG_TRUNC);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      return MakeError(v1::UNAVAILABLE, absl::StrCat("worker channel: ", std::strerror(errno)));
    }
    // Every message has a oneof set, so no record is empty: 0 is end of file.
    if (n == 0) return MakeError(v1::UNAVAILABLE, "worker channel closed");
    if (static_cast<size_t>(n) > kMaxRecordBytes || !message->ParseFromArray(buffer_.get(), n)) {
      return MakeError(v1::INTERNAL, absl::StrCat("malformed worker message of ", n, " bytes"));
    }
    return absl::OkStatus();
  }
}

}  // namespace gradsync
