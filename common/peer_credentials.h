// Who is on the other end of a connected unix socket, as the kernel saw it
// at connect() time (SO_PEERCRED, SO_PEERGROUPS): nothing the peer says
// about itself. Both directions of the local trust boundary use it: the
// client checks the daemon, the daemon checks trainers.
#ifndef GRADSYNC_COMMON_PEER_CREDENTIALS_H_
#define GRADSYNC_COMMON_PEER_CREDENTIALS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradsync {

struct PeerCredentials {
  pid_t pid = 0;  // 0 when the peer is in a pid namespace we cannot see
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups

  // Whether `group` is the peer's primary or a supplementary group.
  bool InGroup(gid_t group) const;
};

// Reads the peer of the connected unix socket `fd`.
absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd);

// "uid 1000 (alice) pid 4242": the user's name where it has one.
std::string DescribeUser(uid_t uid);
std::string DescribePeer(const PeerCredentials& peer);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_PEER_CREDENTIALS_H_
