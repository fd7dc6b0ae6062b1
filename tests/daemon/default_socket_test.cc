// The per-user socket directory: created 0700, and refused when someone
// else could have prepared it (a symlink, another owner, a looser mode).
#include "common/default_socket.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

TEST(EnsurePrivateDirectoryTest, CreatesAMissingDirectory0700) {
  ScratchDir scratch;
  const std::string dir = scratch.File("gradsync");
  ASSERT_TRUE(EnsurePrivateDirectory(dir).ok());
  struct stat st;
  ASSERT_EQ(lstat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_TRUE(EnsurePrivateDirectory(dir).ok()) << "an existing sound one is kept";
}

TEST(EnsurePrivateDirectoryTest, RefusesASymlinkALooseModeAndAnotherOwner) {
  ScratchDir scratch;
  const std::string target = scratch.File("target");
  ASSERT_EQ(mkdir(target.c_str(), 0700), 0);
  const std::string link = scratch.File("link");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  absl::Status st = EnsurePrivateDirectory(link);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr(link + ": it is a symbolic link"));

  const std::string loose = scratch.File("loose");
  ASSERT_EQ(mkdir(loose.c_str(), 0700), 0);
  ASSERT_EQ(chmod(loose.c_str(), 0777), 0);
  st = EnsurePrivateDirectory(loose);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("its mode is 0777, not 0700"));

  if (geteuid() != 0) return;  // only root can give a directory away
  const std::string theirs = scratch.File("theirs");
  ASSERT_EQ(mkdir(theirs.c_str(), 0700), 0);
  ASSERT_EQ(chown(theirs.c_str(), 48611, 48611), 0);
  st = EnsurePrivateDirectory(theirs);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("it belongs to uid 48611, not to uid 0"));
}

TEST(DefaultSocketTest, DaemonUsesRuntimeDirectoryElseThePerUserOne) {
  unsetenv("RUNTIME_DIRECTORY");
  unsetenv("XDG_RUNTIME_DIR");
  const std::string per_user = "/tmp/gradsync-" + std::to_string(geteuid());
  EXPECT_EQ(PerUserSocketDirectory(), per_user);
  EXPECT_EQ(DaemonDefaultSocketPath(), per_user + "/gradsyncd.sock");
  setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  EXPECT_EQ(DaemonDefaultSocketPath(), "/run/user/4242/gradsync/gradsyncd.sock");
  setenv("RUNTIME_DIRECTORY", "/run/gradsync:/run/other", 1);
  EXPECT_EQ(DaemonDefaultSocketPath(), "/run/gradsync/gradsyncd.sock");
  unsetenv("RUNTIME_DIRECTORY");
  unsetenv("XDG_RUNTIME_DIR");
}

}  // namespace
}  // namespace gradsync
