#include "common/peer_credentials.h"

#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsync {

bool PeerCredentials::InGroup(gid_t group) const {
  return gid == group || std::find(groups.begin(), groups.end(), group) != groups.end();
}

absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED: ", std::strerror(errno)));
  }
  PeerCredentials peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  // SO_PEERGROUPS answers ERANGE with the size it needs.
  std::vector<gid_t> groups(16);
  while (true) {
    len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) break;
    if (errno != ERANGE || len <= groups.size() * sizeof(gid_t)) {
      return absl::InternalError(absl::StrCat("SO_PEERGROUPS: ", std::strerror(errno)));
    }
    groups.resize(len / sizeof(gid_t));
  }
  groups.resize(len / sizeof(gid_t));
  peer.groups = std::move(groups);
  return peer;
}

std::string DescribeUser(uid_t uid) {
  passwd pw{};
  passwd* found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) {
    return absl::StrCat("uid ", uid, " (", found->pw_name, ")");
  }
  return absl::StrCat("uid ", uid);
}

std::string DescribePeer(const PeerCredentials& peer) {
  return absl::StrCat(DescribeUser(peer.uid), " pid ", peer.pid);
}

}  // namespace gradsync
