// The daemon's side of the local trust boundary: who may attach over the
// unix socket, decided on the kernel's word (SO_PEERCRED / SO_PEERGROUPS),
// not on the socket file's mode alone. Admitted: root, the daemon's own
// user, and, with --shm-group, members of that group (primary or
// supplementary) — exactly who can map the daemon's segments.
#ifndef GRADSYNC_DAEMON_TRAINER_ADMISSION_H_
#define GRADSYNC_DAEMON_TRAINER_ADMISSION_H_

#include <sys/types.h>

#include "absl/status/status.h"
#include "common/peer_credentials.h"

namespace gradsync {

// OK, or PERMISSION_DENIED naming the peer's uid and pid and the policy.
// `shm_group` (gid_t)-1: no group is admitted.
absl::Status AdmitTrainer(const PeerCredentials& peer, uid_t daemon_uid, gid_t shm_group);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_TRAINER_ADMISSION_H_
