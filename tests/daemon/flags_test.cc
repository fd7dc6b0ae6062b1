// Every flag gradsyncd defines (linked in from daemon/main.cc) is reachable
// through its GRADSYNCD_* variable: DaemonArgs turns the environment into
// arguments and absl's real parser gives each flag the value set.
#include "daemon/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"

namespace gradsync {
namespace {

// A value of the flag's type that differs from every default.
std::string ValueFor(const absl::CommandLineFlag& flag) {
  if (flag.IsOfType<bool>()) return "true";
  if (flag.IsOfType<int>()) return "7";
  if (flag.IsOfType<double>()) return "7.5";
  return absl::StrCat("from env ", flag.Name(), " \"quoted\"");
}

TEST(DaemonFlagsTest, EveryFlagIsSetByItsEnvironmentVariable) {
  const std::vector<const absl::CommandLineFlag*> flags = DaemonFlags();
  ASSERT_GE(flags.size(), 23u);
  std::map<std::string, std::string> env = {{"HOME", "/nonexistent"}};
  for (const absl::CommandLineFlag* flag : flags) {
    ASSERT_NE(flag->DefaultValue(), ValueFor(*flag)) << flag->Name();
    env[DaemonFlagEnvName(flag->Name())] = ValueFor(*flag);
  }
  absl::StatusOr<std::vector<std::string>> args = DaemonArgs({"gradsyncd"}, env);
  ASSERT_TRUE(args.ok()) << args.status();
  std::vector<char*> pointers;
  for (std::string& arg : *args) pointers.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(pointers.size()), pointers.data());
  for (const absl::CommandLineFlag* flag : flags) {
    EXPECT_EQ(flag->CurrentValue(), ValueFor(*flag))
        << DaemonFlagEnvName(flag->Name()) << " did not set --" << DashedFlagName(flag->Name());
  }
}

TEST(DaemonFlagsTest, NamesAreDashedAndUpperCase) {
  EXPECT_EQ(DashedFlagName("first_bucket_cap_mb"), "first-bucket-cap-mb");
  EXPECT_EQ(DaemonFlagEnvName("first_bucket_cap_mb"), "GRADSYNCD_FIRST_BUCKET_CAP_MB");
}

TEST(DaemonFlagsTest, UnknownVariableIsRefusedNamingIt) {
  absl::StatusOr<std::vector<std::string>> args =
      DaemonArgs({"gradsyncd"}, {{"GRADSYNCD_NODE_RANC", "1"}});
  EXPECT_EQ(args.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(args.status().message()), ::testing::HasSubstr("GRADSYNCD_NODE_RANC"));
}

}  // namespace
}  // namespace gradsync
