// The simulated GPU's segment prefix of one test binary: linking this
// library gives the test process, and every gradsyncd_sim and sim_trainer
// it spawns (they inherit the environment), GRADSYNC_SIM_PREFIX =
// "gssim<pid>x<random>" before the first test, and removes every /dev/shm
// entry of that prefix after the last one. Segments of the processes a
// test SIGKILLs would otherwise stay: no daemon sweeps the simulator's
// segments, and under the shared default "gssim" a test could not tell its
// own from another test's that is still running.
#ifndef GRADSYNC_TESTS_TESTING_SIM_SEGMENT_PREFIX_H_
#define GRADSYNC_TESTS_TESTING_SIM_SEGMENT_PREFIX_H_

#include <string>

namespace gradsync::testing {

// This test binary's simulator prefix (the value of GRADSYNC_SIM_PREFIX
// its children see).
const std::string& SimSegmentPrefix();

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_SIM_SEGMENT_PREFIX_H_
