// Runs the real gradsyncd binary: --help lists its flags with dashed names
// and their GRADSYNCD_* variables; the environment, --config FILE and
// --flagfile=FILE set flags (seen through the start-up validation, which
// exits 2 naming the flag and the value it got), in the documented order.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFile;
using testing::Runfile;
using testing::SpawnOptions;
using testing::TestTmpDir;

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// A flag error ends gradsyncd before it binds anything: this only ends a hung one.
constexpr auto kBound = std::chrono::seconds(30);

Result RunDaemon(const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env = {}) {
  static std::atomic<int> counter{0};
  const int n = counter++;
  const std::string base = absl::StrCat(TestTmpDir(), "/gradsyncd.", n);
  SpawnOptions options;
  options.err_path = base + ".err";
  options.env = env;
  // Short (unix socket paths are < 108 bytes); never bound: every case here
  // stops at the flags.
  const std::string socket = absl::StrCat("/tmp/gsflags.", getpid(), ".", n, ".sock");
  std::vector<std::string> argv = {Runfile("daemon/gradsyncd"), "--socket=" + socket, "--listen="};
  argv.insert(argv.end(), args.begin(), args.end());
  testing::Process daemon = testing::Process::Spawn(argv, base + ".out", options);
  Result r;
  if (!daemon.started()) {
    ADD_FAILURE() << ReadFile(base + ".out");
    return r;
  }
  const testing::ExitStatus status = daemon.Wait(kBound);
  r.exit_code = status.exited ? status.code : 128 + status.code;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(options.err_path);
  return r;
}

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(TestTmpDir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

TEST(GradsyncdFlagsTest, HelpListsEveryFlagWithDashedNameAndVariable) {
  const Result r = RunDaemon({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("No flags matched")));
  for (const char* name : {"socket",
                           "listen",
                           "leader",
                           "node-rank",
                           "num-nodes",
                           "local-size",
                           "backend",
                           "host",
                           "bucket-cap-mb",
                           "first-bucket-cap-mb",
                           "job-id",
                           "job-token-file",
                           "insecure",
                           "require-auth-for-reads",
                           "tls-cert",
                           "tls-key",
                           "tls-ca",
                           "timeout-s",
                           "stall-threshold-s",
                           "log-level",
                           "shm-prefix",
                           "shm-group",
                           "reduce-threads",
                           "wire-dtype",
                           "log-format",
                           "trace-file"}) {
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("  --", name, " ("))) << name;
  }
  EXPECT_THAT(r.out, HasSubstr("env GRADSYNCD_FIRST_BUCKET_CAP_MB)"));
  EXPECT_THAT(r.out, HasSubstr("--num-nodes (int, default \"1\""));
  EXPECT_THAT(r.out, Not(HasSubstr("--node_rank")));
  // --helpfull (Abseil's own listing) keeps underscored names: --help says so.
  EXPECT_THAT(r.out, HasSubstr("--helpfull is Abseil's raw listing"));
}

TEST(GradsyncdFlagsTest, AutotuneIsADashedBoolFlagOffByDefaultWithItsVariable) {
  const Result r = RunDaemon({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  --autotune (bool, default \"false\""));
  EXPECT_THAT(r.out, HasSubstr("env GRADSYNCD_AUTOTUNE)"));
}

TEST(GradsyncdFlagsTest, EnvironmentSetsIntDoubleAndStringFlags) {
  Result r = RunDaemon({}, {{"GRADSYNCD_NUM_NODES", "0"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--num-nodes 0 is not in [1, 4096]"));

  r = RunDaemon({}, {{"GRADSYNCD_FIRST_BUCKET_CAP_MB", "0"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--first-bucket-cap-mb 0 is not in (0, 4096]"));

  r = RunDaemon({}, {{"GRADSYNCD_BACKEND", "mpi"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--backend mpi must be auto, gloo, nccl or local"));

  r = RunDaemon({}, {{"GRADSYNCD_WIRE_DTYPE", "int8"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--wire-dtype 'int8' is not one of off, bf16, fp16"));
}

TEST(GradsyncdFlagsTest, ConfigFileTakesDashedNamesInEitherSpelling) {
  const std::string path = WriteConfig(
      "dashed.conf", "# a comment, then a blank line\n\n--num-nodes=3\n  --node-rank 5\n");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--config", path}, {"--config=" + path}, {"--flagfile=" + path}}) {
    const Result r = RunDaemon(args);
    EXPECT_EQ(r.exit_code, 2) << args[0];
    EXPECT_THAT(r.err, HasSubstr("--node-rank 5 is not in [0, 3)")) << args[0];
  }
  const Result from_env = RunDaemon({}, {{"GRADSYNCD_CONFIG", path}});
  EXPECT_EQ(from_env.exit_code, 2);
  EXPECT_THAT(from_env.err, HasSubstr("--node-rank 5 is not in [0, 3)"));
}

TEST(GradsyncdFlagsTest, CommandLineBeatsEnvironmentBeatsConfigFile) {
  const std::string path = WriteConfig("backend.conf", "--backend=from-file\n");
  Result r = RunDaemon({"--config", path});
  EXPECT_THAT(r.err, HasSubstr("--backend from-file must be"));
  r = RunDaemon({"--config", path}, {{"GRADSYNCD_BACKEND", "from-env"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--backend from-env must be"));
  r = RunDaemon({"--config", path, "--backend", "from-cli"}, {{"GRADSYNCD_BACKEND", "from-env"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--backend from-cli must be"));
}

TEST(GradsyncdFlagsTest, BadSourcesAreRefusedNamingThem) {
  Result r = RunDaemon({}, {{"GRADSYNCD_OPTS", "--listen 127.0.0.1:7250"}});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("environment variable GRADSYNCD_OPTS names no gradsyncd flag"));

  const std::string missing = TestTmpDir() + "/no-such.conf";
  r = RunDaemon({"--config", missing});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--config ", missing, ": cannot read it")));

  const std::string bad = WriteConfig("bad.conf", "--num-nodes=2\nnum-nodes 3\n");
  r = RunDaemon({"--config", bad});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(bad, ":2: 'num-nodes 3' is not --flag=value")));
}

// --metrics-listen: a malformed address is a flag error (exit 2); a port
// already taken fails the start (exit 1); both name the flag and address.
TEST(GradsyncdFlagsTest, MetricsListenErrorsNameTheFlag) {
  Result r = RunDaemon({"--metrics-listen", "127.0.0.1:http"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--metrics-listen 127.0.0.1:http must be HOST:PORT"));

  const int taken = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(taken, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(taken, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string busy = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  r = RunDaemon({"--metrics-listen", busy});
  close(taken);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.out + r.err, HasSubstr(absl::StrCat("cannot listen on --metrics-listen ", busy)));
}

}  // namespace
}  // namespace gradsync
