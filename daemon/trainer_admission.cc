#include "daemon/trainer_admission.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

absl::Status AdmitTrainer(const PeerCredentials& peer, uid_t daemon_uid, gid_t shm_group) {
  const bool with_group = shm_group != static_cast<gid_t>(-1);
  if (peer.uid == 0 || peer.uid == daemon_uid || (with_group && peer.InGroup(shm_group))) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "refused ", DescribePeer(peer), ": this gradsyncd (", DescribeUser(daemon_uid),
      ") serves root, its own user",
      with_group ? absl::StrCat(" and members of --shm-group gid ", shm_group) : std::string(),
      " only"));
}

}  // namespace gradsync
