// Unique shared-memory names for tests, and a guard that removes them.
//
// Names carry the test process's pid and a counter, so tests running in
// parallel (or a rerun after a crash) never collide; the guard removes the
// segments when the test ends, whether it passed or failed, and also when
// the test is killed with SIGTERM or SIGINT (Bazel's timeout, Ctrl-C).
#ifndef GRADSYNC_TESTS_IPC_SEGMENT_NAMES_H_
#define GRADSYNC_TESTS_IPC_SEGMENT_NAMES_H_

#include <string>
#include <utility>
#include <vector>

namespace gradsync::testing {

// "gstest_<tag>_<pid>_<n>": unique within this machine while we run.
std::string UniqueSegmentName(const std::string& tag);

// A prefix for SegmentName()/RemoveStaleSegments(): "gstest_<tag>_<pid>_<n>"
// with no dot, so "<prefix>.<pid>.<suffix>" parses as intended.
inline std::string UniquePrefix(const std::string& tag) { return UniqueSegmentName(tag); }

class SegmentCleanup {
 public:
  SegmentCleanup() = default;
  explicit SegmentCleanup(std::string name) { Add(std::move(name)); }
  SegmentCleanup(const SegmentCleanup&) = delete;
  SegmentCleanup& operator=(const SegmentCleanup&) = delete;
  ~SegmentCleanup();  // removes every added name that still exists

  // Returns the name, for `auto name = cleanup.Add(UniqueSegmentName(...))`.
  std::string Add(std::string name);

 private:
  std::vector<std::string> names_;
  std::vector<void*> slots_;  // entries of the SIGTERM handler's table
};

// Whether /dev/shm/<name> exists.
bool SegmentExists(const std::string& name);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_IPC_SEGMENT_NAMES_H_
