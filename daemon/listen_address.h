// Where this daemon can reach its own --listen server (the leader joins its
// own rendezvous there). A server bound to one address is reachable only at
// that address; a wildcard server is reachable on loopback.
#ifndef GRADSYNC_DAEMON_LISTEN_ADDRESS_H_
#define GRADSYNC_DAEMON_LISTEN_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

// `listen` is --listen as given (HOST:PORT, IPv6 hosts bracketed), `port`
// the port actually bound (--listen may say 0). Returns HOST:port for a
// specific host (IPv4, IPv6 or a name), 127.0.0.1:port for 0.0.0.0 or an
// empty host, [::1]:port for [::]. InvalidArgument if `listen` has no
// ":PORT" or an unclosed '['.
absl::StatusOr<std::string> SelfDialAddress(const std::string& listen, int port);

// Where the other nodes of a job reach this daemon's --listen server (they
// probe it when this node falls silent: daemon/cluster/liveness_probe.h):
// --listen's host with the bound `port`; for a wildcard or empty host,
// `gloo_host` (--host, the address the other nodes reach this one at) or
// else loopback. "" for no --listen, a unix: address or no port bound.
std::string AdvertisedListenAddress(const std::string& listen, const std::string& gloo_host,
                                    int port);

// `address` (HOST:PORT) with HOST as a numeric address (IPv6 bracketed):
// itself when it is one, else HOST's first address (a name lookup). "" when
// it is not HOST:PORT or the name does not resolve.
std::string NumericHostPort(const std::string& address);

// True when only this host can reach a server on `listen`: an IPv4 address
// in 127.0.0.0/8, [::1], "localhost" or a unix: address. Wildcards, other
// addresses and other names are not.
bool ListensOnLoopbackOnly(const std::string& listen);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_LISTEN_ADDRESS_H_
