#include "daemon/listen_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// 0.0.0.0, [::] or an empty host: the server listens on every address.
bool IsWildcardHost(const std::string& host) {
  in_addr v4;
  if (host.empty() || (inet_pton(AF_INET, host.c_str(), &v4) == 1 && v4.s_addr == INADDR_ANY)) {
    return true;
  }
  in6_addr v6;
  return host.size() >= 2 && host.front() == '[' && host.back() == ']' &&
         inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) == 1 &&
         IN6_IS_ADDR_UNSPECIFIED(&v6);
}

}  // namespace

absl::StatusOr<std::string> SelfDialAddress(const std::string& listen, int port) {
  // The port follows the last ':' (an IPv6 host is bracketed, so its own
  // colons come before it).
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--listen ", listen, " is not HOST:PORT"));
  }
  const std::string host = listen.substr(0, colon);
  const bool bracketed = !host.empty() && host.front() == '[';
  if (bracketed && (host.size() < 2 || host.back() != ']')) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen ", listen, ": an IPv6 host must be [ADDRESS]:PORT"));
  }
  // Wildcards in any spelling (0.0.0.0, [::], [0:0::0]): loopback of the
  // same family is one of the addresses such a server listens on.
  in_addr v4;
  if (host.empty() || (inet_pton(AF_INET, host.c_str(), &v4) == 1 && v4.s_addr == INADDR_ANY)) {
    return absl::StrCat("127.0.0.1:", port);
  }
  in6_addr v6;
  if (bracketed && inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) == 1 &&
      IN6_IS_ADDR_UNSPECIFIED(&v6)) {
    return absl::StrCat("[::1]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::string AdvertisedListenAddress(const std::string& listen, const std::string& gloo_host,
                                    int port) {
  if (listen.empty() || port <= 0 || listen.rfind("unix:", 0) == 0) return "";
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return "";
  const std::string host = listen.substr(0, colon);
  if (!IsWildcardHost(host)) return absl::StrCat(host, ":", port);
  if (gloo_host.empty()) return SelfDialAddress(listen, port).value_or("");
  // An IPv6 --host is bare; HOST:PORT needs it bracketed.
  const bool bare_v6 = gloo_host.find(':') != std::string::npos && gloo_host.front() != '[';
  return absl::StrCat(bare_v6 ? "[" : "", gloo_host, bare_v6 ? "]" : "", ":", port);
}

std::string NumericHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return "";
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return "";
  char numeric[INET6_ADDRSTRLEN] = {};
  const int rc = getnameinfo(found->ai_addr, found->ai_addrlen, numeric, sizeof(numeric), nullptr,
                             0, NI_NUMERICHOST);
  const bool v6 = found->ai_family == AF_INET6;
  freeaddrinfo(found);
  if (rc != 0) return "";
  return absl::StrCat(v6 ? "[" : "", numeric, v6 ? "]" : "", address.substr(colon));
}

bool ListensOnLoopbackOnly(const std::string& listen) {
  if (listen.rfind("unix:", 0) == 0) return true;
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return false;
  std::string host = listen.substr(0, colon);
  if (host == "localhost") return true;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    in6_addr v6;
    return inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &v6) == 1 &&
           IN6_IS_ADDR_LOOPBACK(&v6);
  }
  in_addr v4;
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

}  // namespace gradsync
