// The daemon forces non-blocking NCCL communicators: NCCL_COMM_BLOCKING=1
// (from the environment or an nccl.conf) overrides config.blocking = 0, and
// ncclGroupEnd would then wait for a dead peer with no timeout. Its own
// binary: NCCL is loaded once per process. Runs with or without NCCL (the
// variable is set before the library is looked for) and without a GPU.
#include <cstdlib>
#include <string>

#include "gpu/nccl_collectives.h"
#include "gtest/gtest.h"

namespace gradsync::gpu {
namespace {

TEST(NcclEnvTest, LoadingNcclForcesNonBlockingCommunicators) {
  ASSERT_EQ(setenv("NCCL_COMM_BLOCKING", "1", 1), 0);
  // What gradsyncd's main calls before its threads start (whether NCCL is
  // found does not matter here).
  LoadNcclBeforeThreads().IgnoreError();
  const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
  ASSERT_NE(blocking, nullptr);
  EXPECT_EQ(std::string(blocking), "0");
}

}  // namespace
}  // namespace gradsync::gpu
