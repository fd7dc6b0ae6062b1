// Who may attach: root, the daemon's user, and members of --shm-group
// (primary or supplementary); everyone else is refused by name.
#include "daemon/trainer_admission.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

PeerCredentials Peer(uid_t uid, gid_t gid, std::vector<gid_t> groups = {}) {
  PeerCredentials p;
  p.pid = 4242;
  p.uid = uid;
  p.gid = gid;
  p.groups = std::move(groups);
  return p;
}

constexpr uid_t kDaemon = 1500;
constexpr gid_t kGroup = 1600;
constexpr gid_t kNoGroup = static_cast<gid_t>(-1);

TEST(TrainerAdmissionTest, AdmitsRootAndTheDaemonsUser) {
  EXPECT_TRUE(AdmitTrainer(Peer(0, 0), kDaemon, kNoGroup).ok());
  EXPECT_TRUE(AdmitTrainer(Peer(kDaemon, 9), kDaemon, kNoGroup).ok());
}

TEST(TrainerAdmissionTest, AdmitsShmGroupMembersOnlyWhenAGroupIsConfigured) {
  EXPECT_TRUE(AdmitTrainer(Peer(2000, kGroup), kDaemon, kGroup).ok());
  EXPECT_TRUE(AdmitTrainer(Peer(2000, 7, {5, kGroup}), kDaemon, kGroup).ok());
  EXPECT_EQ(AdmitTrainer(Peer(2000, kGroup), kDaemon, kNoGroup).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(TrainerAdmissionTest, RefusesAnyoneElseNamingUidAndPid) {
  const absl::Status st = AdmitTrainer(Peer(2000, 7, {5}), kDaemon, kGroup);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(st.message(), HasSubstr("refused uid 2000"));
  EXPECT_THAT(st.message(), HasSubstr("pid 4242"));
  EXPECT_THAT(st.message(), HasSubstr("members of --shm-group gid 1600"));
}

}  // namespace
}  // namespace gradsync
