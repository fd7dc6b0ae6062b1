#include "daemon/cluster/resume_rule.h"

#include "absl/strings/str_cat.h"

namespace gradsync {

std::string CheckResumeIterations(uint64_t generation, const std::map<int, uint64_t>& resumes,
                                  const std::string& dead_list) {
  if (resumes.empty()) return "";
  auto lowest = resumes.begin(), highest = resumes.begin();
  for (auto it = resumes.begin(); it != resumes.end(); ++it) {
    if (it->second < lowest->second) lowest = it;
    if (it->second > highest->second) highest = it;
  }
  // One apart: the lower ones are still in the iteration the others
  // completed, which they commit from them before resuming together.
  if (highest->second - lowest->second <= 1) return "";
  return absl::StrCat(
      "the survivors of generation ", generation,
      " stopped in different iterations more than one apart (node_rank=", lowest->first, " in ",
      lowest->second, ", node_rank=", highest->first, " in ", highest->second,
      "): only an iteration some survivors completed and others did not can be "
      "committed; dead: ",
      dead_list);
}

}  // namespace gradsync
