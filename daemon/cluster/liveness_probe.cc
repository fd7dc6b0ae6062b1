#include "daemon/cluster/liveness_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// HOST and PORT of "HOST:PORT" ("[V6]:PORT"), or nullopt.
std::optional<std::pair<std::string, std::string>> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return std::nullopt;
  std::string host = address.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, address.substr(colon + 1));
}

ProbeOutcome FromErrno(int error) {
  if (error == 0) return {Liveness::kListening, "connected"};
  if (error == ECONNREFUSED) return {Liveness::kRefused, "connection refused"};
  return {Liveness::kUnknown, std::strerror(error)};
}

// Starts a non-blocking connect; the socket (-1 when decided already) and,
// when decided, the outcome.
int StartConnect(const std::string& address, ProbeOutcome* outcome) {
  const auto parts = SplitHostPort(address);
  if (!parts) {
    *outcome = {Liveness::kUnknown, absl::StrCat("'", address, "' is not HOST:PORT")};
    return -1;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  // Never a name lookup, which no timeout bounds: daemons advertise numeric
  // addresses (daemon/listen_address.h).
  hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(parts->first.c_str(), parts->second.c_str(), &hints, &found);
      rc != 0 || found == nullptr) {
    *outcome = {Liveness::kUnknown,
                absl::StrCat("'", address, "' is not a numeric address: ", gai_strerror(rc))};
    return -1;
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *outcome = FromErrno(errno);
    freeaddrinfo(found);
    return -1;
  }
  const int rc = connect(fd, found->ai_addr, found->ai_addrlen);
  const int error = rc == 0 ? 0 : errno;
  freeaddrinfo(found);
  if (error == EINPROGRESS) return fd;
  *outcome = FromErrno(error);
  close(fd);
  return -1;
}

}  // namespace

std::vector<ProbeOutcome> ProbeListeners(const std::vector<std::string>& addresses,
                                         absl::Duration timeout) {
  std::vector<ProbeOutcome> outcomes(addresses.size());
  std::vector<pollfd> pending;
  std::vector<size_t> index;  // pending[i] probes addresses[index[i]]
  for (size_t i = 0; i < addresses.size(); ++i) {
    const int fd = StartConnect(addresses[i], &outcomes[i]);
    if (fd < 0) continue;
    pending.push_back(pollfd{fd, POLLOUT, 0});
    index.push_back(i);
  }
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  size_t open = pending.size();
  while (open > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    const int ready = poll(pending.data(), pending.size(), static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    for (size_t i = 0; i < pending.size(); ++i) {
      if (pending[i].fd < 0 || pending[i].revents == 0) continue;
      int error = 0;
      socklen_t len = sizeof(error);
      if (getsockopt(pending[i].fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      outcomes[index[i]] = FromErrno(error);
      close(pending[i].fd);
      pending[i].fd = -1;  // poll skips negative descriptors
      --open;
    }
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    if (pending[i].fd < 0) continue;
    outcomes[index[i]] = {
        Liveness::kUnknown,
        absl::StrCat("timed out after ", absl::ToInt64Milliseconds(timeout), " ms")};
    close(pending[i].fd);
  }
  return outcomes;
}

std::string RefusesConnections(const std::string& address) {
  return absl::StrCat("its daemon at ", address, " refuses connections");
}

BackgroundProber::BackgroundProber(absl::Duration timeout) : timeout_(timeout) {}

BackgroundProber::~BackgroundProber() {
  std::thread thread;
  {
    MonotonicMutexLock lock(&mu_);
    stop_ = true;
    queue_.clear();
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

void BackgroundProber::Probe(std::vector<std::string> addresses, Done done) {
  MonotonicMutexLock lock(&mu_);
  if (stop_) return;
  queue_.emplace_back(std::move(addresses), std::move(done));
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
}

void BackgroundProber::Run() {
  while (true) {
    std::pair<std::vector<std::string>, Done> batch;
    {
      MonotonicMutexLock lock(&mu_);
      auto ready = [this] {
        mu_.AssertReaderHeld();
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    batch.second(ProbeListeners(batch.first, timeout_));
  }
}

}  // namespace gradsync
