// End to end: with a /dev/shm too small for the job (a
// container's 64 MiB default, scaled down to 16 MiB here), two trainers of
// ~10 MB each used to register fine — segments were sparse — and a trainer
// or the daemon then died of SIGBUS writing gradients. Now registration
// fails with GS_ERR_RESOURCE_EXHAUSTED naming the segment, the bytes it
// needs and the bytes free; the daemon keeps serving a job that fits.
//
// The whole test process moves into a private mount namespace with its own
// small /dev/shm (tests/testing/small_shm.h): a binary of its own.
#include "tests/testing/small_shm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr auto kBound = seconds(60);

TEST(SmallShmTest, RegisterSaysWhatDoesNotFitInsteadOfATrainerDyingOfSigbus) {
  if (const std::string why = SmallShmUnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  ASSERT_TRUE(MountSmallShm(16u << 20).ok());
  Daemon daemon(2, {"--timeout-s=20"});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();

  // fc1.weight alone: 160000 x 16 floats, 10.24 MB per trainer.
  std::vector<Process> big;
  for (int r = 0; r < 2; ++r) {
    big.push_back(StartTrainer(daemon, r, {"--steps=3", "--dim=16", "--hidden=160000"}, ""));
  }
  bool named = false;
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = big[r].Wait(kBound);
    EXPECT_TRUE(st.exited) << "trainer " << r << " " << st.ToString() << "\n" << big[r].Log();
    // A code the caller can act on (free /dev/shm or ask for less), not INTERNAL.
    EXPECT_EQ(st.code, kExitResourceExhausted)
        << "trainer " << r << " on a /dev/shm too small for it:\n"
        << big[r].Log();
    const std::string log = big[r].Log();
    if (log.find("segment " + daemon.shm_prefix()) != std::string::npos &&
        log.find(" bytes, /dev/shm has ") != std::string::npos &&
        log.find(" bytes free") != std::string::npos) {
      named = true;
    }
  }
  EXPECT_TRUE(named) << "no trainer was told what did not fit:\n"
                     << big[0].Log() << "\n"
                     << big[1].Log() << "\ndaemon:\n"
                     << daemon.process().Log();
  ASSERT_TRUE(daemon.process().Running()) << daemon.process().Log();

  // What was reserved for the failed job is free again: a small job trains.
  std::vector<Process> small;
  for (int r = 0; r < 2; ++r) small.push_back(StartTrainer(daemon, r, {"--steps=5"}, ""));
  for (int r = 0; r < 2; ++r) {
    const ExitStatus st = small[r].Wait(kBound);
    EXPECT_TRUE(st.exited && st.code == 0) << st.ToString() << "\n" << small[r].Log();
  }
}

}  // namespace
}  // namespace gradsync::testing
