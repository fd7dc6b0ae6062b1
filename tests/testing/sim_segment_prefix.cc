#include "tests/testing/sim_segment_prefix.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <random>

#include "tests/testing/shm_entries.h"

namespace gradsync::testing {

const std::string& SimSegmentPrefix() {
  // The random part: a pid reused after a test binary that was killed
  // (its leftovers still there) must not make a new run's prefix collide.
  static const std::string prefix =
      "gssim" + std::to_string(getpid()) + "x" + std::to_string(std::random_device{}() % 1000000);
  return prefix;
}

namespace {

class SimSegmentCleanup : public ::testing::Environment {
 public:
  // Before any test starts a thread or a process, so every child inherits it.
  void SetUp() override { setenv("GRADSYNC_SIM_PREFIX", SimSegmentPrefix().c_str(), 1); }
  void TearDown() override { RemoveShmEntriesOfPrefix(SimSegmentPrefix()); }
};

[[maybe_unused]] ::testing::Environment* const kCleanup =
    ::testing::AddGlobalTestEnvironment(new SimSegmentCleanup);

}  // namespace
}  // namespace gradsync::testing
