// Exit codes of the multinode_node helper, checked by the tests.
#ifndef GRADSYNC_TESTS_MULTINODE_EXIT_CODES_H_
#define GRADSYNC_TESTS_MULTINODE_EXIT_CODES_H_

namespace gradsync::testing {

enum class ExitCode : int {
  kOk = 0,
  kFailed = 1,  // a check failed or an unexpected error
  kUsage = 2,
  kFailedAsExpected = 3,  // the allreduce failed the way the scenario wants
  kJoinFailed = 4,        // Join returned an error (printed in the log)
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_MULTINODE_EXIT_CODES_H_
