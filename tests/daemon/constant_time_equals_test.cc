// The job token comparison: equal only when every byte and the length match,
// wherever the difference lies.
#include <string>

#include "daemon/auth/call_auth.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

TEST(ConstantTimeEquals, EqualStringsAreEqual) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("tok-5e1f0c2a", "tok-5e1f0c2a"));
}

TEST(ConstantTimeEquals, OneDifferentByteAnywhereMakesThemDifferent) {
  const std::string token = "tok-5e1f0c2a9b7d4e3f8a6c1b0d2e4f6a8c";
  for (size_t at = 0; at < token.size(); ++at) {
    std::string other = token;
    other[at] ^= 0x01;
    EXPECT_FALSE(ConstantTimeEquals(token, other)) << "byte " << at;
    EXPECT_FALSE(ConstantTimeEquals(other, token)) << "byte " << at;
  }
}

TEST(ConstantTimeEquals, APrefixOrAnExtensionIsNotEqual) {
  EXPECT_FALSE(ConstantTimeEquals("token", "token2"));
  EXPECT_FALSE(ConstantTimeEquals("token2", "token"));
  EXPECT_FALSE(ConstantTimeEquals("", "t"));
  // Trailing NULs do not make a shorter string equal to a longer one.
  EXPECT_FALSE(ConstantTimeEquals(std::string("tok\0", 4), "tok"));
}

}  // namespace
}  // namespace gradsync
