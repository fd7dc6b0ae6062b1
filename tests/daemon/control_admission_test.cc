// ControlAdmission: every bound refuses with RESOURCE_EXHAUSTED naming the
// call and the bound, frees on Leave, and an unsent reply past its deadline
// is ended; PeerAddress counts by address, not by connection.
#include "daemon/control_admission.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tests/testing/wait.h"

namespace gradsync {
namespace {

using ::gradsync::testing::WaitUntil;
using ::testing::HasSubstr;

ControlLimits Limits(int calls, int per_peer, size_t bytes,
                     std::chrono::milliseconds deadline = std::chrono::hours(1)) {
  ControlLimits l;
  l.max_calls = calls;
  l.max_calls_per_peer = per_peer;
  l.max_reply_bytes = bytes;
  l.reply_deadline = deadline;
  return l;
}

TEST(ControlAdmissionTest, CallsOverTheDaemonsBoundAreRefusedNamingItUntilOneLeaves) {
  ControlAdmission admission(Limits(2, 2, 1 << 20));
  absl::StatusOr<uint64_t> a = admission.Enter("10.0.0.1", "Control.GetStats");
  absl::StatusOr<uint64_t> b = admission.Enter("10.0.0.2", "Control.GetStats");
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<uint64_t> c = admission.Enter("10.0.0.3", "Control.GetTrace");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("Control.GetTrace refused"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("max_control_calls)"));
  admission.Leave(*a);
  EXPECT_TRUE(admission.Enter("10.0.0.3", "Control.GetTrace").ok());
  EXPECT_EQ(admission.usage().refused, 1u);
}

TEST(ControlAdmissionTest, OnePeerAddressHoldsAtMostItsShare) {
  ControlAdmission admission(Limits(8, 1, 1 << 20));
  absl::StatusOr<uint64_t> a = admission.Enter("10.0.0.1", "Control.GetTrace");
  ASSERT_TRUE(a.ok());
  absl::StatusOr<uint64_t> again = admission.Enter("10.0.0.1", "Control.GetStats");
  ASSERT_EQ(again.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("from 10.0.0.1"));
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("max_control_calls_per_peer"));
  // Another address is not affected; the first one's slot comes back.
  EXPECT_TRUE(admission.Enter("10.0.0.2", "Control.GetStats").ok());
  admission.Leave(*a);
  EXPECT_TRUE(admission.Enter("10.0.0.1", "Control.GetStats").ok());
}

TEST(ControlAdmissionTest, UnsentReplyBytesAreBoundedAndFreedByLeave) {
  ControlAdmission admission(Limits(8, 8, 100));
  absl::StatusOr<uint64_t> a = admission.Enter("10.0.0.1", "Control.GetTrace");
  absl::StatusOr<uint64_t> b = admission.Enter("10.0.0.1", "Control.GetTrace");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(admission.Reply(*a, 60, {}).ok());
  EXPECT_EQ(admission.usage().reply_bytes, 60u);
  const absl::Status over = admission.Reply(*b, 60, {});
  ASSERT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.message()), HasSubstr("Control.GetTrace refused"));
  EXPECT_THAT(std::string(over.message()), HasSubstr("max_control_reply_bytes"));
  admission.Leave(*b);
  admission.Leave(*a);
  EXPECT_EQ(admission.usage().reply_bytes, 0u);
  EXPECT_EQ(admission.usage().calls, 0);
  absl::StatusOr<uint64_t> c = admission.Enter("10.0.0.1", "Control.GetTrace");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(admission.Reply(*c, 60, {}).ok());
  admission.Leave(*c);
}

TEST(ControlAdmissionTest, ABoundTheCallerKeepsIsRefusedNamingTheCallAndCounted) {
  ControlAdmission admission(Limits(8, 8, 100));
  absl::StatusOr<uint64_t> a = admission.Enter("10.0.0.1", "Control.GetTrace");
  ASSERT_TRUE(a.ok());
  const absl::Status refused = admission.Refused(*a, "4 traces wait (max_queued_traces)");
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(), "Control.GetTrace refused: 4 traces wait (max_queued_traces)");
  EXPECT_EQ(admission.usage().refused, 1u);
  admission.Leave(*a);
}

TEST(ControlAdmissionTest, AReplyUnsentPastItsDeadlineIsEndedOnce) {
  ControlAdmission admission(Limits(8, 8, 100, std::chrono::milliseconds(1)));
  absl::StatusOr<uint64_t> a = admission.Enter("10.0.0.1", "Control.GetTrace");
  ASSERT_TRUE(a.ok());
  std::atomic<int> pinned{0}, ended{0};
  ASSERT_TRUE(admission
                  .Reply(*a, 10,
                         [&]() -> std::function<void()> {
                           ++pinned;
                           return [&] { ++ended; };
                         })
                  .ok());
  WaitUntil([&] { return ended.load() != 0; }, std::chrono::seconds(30));
  ASSERT_EQ(ended.load(), 1);
  EXPECT_EQ(pinned.load(), 1);
  EXPECT_EQ(admission.usage().overdue, 1u);
  // Its slot and bytes stay taken until gRPC is done with the call.
  EXPECT_EQ(admission.usage().calls, 1);
  admission.Leave(*a);
  EXPECT_EQ(admission.usage().reply_bytes, 0u);
}

TEST(ControlAdmissionTest, PeerAddressDropsThePortAndReadsAnAcceptedSocket) {
  EXPECT_EQ(PeerAddress("ipv4:10.0.0.5:4242"), "10.0.0.5");
  EXPECT_EQ(PeerAddress("ipv6:[::1]:4242"), "::1");
  EXPECT_EQ(PeerAddress("unix:/run/x.sock"), "unix:/run/x.sock");

  // "fd:N": a connection handed to gRPC by the daemon's own acceptor.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const int accepted = accept(listener, nullptr, nullptr);
  ASSERT_GE(accepted, 0);
  EXPECT_EQ(PeerAddress("fd:" + std::to_string(accepted)), "127.0.0.1");
  close(accepted);
  close(client);
  close(listener);
}

}  // namespace
}  // namespace gradsync
