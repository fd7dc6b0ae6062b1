// Which unix socket a daemon listens on, and a trainer connects to, when
// neither is told one (--socket, $GRADSYNC_SOCKET). Always in a directory
// only the daemon's user can write: a world-writable one (/tmp) would let
// anyone bind the path first or replace the socket.
//
//   daemon:  $RUNTIME_DIRECTORY/gradsyncd.sock under systemd, else
//            PerUserSocketDirectory()/gradsyncd.sock
//   trainer: kSystemSocketPath when that socket exists, else
//            PerUserSocketDirectory()/gradsyncd.sock
//
// Python's copy: client/python/gradsync/daemon.py (default_socket()).
#ifndef GRADSYNC_COMMON_DEFAULT_SOCKET_H_
#define GRADSYNC_COMMON_DEFAULT_SOCKET_H_

#include <string>

#include "absl/status/status.h"

namespace gradsync {

// $XDG_RUNTIME_DIR/gradsync when that is set (an absolute path), else
// /tmp/gradsync-<euid>.
std::string PerUserSocketDirectory();

std::string DaemonDefaultSocketPath();
std::string ClientDefaultSocketPath();

// Makes `dir` a directory only we can enter: creates it 0700 if missing;
// refuses (FAILED_PRECONDITION naming the directory and the problem) one that
// is a symlink, not a directory, owned by another user, or open to others.
absl::Status EnsurePrivateDirectory(const std::string& dir);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_DEFAULT_SOCKET_H_
