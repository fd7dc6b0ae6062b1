// Whether an address flag is well formed, checked at start without
// resolving anything: --host (a HOST) and --listen, --leader,
// --metrics-listen (HOST:PORT). A HOST is an IPv4 dotted quad, an IPv6
// address (bracketed inside HOST:PORT) or a DNS name; something that looks
// like an IPv4 address but is not one (256.1.1.1, 1.2.3) is refused rather
// than handed to the resolver as a name.
#ifndef GRADSYNC_DAEMON_HOST_SYNTAX_H_
#define GRADSYNC_DAEMON_HOST_SYNTAX_H_

#include <string>

#include "absl/status/status.h"

namespace gradsync {

// `flag` ("--host") and `value` name the culprit in the error.
absl::Status CheckHost(const std::string& flag, const std::string& value);
// HOST:PORT with PORT in [0, 65535]; an empty HOST (every address) is fine.
absl::Status CheckHostPort(const std::string& flag, const std::string& value);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_HOST_SYNTAX_H_
