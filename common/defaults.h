// Defaults the daemon and its clients must agree on without being told:
// where a trainer finds the node's daemon, and where gradsyncctl finds its
// control port. The daemon's other defaults live in daemon/config.h.
//
// Python (client/python/gradsync/daemon.py) keeps a copy it cannot include;
// tests/python/test_defaults.py checks it against this file.
#ifndef GRADSYNC_COMMON_DEFAULTS_H_
#define GRADSYNC_COMMON_DEFAULTS_H_

namespace gradsync {

// gradsyncd's --socket, and the client's when neither the caller nor
// $GRADSYNC_SOCKET names one (the C ABI's GS_DEFAULT_SOCKET).
inline constexpr char kDefaultSocketPath[] = "/tmp/gradsyncd.sock";

// gradsyncd's --listen, and gradsyncctl's --addr when $GRADSYNC_ADDR is unset.
inline constexpr char kDefaultListenAddress[] = "127.0.0.1:7250";

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_DEFAULTS_H_
