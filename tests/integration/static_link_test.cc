// The release gradsyncd carries gRPC, Abseil and Protobuf (and re2, upb,
// c-ares, gpr, address_sorting) linked in, not as ~65 shared objects: the
// dynamic loader's work was most of a daemon's start-up CPU, paid again by
// every Gloo worker (the same binary). A shared copy next to the static one
// would also mean two Abseils in one process. See third_party/system_libs.bzl.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

constexpr auto kBound = std::chrono::seconds(30);

// The file-backed objects /proc/<pid>/maps lists for `pid`, once each.
std::vector<std::string> MappedFiles(pid_t pid) {
  std::istringstream maps(ReadFile(absl::StrCat("/proc/", pid, "/maps")));
  std::vector<std::string> files;
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string file = line.substr(slash);
    if (files.empty() || files.back() != file) files.push_back(file);
  }
  return files;
}

TEST(StaticLinkTest, AServingDaemonMapsNoSharedGrpcAbseilOrProtobuf) {
  Daemon daemon(1);
  ASSERT_TRUE(daemon.WaitReady(kBound)) << daemon.process().Log();
  const std::vector<std::string> files = MappedFiles(daemon.process().pid());
  // What it does map shared (OpenSSL, which the shared cpp-httplib needs
  // too): the list is real, not empty for want of permission.
  EXPECT_TRUE(std::any_of(files.begin(), files.end(), [](const std::string& f) {
    return absl::StrContains(f, "libssl.so");
  })) << ::testing::PrintToString(files);
  for (const std::string& file : files) {
    for (const char* linked_in : {"libabsl_", "libgrpc", "libprotobuf", "libre2.", "libupb.",
                                  "libcares.", "libgpr.", "libaddress_sorting."}) {
      EXPECT_FALSE(absl::StrContains(file, linked_in))
          << "gradsyncd maps " << file << ": it should carry " << linked_in
          << "* linked in (is Debian's static archive installed? see the DEBUG line "
             "third_party/system_libs.bzl prints)";
    }
  }
  EXPECT_TRUE(daemon.Stop().exited) << daemon.process().Log();
}

}  // namespace
}  // namespace gradsync::testing
