// ReadTokenFile: the job token on disk, refused like ssh refuses a private
// key others may read (issue 11: a 0644 token file was accepted silently,
// an empty one meant "no token" without a word).
#include "common/token_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

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
