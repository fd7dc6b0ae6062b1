#include "daemon/rendezvous_address.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "daemon/host_syntax.h"

namespace gradsync {

absl::StatusOr<EtcdRendezvousAddress> ParseEtcdRendezvous(const std::string& value) {
  constexpr absl::string_view kScheme = "etcd://";
  const auto bad = [&value](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rendezvous ", value, " ", why,
                     " (expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX, or leave it empty for "
                     "the rendezvous embedded in node 0's daemon)"));
  };
  if (!absl::StartsWith(value, kScheme)) return bad("does not start with etcd://");
  const std::string rest = value.substr(kScheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos || slash + 1 == rest.size()) return bad("names no PREFIX");
  EtcdRendezvousAddress address;
  address.prefix = rest.substr(slash + 1);
  if (address.prefix.back() == '/') address.prefix.pop_back();
  if (address.prefix.empty()) return bad("names no PREFIX");
  for (absl::string_view endpoint : absl::StrSplit(rest.substr(0, slash), ',')) {
    if (endpoint.empty() || endpoint.front() == ':') return bad("has an endpoint without a host");
    RETURN_IF_ERROR(CheckHostPort("--rendezvous", std::string(endpoint)));
    address.endpoints.emplace_back(endpoint);
  }
  return address;
}

}  // namespace gradsync
