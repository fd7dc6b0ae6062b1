#include "tests/testing/files.h"

#include <ftw.h>
#include <stdio.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;  // keep going: remove what can be removed
}

}  // namespace

ScratchDir::ScratchDir(const std::string& tag) {
  std::string templ = "/tmp/" + tag + ".XXXXXX";
  if (::mkdtemp(templ.data()) != nullptr) path_ = templ;
}

ScratchDir::~ScratchDir() {
  // Depth first, without following links out of the directory.
  if (!path_.empty()) ::nftw(path_.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WriteTokenFile(const std::string& path, const std::string& token) {
  {
    std::ofstream out(path, std::ios::trunc);
    out << token << "\n";
    if (!out) return false;
  }
  return ::chmod(path.c_str(), 0600) == 0;
}

bool WaitForFile(const std::string& path, std::chrono::milliseconds timeout) {
  struct stat st;
  return WaitUntil([&] { return ::stat(path.c_str(), &st) == 0; }, timeout);
}

std::string TestTmpDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir != nullptr) {
    return std::string(srcdir) + "/" + (workspace ? workspace : "gradsync") + "/" + path;
  }
  return "bazel-bin/" + path;
}

}  // namespace gradsync::testing
