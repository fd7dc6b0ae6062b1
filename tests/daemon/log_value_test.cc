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

}  // namespace
}  // namespace gradsync
