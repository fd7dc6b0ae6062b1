// A trainer's local rank comes from gs_connect_options.local_rank or
// $LOCAL_RANK; anything but a plain rank is refused, naming the value and
// where it came from, before any daemon is contacted.
#include "client/local_rank.h"

#include <cstdlib>
#include <string>

#include "client/gradsync.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;

TEST(ResolveLocalRank, TheOptionWinsOverTheEnvironment) {
  EXPECT_EQ(*ResolveLocalRank(3, "1"), 3);
  EXPECT_EQ(*ResolveLocalRank(0, "7"), 0);
}

TEST(ResolveLocalRank, MinusOneReadsLocalRankAndDefaultsToZero) {
  EXPECT_EQ(*ResolveLocalRank(-1, "5"), 5);
  EXPECT_EQ(*ResolveLocalRank(-1, "0"), 0);
  EXPECT_EQ(*ResolveLocalRank(-1, nullptr), 0);
  EXPECT_EQ(*ResolveLocalRank(-1, ""), 0);
  EXPECT_EQ(*ResolveLocalRank(-1, "2147483647"), 2147483647);
}

TEST(ResolveLocalRank, ANegativeOptionOtherThanMinusOneIsRefusedNamingIt) {
  absl::StatusOr<int> rank = ResolveLocalRank(-5, "1");
  ASSERT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank.status().message(), HasSubstr("gs_connect_options.local_rank is -5"));
}

TEST(ResolveLocalRank, AnythingButADecimalRankInTheEnvironmentIsRefusedNamingIt) {
  // Each of these was once read by atoi as some rank: abc and 0x1 as 0, 1abc
  // and " 1" as 1, 4294967297 wrapped to 1.
  for (const char* bad : {"abc", "0x1", "1abc", " 1", "1 ", "+1", "-1", "4294967297", "1.0"}) {
    absl::StatusOr<int> rank = ResolveLocalRank(-1, bad);
    ASSERT_EQ(rank.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_THAT(rank.status().message(), HasSubstr(std::string("$LOCAL_RANK is '") + bad + "'"));
  }
}

// Through the C ABI: refused before any socket is touched, so no daemon runs.
TEST(ConnectLocalRank, GsConnectRefusesANegativeOptionNamingIt) {
  gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
  o.socket_path = "/nonexistent/gradsync.sock";
  o.local_rank = -5;
  gs_client* c = nullptr;
  EXPECT_EQ(gs_connect(&o, &c), GS_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(c), HasSubstr("local_rank is -5"));
  gs_close(c);
}

TEST(ConnectLocalRank, GsConnectRefusesAnUnparsableLocalRankVariableNamingIt) {
  ASSERT_EQ(setenv("LOCAL_RANK", "abc", 1), 0);
  gs_connect_options o = GS_CONNECT_OPTIONS_INIT;
  o.socket_path = "/nonexistent/gradsync.sock";
  gs_client* c = nullptr;
  EXPECT_EQ(gs_connect(&o, &c), GS_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(gs_last_error(c), HasSubstr("$LOCAL_RANK is 'abc'"));
  gs_close(c);
  unsetenv("LOCAL_RANK");
}

}  // namespace
}  // namespace gradsync
