// Runs the real gradsyncd binary: --help lists its flags with dashed names
// and their GRADSYNCD_* variables; the environment, --config FILE and
// --flagfile=FILE set flags (seen through the start-up validation, which
// exits 2 naming the flag and the value it got), in the documented order.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <utility>
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
                           "min-nodes",
                           "max-nodes",
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

// --help says what the leader's loss does, that an elastic job shrinks,
// and how nodes join; a --max-nodes above --num-nodes of a fixed job is
// refused at start naming the flags.
TEST(GradsyncdFlagsTest, MinAndMaxNodesAreListedAndAGrowingRangeIsRefused) {
  Result r = RunDaemon({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("--min-nodes (int, default \"0\""));
  EXPECT_THAT(r.out, HasSubstr("env GRADSYNCD_MAX_NODES)"));
  EXPECT_THAT(r.out, HasSubstr("the leader) hosts the rendezvous, so its loss ends the job"));
  EXPECT_THAT(r.out, HasSubstr("joins it at an iteration boundary"));
  EXPECT_THAT(r.out, HasSubstr("node 0's loss still ends the job"));

  r = RunDaemon(
      {"--num-nodes=3", "--node-rank=1", "--leader=192.0.2.1:7250", "--insecure", "--max-nodes=4"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("--max-nodes 4 above --num-nodes 3 needs an elastic job: give "
                               "--min-nodes below --num-nodes too"));
  r = RunDaemon({}, {{"GRADSYNCD_MAX_NODES", "0"}, {"GRADSYNCD_MIN_NODES", "5"}});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("--min-nodes 5 is not in [1, 1]"));
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

// An address that cannot be one is a flag error on any job, one node
// included (--host used to be taken as is, and only Gloo on a multi-node
// job would ever have tried it): exit 2 naming the flag and the value.
TEST(GradsyncdFlagsTest, MalformedAddressesAreRefusedNamingTheFlagAndValue) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--host=256.1.1.1", "--host 256.1.1.1 is not a valid host"},
      {"--host=1.2.3", "--host 1.2.3 is not a valid host"},
      {"--host=bad host", "--host bad host is not a valid host"},
      {"--listen=256.1.1.1:7250", "--listen 256.1.1.1:7250: host 256.1.1.1 is not"},
      {"--listen=127.0.0.1:70000", "--listen 127.0.0.1:70000 must be HOST:PORT"},
      {"--listen=::1:7250", "--listen ::1:7250: an IPv6 host must be [ADDRESS]:PORT"},
      {"--metrics-listen=300.0.0.1:9100", "--metrics-listen 300.0.0.1:9100: host 300.0.0.1 is not"},
  };
  for (const auto& [arg, named] : cases) {
    const Result r = RunDaemon({arg});
    EXPECT_EQ(r.exit_code, 2) << arg << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(named)) << arg;
  }
}

// Node 0 may share every node's --leader only if it names node 0 itself;
// one naming another host or port is refused before anything binds.
TEST(GradsyncdFlagsTest, NodeZeroWithALeaderNamingAnotherDaemonIsRefused) {
  const std::vector<std::string> node0 = {"--num-nodes=2", "--node-rank=0",
                                          "--listen=127.0.0.1:7250", "--insecure"};
  std::vector<std::string> args = node0;
  args.push_back("--leader=192.0.2.1:7250");  // TEST-NET-1: never this host
  Result r = RunDaemon(args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("--node-rank 0 hosts the rendezvous on its --listen "
                               "127.0.0.1:7250, so its --leader must name this daemon"));
  EXPECT_THAT(r.err, HasSubstr("--leader 192.0.2.1:7250 names another host (it resolves to "
                               "192.0.2.1, none of them this host's)"));

  args = node0;
  args.push_back("--leader=127.0.0.1:7251");  // this host, another daemon's port
  r = RunDaemon(args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.err, HasSubstr("--leader 127.0.0.1:7251 names port 7251, not --listen's"));
}

// What the kubelet writes for a Secret volume with fsGroup: DIR/token ->
// ..data/token, DIR/..data -> ..<timestamp>/, the file group-readable.
std::string SecretVolumeToken(const std::string& name, mode_t mode) {
  const std::string dir = absl::StrCat(TestTmpDir(), "/", name);
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0);
  EXPECT_EQ(mkdir((dir + "/..2026_11_23_07_00_00.42").c_str(), 0755), 0);
  const std::string file = dir + "/..2026_11_23_07_00_00.42/token";
  std::ofstream(file) << "s3cret\n";
  EXPECT_EQ(chmod(file.c_str(), mode), 0);
  EXPECT_EQ(symlink("..2026_11_23_07_00_00.42", (dir + "/..data").c_str()), 0);
  EXPECT_EQ(symlink("..data/token", (dir + "/token").c_str()), 0);
  return dir + "/token";
}

TEST(GradsyncdFlagsTest, GroupReadableTokenInASecretVolumeIsReadWorldReadableRefused) {
  // Read, then the start stops at the next check (--num-nodes 0): the token passed.
  const std::string ok = SecretVolumeToken("secret-0440", 0440);
  Result r = RunDaemon({"--job-token-file=" + ok, "--num-nodes=0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--num-nodes 0 is not in [1, 4096]"));
  EXPECT_THAT(r.err, Not(HasSubstr("token file")));

  const std::string world = SecretVolumeToken("secret-0444", 0444);
  r = RunDaemon({"--job-token-file=" + world, "--num-nodes=0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat("--job-token-file: token file ", world,
                                            " has mode 0444: others or a writing group")));
}

}  // namespace
}  // namespace gradsync
