// ReadTokenFile: the job token on disk, refused like ssh refuses a private
// key others may read (a 0644 token file was accepted silently,
// an empty one meant "no token" without a word).
#include "common/token_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "tests/testing/files.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Write(const testing::ScratchDir& dir, const std::string& content, mode_t mode) {
  const std::string path = dir.File("token");
  std::ofstream(path, std::ios::trunc) << content;
  EXPECT_EQ(chmod(path.c_str(), mode), 0);
  return path;
}

TEST(ReadTokenFile, OwnerOnlyFileGivesTheTokenWithoutSurroundingWhitespace) {
  testing::ScratchDir dir;
  absl::StatusOr<std::string> token = ReadTokenFile(Write(dir, "  s3cret-token\n", 0600));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret-token");
  EXPECT_TRUE(ReadTokenFile(Write(dir, "s3cret", 0400)).ok());
}

TEST(ReadTokenFile, GroupOrOtherAccessIsRefusedNamingTheFileAndMode) {
  testing::ScratchDir dir;
  for (mode_t mode : {0644, 0640, 0604, 0660, 0602}) {
    const std::string path = Write(dir, "s3cret", mode);
    const absl::Status st = ReadTokenFile(path).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << std::oct << mode;
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%04o", static_cast<unsigned>(mode));
    EXPECT_THAT(std::string(st.message()), HasSubstr("token file " + path + " has mode " + octal));
    EXPECT_THAT(std::string(st.message()), HasSubstr("chmod 600"));
    EXPECT_THAT(std::string(st.message()), Not(HasSubstr("s3cret")));
  }
}

// What the kubelet writes for a Secret volume: DIR/..2026_11_23_07_00_00.1/token,
// DIR/..data -> that directory, DIR/token -> ..data/token.
std::string SecretVolume(const testing::ScratchDir& dir, mode_t mode) {
  const std::string stamped = dir.File("..2026_11_23_07_00_00.1");
  EXPECT_EQ(mkdir(stamped.c_str(), 0755), 0);
  const std::string file = stamped + "/token";
  std::ofstream(file, std::ios::trunc) << "s3cret\n";
  EXPECT_EQ(chmod(file.c_str(), mode), 0);
  EXPECT_EQ(symlink("..2026_11_23_07_00_00.1", dir.File("..data").c_str()), 0);
  EXPECT_EQ(symlink("..data/token", dir.File("token").c_str()), 0);
  return dir.File("token");
}

TEST(ReadTokenFile, GroupReadableFileInAKubernetesSecretVolumeIsAccepted) {
  for (mode_t mode : {0440, 0640, 0400}) {
    testing::ScratchDir dir;
    absl::StatusOr<std::string> token = ReadTokenFile(SecretVolume(dir, mode));
    ASSERT_TRUE(token.ok()) << std::oct << mode << " " << token.status();
    EXPECT_EQ(*token, "s3cret");
  }
  // The layout, not a symlink alone, is what allows it: ..data pointing
  // at a plain file is no Secret volume.
  testing::ScratchDir dir;
  const std::string real = dir.File("real");
  std::ofstream(real) << "s3cret";
  ASSERT_EQ(chmod(real.c_str(), 0440), 0);
  ASSERT_EQ(symlink("real", dir.File("..data").c_str()), 0);
  ASSERT_EQ(symlink("real", dir.File("token").c_str()), 0);
  const absl::Status st = ReadTokenFile(dir.File("token")).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("token file " + dir.File("token") + " has mode 0440: group or others"));
}

TEST(ReadTokenFile, SecretVolumeStillRefusesOthersAndAWritingGroup) {
  for (mode_t mode : {0444, 0644, 0460, 0404}) {
    testing::ScratchDir dir;
    const std::string path = SecretVolume(dir, mode);
    const absl::Status st = ReadTokenFile(path).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << std::oct << mode;
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%04o", static_cast<unsigned>(mode));
    EXPECT_THAT(std::string(st.message()), HasSubstr("token file " + path + " has mode " + octal));
    EXPECT_THAT(std::string(st.message()), HasSubstr("defaultMode 0440"));
  }
}

TEST(ReadTokenFile, EmptyOrWhitespaceOnlyIsRefused) {
  testing::ScratchDir dir;
  for (const char* content : {"", " \n\t \n"}) {
    const std::string path = Write(dir, content, 0600);
    const absl::Status st = ReadTokenFile(path).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message(), "token file " + path + " is empty or holds only whitespace");
  }
}

TEST(ReadTokenFile, MissingFileIsRefusedNamingIt) {
  testing::ScratchDir dir;
  const absl::Status st = ReadTokenFile(dir.File("absent")).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr(dir.File("absent") + ": cannot open it"));
}

}  // namespace
}  // namespace gradsync
