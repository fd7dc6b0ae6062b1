// Another Unix user for tests of the local trust boundary: programs run as
// uid/gid OtherUser::kUid with no supplementary groups (setpriv, from
// util-linux; no passwd entry needed). Needs root. Bazel's runfiles live
// under /root, which that user cannot reach: Share() copies a program into
// a 0755 directory of its own first.
#ifndef GRADSYNC_TESTS_INTEGRATION_OTHER_USER_H_
#define GRADSYNC_TESTS_INTEGRATION_OTHER_USER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "tests/testing/files.h"

namespace gradsync::testing {

class OtherUser {
 public:
  static constexpr uid_t kUid = 48611;

  // Empty when tests can run programs as kUid; else why not.
  static std::string Unavailable();

  OtherUser();
  // Copies the runfile (e.g. "daemon/gradsyncd") where kUid can run it.
  std::string Share(const std::string& runfile) const;
  // argv run as kUid.
  std::vector<std::string> Argv(const std::vector<std::string>& argv) const;

 private:
  ScratchDir bin_{"gsbin"};
};

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_OTHER_USER_H_
