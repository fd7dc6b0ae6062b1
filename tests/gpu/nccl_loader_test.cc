// The NCCL loader. Runs on every machine (no GPU needed): loading NCCL and
// calling ncclGetVersion touch no device.
#include "gpu/nccl_loader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace gradsync::gpu {
namespace {

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

TEST(NcclLoaderTest, NotFoundNamesEveryPlaceItLooked) {
  NcclSearch search;
  search.dirs = {"/nonexistent", "/also/not/here"};
  search.system = false;
  absl::StatusOr<NcclApi> api = LoadNccl(search);
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(api.status().message());
  EXPECT_NE(msg.find("/nonexistent/libnccl.so.2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/also/not/here/libnccl.so.2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NCCL_LIB"), std::string::npos) << msg;
}

TEST(NcclLoaderTest, ALibraryThatIsNotNcclStopsTheSearch) {
  // Any shared library without NCCL's symbols will do.
  std::string other;
  for (const char* lib : {"/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1",
                          "/lib/x86_64-linux-gnu/libm.so.6"}) {
    if (Exists(lib)) {
      other = lib;
      break;
    }
  }
  if (other.empty()) GTEST_SKIP() << "no libz/libm found to stand in for a wrong library";
  char tmpl[] = "/tmp/nccl_loader_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ASSERT_EQ(symlink(other.c_str(), (dir + "/libnccl.so.2").c_str()), 0);
  NcclSearch search;
  search.dirs = {dir, "/usr/local/cuda/lib64"};
  search.system = true;
  absl::StatusOr<NcclApi> api = LoadNccl(search);
  unlink((dir + "/libnccl.so.2").c_str());
  rmdir(dir.c_str());
  ASSERT_FALSE(api.ok());
  const std::string msg(api.status().message());
  EXPECT_NE(msg.find(dir + "/libnccl.so.2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing symbols"), std::string::npos) << msg;
}

TEST(NcclLoaderTest, LoadsTheToolkitsNccl) {
  const char* home = std::getenv("CUDA_HOME");
  const std::string dir = std::string(home != nullptr ? home : "/usr/local/cuda") + "/lib64";
  if (!Exists(dir + "/libnccl.so.2")) GTEST_SKIP() << "no " << dir << "/libnccl.so.2 here";
  NcclSearch search;
  search.dirs = {dir};
  search.system = false;
  absl::StatusOr<NcclApi> api = LoadNccl(search);
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_GE(api->version, kMinNcclVersion);
  EXPECT_EQ(api->version / 10000, NCCL_MAJOR);
  EXPECT_FALSE(api->path.empty());
  EXPECT_NE(api->GetErrorString(ncclInvalidArgument), nullptr);
}

TEST(NcclLoaderTest, SearchOrderFromTheEnvironment) {
  setenv("NCCL_LIB", "/a", 1);
  setenv("GRADSYNC_NCCL_PATH", "/b::/c", 1);
  setenv("NCCL_HOME", "/h", 1);
  NcclSearch search = NcclSearchFromEnv();
  unsetenv("NCCL_LIB");
  unsetenv("GRADSYNC_NCCL_PATH");
  unsetenv("NCCL_HOME");
  EXPECT_EQ(search.dirs, (std::vector<std::string>{"/a", "/b", "/c", "/h/lib", "/h/lib64"}));
  EXPECT_TRUE(search.system);
  EXPECT_TRUE(NcclSearchFromEnv().dirs.empty());
}

}  // namespace
}  // namespace gradsync::gpu
