// Defaults the daemon and its clients must agree on without being told:
// where a trainer finds the node's daemon, and where gradsyncctl finds its
// control port. The daemon's other defaults live in daemon/config.h.
//
// Python (client/python/gradsync/daemon.py) keeps a copy it cannot include;
// tests/python/test_defaults.py checks it against this file.
#ifndef GRADSYNC_COMMON_DEFAULTS_H_
#define GRADSYNC_COMMON_DEFAULTS_H_

namespace gradsync {

// The socket of a system-wide gradsyncd (systemd's RuntimeDirectory=gradsync,
// the Kubernetes sidecar's shared volume); the C ABI's GS_DEFAULT_SOCKET.
// Which socket a daemon or client uses when told none: default_socket.h.
inline constexpr char kSystemSocketPath[] = "/run/gradsync/gradsyncd.sock";

// The socket's file name in a per-user or $RUNTIME_DIRECTORY directory.
inline constexpr char kSocketFileName[] = "gradsyncd.sock";

// gradsyncd's --listen, and gradsyncctl's --addr when $GRADSYNC_ADDR is unset.
inline constexpr char kDefaultListenAddress[] = "127.0.0.1:7250";

// Bucket caps in MiB (--bucket-cap-mb, --first-bucket-cap-mb): DDP's
// defaults. The one definition: DaemonConfig and BucketCaps start from it.
inline constexpr int kDefaultBucketCapMib = 25;
inline constexpr int kDefaultFirstBucketCapMib = 1;

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_DEFAULTS_H_
