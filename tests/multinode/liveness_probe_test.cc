// Liveness probes over real loopback sockets: a listening port, a port
// nothing listens on and a port whose accept queue is full (connects time
// out, as towards a stalled or partitioned host) are told apart, and only
// the second proves a daemon gone.
#include "daemon/cluster/liveness_probe.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/loopback_port.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using ::testing::HasSubstr;

TEST(ProbeListeners, TellsAListeningARefusingAndAnUnansweringPortApartByPosition) {
  const LoopbackPort listening = LoopbackPort::Listening();
  const LoopbackPort refusing = LoopbackPort::Refusing();
  const LoopbackPort unanswering = LoopbackPort::Unanswering();
  ASSERT_FALSE(listening.address().empty());
  ASSERT_FALSE(refusing.address().empty());
  ASSERT_FALSE(unanswering.address().empty());
  const std::vector<ProbeOutcome> outcomes =
      ProbeListeners({unanswering.address(), refusing.address(), listening.address()});
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[0].liveness, Liveness::kUnknown) << outcomes[0].detail;
  EXPECT_THAT(outcomes[0].detail, HasSubstr("timed out after 150 ms"));
  EXPECT_EQ(outcomes[1].liveness, Liveness::kRefused) << outcomes[1].detail;
  EXPECT_EQ(outcomes[1].detail, "connection refused");
  EXPECT_EQ(outcomes[2].liveness, Liveness::kListening) << outcomes[2].detail;
}

// A name is never looked up (no timeout bounds a lookup): only numeric
// addresses are probed.
TEST(ProbeListeners, AnAddressThatIsNotNumericHostPortProvesNothing) {
  const std::vector<ProbeOutcome> outcomes =
      ProbeListeners({"no-port", "127.0.0.1:", "[::1:80", ":80x", "localhost:1"});
  ASSERT_EQ(outcomes.size(), 5u);
  for (const ProbeOutcome& o : outcomes) EXPECT_EQ(o.liveness, Liveness::kUnknown) << o.detail;
  EXPECT_THAT(outcomes[0].detail, HasSubstr("'no-port' is not HOST:PORT"));
  EXPECT_THAT(outcomes[4].detail, HasSubstr("'localhost:1' is not a numeric address"));
}

TEST(RefusesConnections, NamesTheAddress) {
  EXPECT_EQ(RefusesConnections("10.0.0.3:7250"), "its daemon at 10.0.0.3:7250 refuses connections");
}

TEST(BackgroundProber, AnswersOnItsOwnThreadInTheOrderAsked) {
  const LoopbackPort listening = LoopbackPort::Listening();
  const LoopbackPort refusing = LoopbackPort::Refusing();
  BackgroundProber prober;
  absl::Mutex mu;
  std::vector<Liveness> seen;
  std::vector<std::thread::id> threads;
  for (const std::string& address : {refusing.address(), listening.address()}) {
    prober.Probe({address}, [&](std::vector<ProbeOutcome> outcomes) {
      absl::MutexLock lock(&mu);
      seen.push_back(outcomes.at(0).liveness);
      threads.push_back(std::this_thread::get_id());
    });
  }
  ASSERT_TRUE(WaitUntil(
      [&] {
        absl::MutexLock lock(&mu);
        return seen.size() == 2;
      },
      absl::Seconds(10)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen, (std::vector<Liveness>{Liveness::kRefused, Liveness::kListening}));
  EXPECT_NE(threads[0], std::this_thread::get_id());
}

}  // namespace
}  // namespace gradsync::testing
