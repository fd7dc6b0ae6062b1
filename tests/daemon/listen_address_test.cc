// SelfDialAddress: the leader joins its own rendezvous at an address its
// --listen server actually answers on, with the port it actually bound.
#include "daemon/listen_address.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace gradsync {
namespace {

TEST(SelfDialAddress, Ipv4WildcardIsDialedOnIpv4Loopback) {
  EXPECT_EQ(SelfDialAddress("0.0.0.0:7250", 7250).value(), "127.0.0.1:7250");
}

TEST(SelfDialAddress, EmptyHostIsDialedOnIpv4Loopback) {
  EXPECT_EQ(SelfDialAddress(":7250", 7250).value(), "127.0.0.1:7250");
}

TEST(SelfDialAddress, SpecificIpv4AddressIsDialedAsIs) {
  EXPECT_EQ(SelfDialAddress("127.0.0.2:7250", 7250).value(), "127.0.0.2:7250");
  EXPECT_EQ(SelfDialAddress("10.1.2.1:7250", 7250).value(), "10.1.2.1:7250");
}

TEST(SelfDialAddress, Ipv6WildcardIsDialedOnIpv6Loopback) {
  EXPECT_EQ(SelfDialAddress("[::]:7250", 7250).value(), "[::1]:7250");
  EXPECT_EQ(SelfDialAddress("[0:0::0]:7250", 7250).value(), "[::1]:7250");
}

TEST(SelfDialAddress, SpecificIpv6AddressIsDialedAsIs) {
  EXPECT_EQ(SelfDialAddress("[::1]:7250", 7250).value(), "[::1]:7250");
  EXPECT_EQ(SelfDialAddress("[fd00::1]:7250", 7250).value(), "[fd00::1]:7250");
}

TEST(SelfDialAddress, HostnameIsDialedAsIs) {
  EXPECT_EQ(SelfDialAddress("node0.cluster:7250", 7250).value(), "node0.cluster:7250");
}

TEST(SelfDialAddress, PortZeroIsReplacedByTheBoundPort) {
  EXPECT_EQ(SelfDialAddress("127.0.0.2:0", 41234).value(), "127.0.0.2:41234");
  EXPECT_EQ(SelfDialAddress("0.0.0.0:0", 41234).value(), "127.0.0.1:41234");
  EXPECT_EQ(SelfDialAddress("[::]:0", 41234).value(), "[::1]:41234");
}

TEST(SelfDialAddress, AddressWithoutPortIsInvalidArgument) {
  const absl::StatusOr<std::string> got = SelfDialAddress("node0", 7250);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(), "--listen node0 is not HOST:PORT");
}

TEST(SelfDialAddress, UnclosedIpv6BracketIsInvalidArgument) {
  const absl::StatusOr<std::string> got = SelfDialAddress("[::1:7250", 7250);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(), "--listen [::1:7250: an IPv6 host must be [ADDRESS]:PORT");
}

// What the other nodes probe when this one falls silent: an address they
// can reach, with the bound port.
TEST(AdvertisedListenAddress, ASpecificHostIsAdvertisedWithTheBoundPort) {
  EXPECT_EQ(AdvertisedListenAddress("10.1.2.1:0", "10.9.9.9", 41234), "10.1.2.1:41234");
  EXPECT_EQ(AdvertisedListenAddress("[fd00::1]:7250", "", 7250), "[fd00::1]:7250");
}

TEST(AdvertisedListenAddress, AWildcardIsAdvertisedAtTheGlooHostElseLoopback) {
  EXPECT_EQ(AdvertisedListenAddress("0.0.0.0:7250", "10.1.2.3", 7250), "10.1.2.3:7250");
  EXPECT_EQ(AdvertisedListenAddress("[::]:0", "fd00::7", 41234), "[fd00::7]:41234");
  EXPECT_EQ(AdvertisedListenAddress("0.0.0.0:0", "", 41234), "127.0.0.1:41234");
}

TEST(AdvertisedListenAddress, NoListenUnixOrNoPortAdvertisesNothing) {
  EXPECT_EQ(AdvertisedListenAddress("", "10.1.2.3", 7250), "");
  EXPECT_EQ(AdvertisedListenAddress("unix:/run/gradsync.sock", "", 7250), "");
  EXPECT_EQ(AdvertisedListenAddress("127.0.0.1:0", "", 0), "");
}

TEST(NumericHostPort, NumericAddressesStayANameIsLookedUp) {
  EXPECT_EQ(NumericHostPort("10.1.2.3:7250"), "10.1.2.3:7250");
  EXPECT_EQ(NumericHostPort("[fd00::1]:41234"), "[fd00::1]:41234");
  const std::string localhost = NumericHostPort("localhost:7250");
  EXPECT_TRUE(localhost == "127.0.0.1:7250" || localhost == "[::1]:7250") << localhost;
  EXPECT_EQ(NumericHostPort("no-port"), "");
  EXPECT_EQ(NumericHostPort(""), "");
}

// Without a token, a single-node daemon may only listen where other hosts
// cannot reach it.
TEST(ListensOnLoopbackOnly, LoopbackAddressesAndNamesOnly) {
  for (const char* yes :
       {"127.0.0.1:7250", "127.0.0.2:0", "[::1]:7250", "localhost:7250", "unix:/tmp/x.sock"}) {
    EXPECT_TRUE(ListensOnLoopbackOnly(yes)) << yes;
  }
  for (const char* no : {"0.0.0.0:7250", "[::]:7250", ":7250", "10.0.0.1:7250",
                         "node0.example:7250", "128.0.0.1:7250", "[::2]:7250", "7250"}) {
    EXPECT_FALSE(ListensOnLoopbackOnly(no)) << no;
  }
}

}  // namespace
}  // namespace gradsync
