// FUZZ_CHECK: a property of the code under fuzzing that must hold for every
// input. A violation aborts, which libFuzzer reports as a crash and saves
// the input that caused it.
#ifndef GRADSYNC_TESTS_FUZZ_FUZZ_CHECK_H_
#define GRADSYNC_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond, what)                                             \
  do {                                                                     \
    if (!(cond)) {                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s) at %s:%d\n", #cond, \
                   std::string(what).c_str(), __FILE__, __LINE__);         \
      std::abort();                                                        \
    }                                                                      \
  } while (0)

#endif  // GRADSYNC_TESTS_FUZZ_FUZZ_CHECK_H_
