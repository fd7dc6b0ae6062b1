#include "daemon/host_syntax.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradsync {
namespace {

bool IsIpv4(const std::string& host) {
  in_addr v4;
  return inet_pton(AF_INET, host.c_str(), &v4) == 1;
}

bool IsIpv6(const std::string& host) {
  in6_addr v6;
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

// RFC 1123 names (underscores tolerated: some hosts have them), at most 253
// bytes, labels of 1..63 bytes not starting or ending with '-'. A name whose
// last label is all digits would read as an IPv4 address: refused.
bool IsDnsName(const std::string& host) {
  std::string name = host;
  if (!name.empty() && name.back() == '.') name.pop_back();
  if (name.empty() || name.size() > 253) return false;
  const std::vector<std::string> labels = absl::StrSplit(name, '.');
  for (const std::string& label : labels) {
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
    }
  }
  const std::string& last = labels.back();
  return !std::all_of(last.begin(), last.end(),
                      [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); });
}

}  // namespace

absl::Status CheckHost(const std::string& flag, const std::string& value) {
  std::string host = value;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    if (IsIpv6(host)) return absl::OkStatus();
  } else if (IsIpv4(host) || IsIpv6(host) || IsDnsName(host)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", value,
                   " is not a valid host: give an IPv4 address, an IPv6 address or a DNS name"));
}

absl::Status CheckHostPort(const std::string& flag, const std::string& value) {
  const size_t colon = value.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", value, " must be HOST:PORT (port in [0, 65535])"));
  }
  const std::string host = value.substr(0, colon);
  if (host.empty()) return absl::OkStatus();  // every address
  // An IPv6 host is bracketed: its own colons come before the port's.
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", value, ": an IPv6 host must be [ADDRESS]:PORT"));
  }
  if (absl::Status st = CheckHost(flag, host); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", value, ": host ", host,
                                                   " is not an IPv4 address, an IPv6 address "
                                                   "or a DNS name"));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
