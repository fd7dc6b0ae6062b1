// The plan decisions in a gradsyncd's log: which bucket plan it applied from
// which iteration, so a test can check that every node re-planned alike.
#ifndef GRADSYNC_TESTS_TESTING_PLAN_DECISIONS_H_
#define GRADSYNC_TESTS_TESTING_PLAN_DECISIONS_H_

#include <string>
#include <vector>

namespace gradsync::testing {

// "iteration=I config_version=V fingerprint=F" of every
// "event=plan_decided" line of `log`, in the order logged.
std::vector<std::string> PlanDecisions(const std::string& log);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_TESTING_PLAN_DECISIONS_H_
