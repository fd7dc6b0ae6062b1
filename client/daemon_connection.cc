#include "client/daemon_connection.h"

#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/defaults.h"
#include "common/monotonic.h"
#include "common/refusal_note.h"
#include "common/status_code.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

constexpr char kDaemonUidEnv[] = "GRADSYNC_DAEMON_UID";

// Whether `st` can only have been set up by root: owned by root and
// writable by nobody else.
bool RootControlled(const struct stat& st) { return st.st_uid == 0 && (st.st_mode & 022) == 0; }

// The owner of /run/gradsync when it holds `socket_path` and only root could
// have created it (its parent, /run, is root's alone).
std::optional<uid_t> SystemSocketDirOwner(const std::string& socket_path) {
  if (socket_path != kSystemSocketPath) return std::nullopt;
  const std::string dir = socket_path.substr(0, socket_path.rfind('/'));
  const std::string parent = dir.substr(0, dir.rfind('/'));
  struct stat d, p;
  if (lstat(dir.c_str(), &d) != 0 || !S_ISDIR(d.st_mode) || (d.st_mode & 022) != 0) {
    return std::nullopt;
  }
  if (lstat(parent.c_str(), &p) != 0 || !S_ISDIR(p.st_mode) || !RootControlled(p)) {
    return std::nullopt;
  }
  return d.st_uid;
}

absl::StatusOr<uid_t> ParseUser(const std::string& text) {
  uint32_t uid = 0;
  if (absl::SimpleAtoi(text, &uid)) return static_cast<uid_t>(uid);
  passwd pw{};
  passwd* found = nullptr;
  char buf[1024];
  if (getpwnam_r(text.c_str(), &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return found->pw_uid;
  }
  return MakeError(v1::INVALID_ARGUMENT, absl::StrCat("$", kDaemonUidEnv, "='", text,
                                                      "' is neither a uid nor a user name"));
}

// connect(2) to the unix socket; errno on failure.
int ConnectOnce(const std::string& path, int* fd_out) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

// Waits for the daemon's first bytes without taking them: gRPC's SETTINGS
// frame on a served connection (gRPC then reads it), or a note saying why
// the daemon turned this connection away (common/refusal_note.h), returned
// as its error. A connection closed without a word (an older daemon) is
// left to gRPC to report.
std::optional<absl::Status> DaemonRefusal(int fd, const std::string& socket_path,
                                          const PeerCredentials& daemon, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - MonotonicNow();
    pollfd p{fd, POLLIN, 0};
    const int n =
        poll(&p, 1, static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(left))));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      return MakeError(
          v1::TIMEOUT,
          absl::StrCat("attach timed out waiting for gradsyncd at ", socket_path, " (",
                       DescribePeer(daemon),
                       "): connected, but the daemon sent nothing (stopped, overloaded or out of "
                       "file descriptors? see its log)"));
    }
    break;
  }
  char buf[kMaxRefusalNoteBytes];
  const ssize_t got = recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
  if (got <= 0) return std::nullopt;
  std::optional<absl::Status> note = ParseRefusalNote(absl::string_view(buf, got));
  if (!note) return std::nullopt;
  return MakeError(CodeOf(*note),
                   absl::StrCat("gradsyncd at ", socket_path, " (", DescribePeer(daemon),
                                ") refused this trainer: ", note->message()));
}

}  // namespace

absl::StatusOr<std::vector<uid_t>> TrustedDaemonUids(const std::string& socket_path) {
  std::vector<uid_t> uids = {0, geteuid()};
  if (const char* env = std::getenv(kDaemonUidEnv); env && *env) {
    ASSIGN_OR_RETURN(const uid_t named, ParseUser(env));
    uids.push_back(named);
  }
  if (std::optional<uid_t> owner = SystemSocketDirOwner(socket_path)) uids.push_back(*owner);
  std::sort(uids.begin(), uids.end());
  uids.erase(std::unique(uids.begin(), uids.end()), uids.end());
  return uids;
}

absl::StatusOr<DaemonConnection> ConnectToDaemon(const std::string& socket_path,
                                                 absl::Time deadline) {
  ASSIGN_OR_RETURN(const std::vector<uid_t> trusted, TrustedDaemonUids(socket_path));
  if (socket_path.size() >= sizeof(sockaddr_un::sun_path)) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat("socket path ", socket_path, " is longer than ",
                                  sizeof(sockaddr_un::sun_path) - 1, " bytes"));
  }
  int fd = -1;
  while (true) {
    const int err = ConnectOnce(socket_path, &fd);
    if (err == 0) break;
    // Nobody listens yet: the daemon may still be starting.
    const bool retry = err == ENOENT || err == ECONNREFUSED || err == EAGAIN;
    if (!retry || MonotonicNow() >= deadline) {
      return MakeError(
          v1::UNAVAILABLE,
          absl::StrCat("cannot connect to gradsyncd at ", socket_path, " (", std::strerror(err),
                       "): is the daemon running? (start it with `gradsyncd --socket ", socket_path,
                       "`, or set GRADSYNC_SOCKET)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);
  if (!peer.ok()) {
    close(fd);
    return MakeError(v1::UNAVAILABLE,
                     absl::StrCat("gradsyncd at ", socket_path, ": ", peer.status().message()));
  }
  if (std::find(trusted.begin(), trusted.end(), peer->uid) == trusted.end()) {
    close(fd);
    std::vector<std::string> whom;
    for (uid_t uid : trusted) whom.push_back(DescribeUser(uid));
    return MakeError(
        v1::UNAVAILABLE,
        absl::StrCat("refusing the daemon at ", socket_path, ": it runs as ", DescribePeer(*peer),
                     ", and this trainer (uid ", geteuid(), ") trusts only ",
                     absl::StrJoin(whom, ", "), " (name the daemon's user in $", kDaemonUidEnv,
                     " if it is the right one)"));
  }
  if (std::optional<absl::Status> refused = DaemonRefusal(fd, socket_path, *peer, deadline)) {
    close(fd);
    return *std::move(refused);
  }
  return DaemonConnection{fd, *std::move(peer)};
}

}  // namespace gradsync
