// The /dev/shm entries a test's processes created, by the segment prefix
// the test gave them: daemons name theirs "<prefix>.<pid>...."
// (ipc/random_segment_name.h), the simulated GPU "<prefix>.<pid>...."
// (gpu/sim). A SIGKILLed daemon or trainer cannot remove its own, and no
// later daemon sweeps a test's private prefix, so the test removes them.
#ifndef GRADSYNC_TESTS_TESTING_SHM_ENTRIES_H_
#define GRADSYNC_TESTS_TESTING_SHM_ENTRIES_H_

#include <string>
#include <vector>

namespace gradsync::testing {

// Names under /dev/shm of the form "<prefix>.<anything>": the dot keeps
// prefix "gst1x2" from matching another test's "gst1x23.".
std::vector<std::string> ShmEntriesOfPrefix(const std::string& prefix);

// Unlinks every ShmEntriesOfPrefix(prefix); returns the names it removed.
// Processes that still map one keep their mapping.
std::vector<std::string> RemoveShmEntriesOfPrefix(const std::string& prefix);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_SHM_ENTRIES_H_
