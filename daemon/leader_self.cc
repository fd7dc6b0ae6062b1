#include "daemon/leader_self.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// A DNS record for a just-started Pod can take a few seconds to appear.
constexpr absl::Duration kResolveFor = absl::Seconds(30);

struct HostPort {
  std::string host;  // without IPv6 brackets
  std::string port;
};

bool SplitHostPort(const std::string& address, HostPort* out) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  *out = {host, address.substr(colon + 1)};
  return true;
}

std::string Numeric(const sockaddr* sa) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof(text));
  }
  return text;
}

std::set<std::string> InterfaceAddresses() {
  std::set<std::string> addresses;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return addresses;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr != nullptr) addresses.insert(Numeric(i->ifa_addr));
  }
  freeifaddrs(list);
  addresses.erase("");
  return addresses;
}

// The host's addresses; retried while the name does not resolve yet.
absl::StatusOr<std::vector<std::string>> Resolve(const std::string& host) {
  const absl::Time deadline = MonotonicNow() + kResolveFor;
  for (;;) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (rc == 0) {
      std::vector<std::string> addresses;
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        addresses.push_back(Numeric(a->ai_addr));
      }
      freeaddrinfo(found);
      return addresses;
    }
    const bool may_appear = rc == EAI_AGAIN || rc == EAI_NONAME;
    if (!may_appear || MonotonicNow() >= deadline) {
      return absl::InvalidArgumentError(
          absl::StrCat("--leader host ", host, " does not resolve: ", gai_strerror(rc)));
    }
    absl::SleepFor(absl::Seconds(1));
  }
}

}  // namespace

absl::Status AdoptLeaderNamingSelf(DaemonConfig* config) {
  if (config->num_nodes <= 1 || config->node_rank != 0 || config->leader.empty() ||
      !config->rendezvous.empty()) {
    return absl::OkStatus();
  }
  const std::string why = absl::StrCat(
      "--node-rank 0 hosts the rendezvous on its --listen ", config->listen,
      ", so its --leader must name this daemon (same host, same port) or be left out; --leader ",
      config->leader);
  HostPort leader, listen;
  if (!SplitHostPort(config->leader, &leader) || leader.host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--leader ", config->leader, " must be HOST:PORT"));
  }
  if (!SplitHostPort(config->listen, &listen) || listen.port != leader.port) {
    return absl::InvalidArgumentError(
        absl::StrCat(why, " names port ", leader.port, ", not --listen's"));
  }
  bool self = leader.host == listen.host || (!config->host.empty() && leader.host == config->host);
  std::vector<std::string> resolved;
  if (!self) {
    absl::StatusOr<std::vector<std::string>> addresses = Resolve(leader.host);
    if (!addresses.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(why, ": ", addresses.status().message()));
    }
    resolved = std::move(*addresses);
    const std::set<std::string> mine = InterfaceAddresses();
    for (const std::string& a : resolved) self = self || mine.count(a) > 0;
  }
  if (!self) {
    return absl::InvalidArgumentError(absl::StrCat(why, " names another host (it resolves to ",
                                                   absl::StrJoin(resolved, ", "),
                                                   ", none of them this host's)"));
  }
  spdlog::info("event=leader_is_self leader={} listen={}", LogToken(config->leader),
               LogToken(config->listen));
  config->leader.clear();
  return absl::OkStatus();
}

}  // namespace gradsync
