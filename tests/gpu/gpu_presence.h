// Whether this machine has a GPU the tests can use, and what a GPU test does
// when it has none.
//
// Three answers, not two: "no GPU here" (no driver library, or a driver that
// sees no device) is a skip, but a driver that is present and fails (too old
// for the runtime, not initialised, a broken install) is a failure: a skip
// there would hide exactly the bug a GPU node is meant to catch. On a GPU node
// scripts/gpu-check.sh sets GRADSYNC_REQUIRE_GPU=1, which turns every skip for
// a missing GPU into a failure too.
#ifndef GRADSYNC_TESTS_GPU_GPU_PRESENCE_H_
#define GRADSYNC_TESTS_GPU_GPU_PRESENCE_H_

#include <string>

#include "gtest/gtest.h"

namespace gradsync::testing {

enum class GpuPresence { kPresent, kAbsent, kBroken };

// Probes the CUDA runtime once; `why` says what was found when not present.
GpuPresence ProbeGpu(std::string* why);

// True when GRADSYNC_REQUIRE_GPU is set to anything but "" or "0".
bool GpuRequired();

}  // namespace gradsync::testing

// Skips the current test where no GPU is present, fails it where the driver is
// broken or GRADSYNC_REQUIRE_GPU=1; falls through where a GPU is present.
#define GS_SKIP_UNLESS_GPU()                                                     \
  do {                                                                           \
    std::string gs_gpu_why_;                                                     \
    switch (::gradsync::testing::ProbeGpu(&gs_gpu_why_)) {                       \
      case ::gradsync::testing::GpuPresence::kPresent:                           \
        break;                                                                   \
      case ::gradsync::testing::GpuPresence::kBroken:                            \
        GTEST_FAIL() << "the CUDA driver is present but fails: " << gs_gpu_why_; \
      case ::gradsync::testing::GpuPresence::kAbsent:                            \
        if (::gradsync::testing::GpuRequired()) {                                \
          GTEST_FAIL() << "GRADSYNC_REQUIRE_GPU=1 but " << gs_gpu_why_;          \
        }                                                                        \
        GTEST_SKIP() << gs_gpu_why_;                                             \
    }                                                                            \
  } while (0)

// For a test that needs more GPUs than a present one (a two-rank collective):
// a skip even where GRADSYNC_REQUIRE_GPU=1, since a one-GPU node cannot run
// it; the skip names the count so the checks' log shows what did not run.
#define GS_SKIP_UNLESS_GPUS(have, need)                                                \
  do {                                                                                 \
    if ((have) < (need)) {                                                             \
      GTEST_SKIP() << "needs " << (need) << " CUDA devices, this node has " << (have); \
    }                                                                                  \
  } while (0)

#endif  // GRADSYNC_TESTS_GPU_GPU_PRESENCE_H_
