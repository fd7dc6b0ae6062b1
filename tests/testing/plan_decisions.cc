#include "tests/testing/plan_decisions.h"

#include <regex>

#include "absl/strings/str_cat.h"

namespace gradsync::testing {

std::vector<std::string> PlanDecisions(const std::string& log) {
  static const std::regex kDecided(
      "event=plan_decided plan_version=(\\d+) fingerprint=(\\w+) iteration=(\\d+) "
      "config_version=(\\d+)");
  std::vector<std::string> out;
  for (std::sregex_iterator it(log.begin(), log.end(), kDecided), end; it != end; ++it) {
    out.push_back(absl::StrCat("iteration=", (*it)[3].str(), " config_version=", (*it)[4].str(),
                               " fingerprint=", (*it)[2].str()));
  }
  return out;
}

}  // namespace gradsync::testing
