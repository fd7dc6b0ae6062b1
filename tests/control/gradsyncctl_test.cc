// Runs the real gradsyncctl binary (a separate process, real sockets):
// - against addresses where nothing answers: exit 3 and a clear message;
// - against an in-process gRPC server with a fake Control service and gRPC's
//   built-in health service: every command's output and exit code;
// - with bad command lines: exit 2.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/observe/flight_recorder.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/files.h"
#include "tests/testing/process.h"

namespace gradsync {
namespace {

using ::testing::HasSubstr;
using testing::ReadFile;
using testing::Runfile;
using testing::SpawnOptions;
using testing::TestTmpDir;

// gradsyncctl's own deadlines are seconds: this only ends a hung one.
constexpr auto kCtlBound = std::chrono::seconds(60);

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs gradsyncctl with `args`; GRADSYNC_ADDR is removed from the
// environment unless `env_addr` is given.
Result RunCtl(const std::vector<std::string>& args, const std::string* env_addr = nullptr) {
  static std::atomic<int> counter{0};
  const std::string base = absl::StrCat(TestTmpDir(), "/ctl.", counter++);
  const std::string out_path = base + ".out", err_path = base + ".err";

  SpawnOptions options;
  options.err_path = err_path;
  if (env_addr != nullptr) {
    options.env["GRADSYNC_ADDR"] = *env_addr;
  } else {
    options.unset_env.push_back("GRADSYNC_ADDR");
  }
  std::vector<std::string> argv = {Runfile("tools/gradsyncctl/gradsyncctl")};
  argv.insert(argv.end(), args.begin(), args.end());
  testing::Process ctl = testing::Process::Spawn(argv, out_path, options);
  Result r;
  if (!ctl.started()) {
    ADD_FAILURE() << ReadFile(out_path);
    return r;
  }
  const testing::ExitStatus status = ctl.Wait(kCtlBound);
  r.exit_code = status.exited ? status.code : 128 + status.code;
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

// A TCP port on loopback that is bound but not listening: connecting to it
// is refused, and no other process can take it while this object lives.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RefusingPort() { close(fd_); }
  std::string addr() const { return absl::StrCat("127.0.0.1:", port_); }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// ---- nothing answers --------------------------------------------------------

TEST(GradsyncctlUnreachable, RefusedConnectionExitsThreeWithAClearMessage) {
  RefusingPort port;
  const std::string expected = absl::StrCat("gradsyncctl: cannot reach gradsyncd at ", port.addr(),
                                            " (connection refused): is it running?");
  const std::string trace = TestTmpDir() + "/unreachable.json";
  for (const std::vector<std::string>& cmd :
       std::vector<std::vector<std::string>>{{"stats"},
                                             {"stats", "--json"},
                                             {"stats", "--prometheus"},
                                             {"health"},
                                             {"config", "get"},
                                             {"config", "set", "log_level=debug"},
                                             {"trace", "--out", trace},
                                             {"drain"}}) {
    std::vector<std::string> args = {"--addr", port.addr()};
    args.insert(args.end(), cmd.begin(), cmd.end());
    const Result r = RunCtl(args);
    SCOPED_TRACE(cmd[0]);
    EXPECT_EQ(r.exit_code, 3) << r.err;
    EXPECT_THAT(r.err, HasSubstr(expected));
    EXPECT_EQ(r.out, "");
  }
}

TEST(GradsyncctlUnreachable, HonorsGradsyncAddrAndFlagWins) {
  RefusingPort a, b;
  const std::string env = a.addr();
  Result r = RunCtl({"stats"}, &env);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("at " + a.addr() + " "));
  r = RunCtl({"--addr=" + b.addr(), "stats"}, &env);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("at " + b.addr() + " "));
}

TEST(GradsyncctlUnreachable, MissingUnixSocket) {
  const std::string addr = absl::StrCat("unix:/tmp/gradsyncctl-test-", getpid(), "-missing.sock");
  const Result r = RunCtl({"--addr", addr, "health"});
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_THAT(r.err, HasSubstr("cannot reach gradsyncd at " + addr + " (no such socket file)"));
}

TEST(GradsyncctlUnreachable, ListenerThatNeverSpeaksGrpcTimesOut) {
  // The kernel completes the TCP handshake (backlog) but no HTTP/2 server
  // ever answers: the channel never becomes ready.
  RefusingPort port;
  ASSERT_EQ(listen(port.fd(), 16), 0);
  const auto start = std::chrono::steady_clock::now();
  const Result r = RunCtl({"--addr", port.addr(), "--timeout-s", "0.5", "stats"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_THAT(r.err, HasSubstr("(no connection within 0.5s): is it running?"));
}

// ---- a fake daemon ----------------------------------------------------------

class FakeControl final : public v1::Control::Service {
 public:
  std::atomic<bool> fail_stats{false};
  std::atomic<int> delay_ms{0};
  std::atomic<bool> drained{false};
  std::mutex mu;
  std::map<std::string, std::string> last_set;

  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::GetStatsResponse* resp) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    if (fail_stats) {
      resp->mutable_error()->set_code(v1::STATE);
      resp->mutable_error()->set_message("no plan yet");
      return grpc::Status::OK;
    }
    v1::Stats* s = resp->mutable_stats();
    s->set_job_id("fake");
    s->set_backend("local");
    s->set_num_nodes(1);
    s->set_local_size(1);
    s->set_world_size(1);
    s->set_iterations(42);
    s->set_bytes_reduced(4096);
    v1::BucketStats* b = s->add_buckets();
    b->set_bytes(4096);
    b->set_tensor_count(2);
    b->set_count(42);
    b->mutable_total()->set_p50_us(7.5);
    return grpc::Status::OK;
  }

  grpc::Status GetConfig(grpc::ServerContext*, const v1::GetConfigRequest*,
                         v1::GetConfigResponse* resp) override {
    resp->mutable_config()->set_bucket_cap_mb(25);
    resp->mutable_config()->set_log_level("info");
    return grpc::Status::OK;
  }

  grpc::Status SetConfig(grpc::ServerContext*, const v1::SetConfigRequest* req,
                         v1::SetConfigResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu);
    last_set.clear();
    for (const auto& [k, v] : req->values()) last_set[k] = v;
    if (last_set.count("bogus")) {
      resp->mutable_error()->set_code(v1::INVALID_ARGUMENT);
      resp->mutable_error()->set_message("unknown config key 'bogus'");
      return grpc::Status::OK;
    }
    resp->mutable_config()->set_bucket_cap_mb(
        std::stod(last_set.count("bucket_cap_mb") ? last_set["bucket_cap_mb"] : "25"));
    resp->mutable_config()->set_version(2);
    return grpc::Status::OK;
  }

  grpc::Status GetTrace(grpc::ServerContext*, const v1::GetTraceRequest*,
                        v1::GetTraceResponse* resp) override {
    FlightRecorder r(64);
    r.Record({1000, 0, 0, kNoTensor, TraceEventType::kBucketFirstReady});
    r.Record({1100, 0, 0, 0, TraceEventType::kTrainerReady});
    r.Record({1200, 0, 0, kNoTensor, TraceEventType::kBucketLastReady});
    r.Record({1300, 0, 0, kNoTensor, TraceEventType::kBucketLaunch});
    r.Record({1400, 0, 0, kNoTensor, TraceEventType::kBucketLocalReduceDone});
    r.Record({1500, 0, 0, kNoTensor, TraceEventType::kBucketComplete});
    resp->set_trace_json(ToChromeTraceJson(r.Snapshot(), {}));
    return grpc::Status::OK;
  }

  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest*, v1::DrainResponse*) override {
    drained = true;
    return grpc::Status::OK;
  }
};

class GradsyncctlAgainstFakeDaemon : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&control_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    addr_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  Result Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {"--addr", addr_});
    return RunCtl(args);
  }

  FakeControl control_;
  std::unique_ptr<grpc::Server> server_;
  std::string addr_;
};

TEST_F(GradsyncctlAgainstFakeDaemon, StatsInThreeFormats) {
  Result r = Ctl({"stats"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("job fake"));
  EXPECT_THAT(r.out, HasSubstr("42 iterations"));
  EXPECT_THAT(r.out, HasSubstr("4.0 KiB"));

  r = Ctl({"stats", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(r.out.substr(r.out.size() - 2), "}\n");
  EXPECT_EQ(doc["iterations"], "42");
  EXPECT_EQ(doc["buckets"][0]["total"]["p50_us"], 7.5);

  r = Ctl({"stats", "--prometheus"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("# TYPE gradsync_iterations_total counter\n"));
  EXPECT_THAT(r.out, HasSubstr("gradsync_iterations_total{node=\"0\",job=\"fake\"} 42\n"));
}

TEST_F(GradsyncctlAgainstFakeDaemon, DaemonErrorExitsOne) {
  control_.fail_stats = true;
  const Result r = Ctl({"stats"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("gradsyncd at " + addr_ + ": STATE: no plan yet"));
  EXPECT_EQ(r.out, "");
}

TEST_F(GradsyncctlAgainstFakeDaemon, SlowDaemonExitsOneNotThree) {
  control_.delay_ms = 3000;
  const Result r = Ctl({"--timeout-s", "0.5", "stats"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("did not answer within 0.5s"));
}

TEST_F(GradsyncctlAgainstFakeDaemon, HealthFollowsTheServingStatus) {
  Result r = Ctl({"health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");

  server_->GetHealthCheckService()->SetServingStatus(false);
  r = Ctl({"health"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "NOT_SERVING\n");

  r = Ctl({"health", "no.such.Service"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "SERVICE_UNKNOWN\n");
}

TEST_F(GradsyncctlAgainstFakeDaemon, ConfigGetAndSet) {
  Result r = Ctl({"config", "get"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bucket_cap_mb=25\n"));
  EXPECT_THAT(r.out, HasSubstr("log_level=info\n"));

  r = Ctl({"config", "get", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["log_level"], "info");

  r = Ctl({"config", "set", "bucket_cap_mb=50", "log_level=a=b"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bucket_cap_mb=50\n"));
  EXPECT_THAT(r.out, HasSubstr("version=2\n"));
  {
    std::lock_guard<std::mutex> lock(control_.mu);
    EXPECT_EQ(control_.last_set,
              (std::map<std::string, std::string>{{"bucket_cap_mb", "50"}, {"log_level", "a=b"}}));
  }

  r = Ctl({"config", "set", "bogus=1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: unknown config key 'bogus'"));
}

TEST_F(GradsyncctlAgainstFakeDaemon, TraceToFileAndStdout) {
  const std::string path = TestTmpDir() + "/ctl-trace.json";
  Result r = Ctl({"trace", "--out", path});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("trace events to " + path));
  const nlohmann::json doc = nlohmann::json::parse(ReadFile(path));
  int spans = 0;
  for (const auto& e : doc["traceEvents"]) spans += e["ph"] == "X";
  EXPECT_EQ(spans, 4);  // bucket, wait for ready, reduce, local reduce

  r = Ctl({"trace", "--out", "-"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), doc);

  r = Ctl({"trace", "--out", TestTmpDir() + "/no/such/dir/trace.json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err,
              HasSubstr("cannot write " + TestTmpDir() + "/no/such/dir/trace.json: No such"));
}

TEST_F(GradsyncctlAgainstFakeDaemon, Drain) {
  const Result r = Ctl({"drain"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(control_.drained);
  EXPECT_THAT(r.out, HasSubstr("draining"));
}

// ---- usage ------------------------------------------------------------------

TEST(GradsyncctlUsage, BadCommandLinesExitTwo) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate"},
      {"stats", "--json", "--prometheus"},
      {"stats", "extra"},
      {"health", "a", "b"},
      {"config"},
      {"config", "get", "--prometheus"},
      {"config", "set"},
      {"config", "set", "novalue"},
      {"config", "set", "=1"},
      {"config", "set", "a=1", "a=2"},
      {"config", "frob"},
      {"trace"},
      {"trace", "--out"},
      {"drain", "--json"},
      {"--timeout-s", "0", "stats"},
      {"--timeout-s", "abc", "stats"},
      {"--timeout-s", "inf", "stats"},
      {"--timeout-s", "nan", "stats"},
      {"--addr"},
      {"--bogus", "stats"},
  };
  for (const auto& args : bad) {
    const Result r = RunCtl(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("gradsyncctl: ")) << joined;
    EXPECT_THAT(r.err, HasSubstr("--help for usage")) << joined;
  }
}

TEST(GradsyncctlUsage, HelpExitsZeroAndListsEveryCommand) {
  const Result r = RunCtl({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  for (const char* s :
       {"stats --json", "stats --prometheus", "health", "config get", "config set KEY=VALUE",
        "trace --out FILE.json", "drain", "--addr HOST:PORT", "GRADSYNC_ADDR", "--timeout-s",
        "3  the daemon cannot be reached"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
}

}  // namespace
}  // namespace gradsync
