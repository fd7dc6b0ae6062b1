// Address flags are checked for form at start (daemon/host_syntax.h).
#include "daemon/host_syntax.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gradsync {
namespace {

using ::testing::HasSubstr;

TEST(HostSyntax, AcceptsAddressesAndNames) {
  for (const char* host : {"10.0.0.1", "0.0.0.0", "::1", "[::1]", "fe80::1", "localhost",
                           "node-1.cluster.local", "node-1.cluster.local.", "gpu_07", "a1"}) {
    EXPECT_TRUE(CheckHost("--host", host).ok()) << host;
  }
  for (const char* listen : {"127.0.0.1:0", ":7250", "[::]:7250", "[::1]:65535", "localhost:80",
                             "leader.example:7250"}) {
    EXPECT_TRUE(CheckHostPort("--listen", listen).ok()) << listen;
  }
}

TEST(HostSyntax, RefusesWhatCannotBeAnAddressNamingFlagAndValue) {
  for (const char* host : {"256.1.1.1", "1.2.3", "1.2.3.4.5", "", "bad host", "-lead", "a..b",
                           "[10.0.0.1]", "::1]", "x/y"}) {
    const absl::Status st = CheckHost("--host", host);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << host;
    EXPECT_THAT(std::string(st.message()), HasSubstr(std::string("--host ") + host)) << host;
  }
  for (const char* listen : {"256.1.1.1:7250", "127.0.0.1", "127.0.0.1:-1", "127.0.0.1:65536",
                             "::1:7250", "[::1:7250", "host name:80"}) {
    const absl::Status st = CheckHostPort("--leader", listen);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_THAT(std::string(st.message()), HasSubstr(std::string("--leader ") + listen)) << listen;
  }
}

}  // namespace
}  // namespace gradsync
