// Where stall and timeout traces go, and the cap on how many are kept: real
// files in the test's temporary directory, ages set explicitly.
#include "daemon/observe/trace_directory.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/testing/files.h"

namespace gradsync {
namespace {

namespace fs = std::filesystem;

std::function<const char*(const char*)> Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(TraceDirectoryTest, LogsThenStateDirectoryThenTmp) {
  EXPECT_EQ(TraceDirectory(Env({{"LOGS_DIRECTORY", "/var/log/gradsync:/var/log/other"},
                                {"STATE_DIRECTORY", "/var/lib/gradsync"}})),
            "/var/log/gradsync");
  EXPECT_EQ(TraceDirectory(Env({{"LOGS_DIRECTORY", ""}, {"STATE_DIRECTORY", "/var/lib/gradsync"}})),
            "/var/lib/gradsync");
  EXPECT_EQ(TraceDirectory(Env({})), "/tmp/gradsync");
}

TEST(TraceDirectoryTest, JobIdCannotLeaveTheDirectory) {
  EXPECT_EQ(TraceFileName("../../etc/x y", 3, 42), "gradsync-trace-.._.._etc_x_y-node3-42.json");
  EXPECT_EQ(TraceFileName("resnet50-run7", 0, 1), "gradsync-trace-resnet50-run7-node0-1.json");
}

TEST(TraceDirectoryTest, KeepsTheNewestAndLeavesOtherFiles) {
  const std::string dir = testing::TestTmpDir() + "/traces/nested";
  ASSERT_TRUE(MakeRoomForTrace(dir, 3).ok());  // creates it, owner-only
  struct stat st {};
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  // Ages set explicitly: trace-0 is the oldest; names do not sort by age.
  const std::string names[] = {"gradsync-trace-j-node0-900.json", "gradsync-trace-j-node0-10.json",
                               "gradsync-trace-j-node0-5000.json",
                               "gradsync-trace-j-node0-77.json"};
  for (int i = 0; i < 4; ++i) {
    const std::string path = dir + "/" + names[i];
    std::ofstream(path) << "{}";
    const timespec times[2] = {{1000 + i, 0}, {1000 + i, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  }
  std::ofstream(dir + "/notes.txt") << "not a trace";

  ASSERT_TRUE(MakeRoomForTrace(dir, 3).ok());
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir)) left.insert(entry.path().filename());
  // Room for one more: the two newest traces stay, and the other file.
  EXPECT_EQ(left, (std::set<std::string>{names[2], names[3], "notes.txt"}));
}

TEST(TraceDirectoryTest, UncreatableDirectoryNamesIt) {
  const std::string file = testing::TestTmpDir() + "/plain-file";
  std::ofstream(file) << "x";
  const absl::Status st = MakeRoomForTrace(file + "/sub", 3);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr(file + "/sub"));
}

}  // namespace
}  // namespace gradsync
