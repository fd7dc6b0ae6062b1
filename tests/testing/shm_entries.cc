#include "tests/testing/shm_entries.h"

#include <dirent.h>
#include <unistd.h>

namespace gradsync::testing {

std::vector<std::string> ShmEntriesOfPrefix(const std::string& prefix) {
  const std::string start = prefix + ".";
  std::vector<std::string> out;
  if (prefix.empty()) return out;  // would be every hidden entry: never what a test means
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name).rfind(start, 0) == 0) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

std::vector<std::string> RemoveShmEntriesOfPrefix(const std::string& prefix) {
  std::vector<std::string> removed;
  for (const std::string& name : ShmEntriesOfPrefix(prefix)) {
    // unlink, not shm_unlink: the same entry, and no librt for a test helper.
    if (unlink(("/dev/shm/" + name).c_str()) == 0) removed.push_back(name);
  }
  return removed;
}

}  // namespace gradsync::testing
