// LogValue keeps a user-given value inside its key=value field, on one line.
#include "common/log_value.h"

#include <gtest/gtest.h>

namespace gradsync {
namespace {

TEST(LogValueTest, QuotesAndEscapesWhatCouldEndTheFieldOrLine) {
  EXPECT_EQ(LogValue("layer1.weight"), "\"layer1.weight\"");
  EXPECT_EQ(LogValue("a b"), "\"a b\"");
  EXPECT_EQ(LogValue("x\" event=forged"), "\"x\\\" event=forged\"");
  EXPECT_EQ(LogValue("one\ntwo\r\tthree"), "\"one\\ntwo\\r\\tthree\"");
  EXPECT_EQ(LogValue("back\\slash"), "\"back\\\\slash\"");
  EXPECT_EQ(LogValue(std::string("nul\0zz\a", 7)), "\"nul\\x00zz\\x07\"");
  EXPECT_EQ(LogValue(""), "\"\"");
}

TEST(LogValueTest, TokensStayPlainAndAnythingElseIsQuotedAndEscaped) {
  EXPECT_EQ(LogToken("default"), "default");
  EXPECT_EQ(LogToken("/var/log/gradsync/trace-job.1.json"), "/var/log/gradsync/trace-job.1.json");
  EXPECT_EQ(LogToken("node-0@host:7250"), "node-0@host:7250");
  EXPECT_EQ(LogToken("my job"), "\"my job\"");
  EXPECT_EQ(LogToken("a\" event=forged"), "\"a\\\" event=forged\"");
  EXPECT_EQ(LogToken("x=y"), "\"x=y\"");
  EXPECT_EQ(LogToken("line\nbreak"), "\"line\\nbreak\"");
  EXPECT_EQ(LogToken(""), "\"\"");
}

}  // namespace
}  // namespace gradsync
