#include "tests/integration/nonfinite_culprit.h"

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {

std::string NonFiniteCulprit(int rank, int local_rank, const Process& trainer, int node) {
  return absl::StrCat("non-finite gradient from rank ", rank, " (local ", local_rank, ", pid ",
                      trainer.pid(), ") on node ", node, " (host ");
}

std::string NonFiniteElement(int tensor, const std::string& name, uint64_t element,
                             const std::string& value) {
  return absl::StrCat("tensor ", tensor, " '", name, "' element ", element, " = ", value);
}

std::vector<std::string> ExpectEveryTrainerFailsNaming(
    std::vector<Process>& trainers, const std::vector<std::string>& named,
    std::chrono::milliseconds bound, const std::function<std::string()>& daemon_logs) {
  EXPECT_FALSE(trainers.empty()) << "no trainer to wait for";
  std::vector<std::string> logs;
  for (size_t t = 0; t < trainers.size(); ++t) {
    const ExitStatus st = trainers[t].Wait(bound);
    logs.push_back(trainers[t].Log());
    const std::string& log = logs.back();
    EXPECT_EQ(st.code, kExitInvalidArgument) << "trainer " << t << "\n" << log << daemon_logs();
    for (const std::string& text : named) {
      EXPECT_NE(log.find(text), std::string::npos)
          << "trainer " << t << " does not name: " << text << "\n"
          << log;
    }
  }
  return logs;
}

}  // namespace gradsync::testing
