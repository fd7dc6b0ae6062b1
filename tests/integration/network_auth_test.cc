// The daemon's network boundary, end to end: real gradsyncd
// processes, real trainers, the real gradsyncctl, real gRPC and TLS.
//
//  - Drain and SetConfig without the job token (or with a wrong one) are
//    refused UNAUTHENTICATED naming the RPC while the job keeps training;
//    with --token-file they work;
//  - a daemon refuses to start (exit 2, one line naming the flag or file)
//    when it would be open: several nodes without a token, a token file
//    others may read, an empty one, a non-loopback --listen without a token;
//  - with TLS on, a plaintext client and a client of another CA are refused,
//    and a certificate of the job's CA replaces the token;
//  - the token does not appear in the bytes between a node and its leader
//    once TLS is on (a recording TCP proxy sits between them); without TLS
//    it does, which is why multi-node jobs across untrusted networks need TLS.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/call_token.h"
#include "common/tls_credentials.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/recording_proxy.h"
#include "tests/integration/test_pki.h"
#include "tests/testing/wait.h"

namespace gradsync::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr auto kBound = seconds(40);
constexpr char kToken[] = "tok-5e1f0c2a9b7d4e3f8a6c1b0d2e4f6a8c";

struct CtlResult {
  int code = -1;  // exit code; -1 if killed or not started
  std::string out, err;
};

// Runs the real gradsyncctl against `addr`; stdout and stderr kept apart.
CtlResult RunCtl(const std::string& addr, const std::vector<std::string>& args,
                 const std::map<std::string, std::string>& env = {}) {
  static int counter = 0;
  const std::string base = absl::StrCat(TestTmpDir(), "/ctl.", getpid(), ".", counter++);
  std::vector<std::string> argv = {Runfile("tools/gradsyncctl/gradsyncctl"), "--addr=" + addr};
  argv.insert(argv.end(), args.begin(), args.end());
  SpawnOptions options;
  options.err_path = base + ".err";
  options.env = env;
  options.unset_env = {"GRADSYNC_TOKEN_FILE"};
  if (env.count("GRADSYNC_TOKEN_FILE") != 0) options.unset_env.clear();
  Process ctl = Process::Spawn(argv, base + ".out", options);
  const ExitStatus status = ctl.Wait(kBound);
  CtlResult r;
  if (status.exited) r.code = status.code;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  return r;
}

std::shared_ptr<grpc::Channel> Channel(const std::string& addr, const TlsFiles& tls = {}) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  return grpc::CreateCustomChannel(addr, MakeChannelCredentials(tls).value(), args);
}

// GetStats over `channel`: the gRPC status, and the iterations when OK.
grpc::Status Stats(const std::shared_ptr<grpc::Channel>& channel, uint64_t* iterations = nullptr) {
  auto stub = v1::Control::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
  v1::GetStatsResponse resp;
  const grpc::Status st = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
  if (st.ok() && iterations != nullptr) *iterations = resp.stats().iterations();
  return st;
}

// Polls GetStats until the daemon counted more than `iterations`.
bool WaitForIterationsAbove(const std::string& addr, uint64_t iterations) {
  auto channel = Channel(addr);
  return WaitUntil(
      [&] {
        uint64_t now = 0;
        return Stats(channel, &now).ok() && now > iterations;
      },
      kBound);
}

uint64_t Iterations(const std::string& addr) {
  uint64_t n = 0;
  EXPECT_TRUE(Stats(Channel(addr), &n).ok());
  return n;
}

std::string StartedAddr(Daemon& daemon) {
  if (!daemon.WaitReady(seconds(10))) return "";
  const int port = daemon.ListenPort(seconds(10));
  return port > 0 ? absl::StrCat("127.0.0.1:", port) : "";
}

// ---- the token on Control ---------------------------------------------------

TEST(NetworkAuth, DrainAndSetConfigWithoutTheTokenAreRefusedWhileTheJobKeepsTraining) {
  ScratchDir secrets;
  const std::string token_file = secrets.File("token");
  ASSERT_TRUE(WriteTokenFile(token_file, kToken));
  const std::string wrong_file = secrets.File("wrong");
  ASSERT_TRUE(WriteTokenFile(wrong_file, "not-the-job-token"));
  Daemon daemon(2, {"--job-token-file=" + token_file});
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  std::vector<Process> trainers;
  for (int r = 0; r < 2; ++r) trainers.push_back(StartTrainer(daemon, r, {"--steps=1000000"}, ""));
  ASSERT_TRUE(WaitForIterationsAbove(addr, 2)) << daemon.process().Log();

  // gradsyncctl without a token, then with a wrong one.
  const CtlResult drain = RunCtl(addr, {"drain"});
  EXPECT_EQ(drain.code, 1) << drain.err;
  EXPECT_THAT(drain.err, HasSubstr("refused the call: Control.Drain refused: the call carries "
                                   "no job token"));
  const CtlResult quiet = RunCtl(addr, {"config", "set", "log_level=off"});
  EXPECT_EQ(quiet.code, 1) << quiet.err;
  EXPECT_THAT(quiet.err, HasSubstr("Control.SetConfig refused: the call carries no job token"));
  const CtlResult wrong = RunCtl(addr, {"--token-file=" + wrong_file, "drain"});
  EXPECT_EQ(wrong.code, 1) << wrong.err;
  EXPECT_THAT(wrong.err, HasSubstr("Control.Drain refused: the job token does not match"));
  // Tokens as long as the job's that differ in one byte only, at the end and
  // in the middle: a comparison that stops early or checks only a prefix or
  // the length lets these through.
  for (const size_t at : {sizeof(kToken) - 2, sizeof(kToken) / 2}) {
    std::string near_miss = kToken;
    near_miss[at] = near_miss[at] == 'x' ? 'y' : 'x';
    const std::string near_file = secrets.File("near-" + std::to_string(at));
    ASSERT_TRUE(WriteTokenFile(near_file, near_miss));
    const CtlResult near = RunCtl(addr, {"--token-file=" + near_file, "drain"});
    EXPECT_EQ(near.code, 1) << "byte " << at << ": " << near.err;
    EXPECT_THAT(near.err, HasSubstr("Control.Drain refused: the job token does not match"));
  }

  // The raw RPC: gRPC status UNAUTHENTICATED, nothing in the body.
  {
    auto stub = v1::Control::NewStub(Channel(addr));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    v1::SetConfigRequest req;
    (*req.mutable_values())["bucket_cap_mb"] = "1";
    v1::SetConfigResponse resp;
    const grpc::Status st = stub->SetConfig(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(st.error_message(), HasSubstr("Control.SetConfig refused"));
  }

  // Nothing changed: the job trains on, at the same log level.
  const uint64_t after_refusals = Iterations(addr);
  EXPECT_TRUE(WaitForIterationsAbove(addr, after_refusals + 3)) << daemon.process().Log();
  EXPECT_TRUE(daemon.process().Running());
  const CtlResult config = RunCtl(addr, {"config", "get"});
  EXPECT_THAT(config.out, HasSubstr("log_level=info"));
  EXPECT_THAT(config.out, HasSubstr("bucket_cap_mb=25"));
  const std::string log = daemon.process().Log();
  EXPECT_THAT(log, HasSubstr("event=call_refused rpc=Control.Drain"));
  EXPECT_THAT(log, HasSubstr("event=call_refused rpc=Control.SetConfig"));
  EXPECT_THAT(log, Not(HasSubstr(kToken)));
  EXPECT_THAT(log, Not(HasSubstr("not-the-job-token")));

  // With the token (flag or environment) both work.
  const CtlResult set = RunCtl(addr, {"config", "set", "stall_threshold_s=30"},
                               {{"GRADSYNC_TOKEN_FILE", token_file}});
  EXPECT_EQ(set.code, 0) << set.err;
  EXPECT_THAT(set.out, HasSubstr("stall_threshold_s=30"));
  const CtlResult drained = RunCtl(addr, {"--token-file=" + token_file, "drain"});
  EXPECT_EQ(drained.code, 0) << drained.err;
  const ExitStatus d = daemon.process().Wait(kBound);
  EXPECT_TRUE(d.exited && d.code == 0) << d.ToString() << "\n" << daemon.process().Log();
}

// --require-auth-for-reads: Control's reads need the token too; health
// stays open for probes, which carry none.
TEST(NetworkAuth, RequireAuthForReadsClosesControlReadsButNotHealth) {
  ScratchDir secrets;
  const std::string token_file = secrets.File("token");
  ASSERT_TRUE(WriteTokenFile(token_file, kToken));
  Daemon daemon(1, {"--job-token-file=" + token_file, "--require-auth-for-reads"});
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  const grpc::Status anonymous = Stats(Channel(addr));
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(), HasSubstr("Control.GetStats refused"));
  const CtlResult config = RunCtl(addr, {"config", "get"});
  EXPECT_EQ(config.code, 1) << config.err;
  EXPECT_THAT(config.err, HasSubstr("Control.GetConfig refused"));
  const CtlResult with_token = RunCtl(addr, {"--token-file=" + token_file, "stats", "--json"});
  EXPECT_EQ(with_token.code, 0) << with_token.err;
  const CtlResult health = RunCtl(addr, {"health"});
  EXPECT_EQ(health.code, 0) << health.err;
  EXPECT_THAT(health.out, HasSubstr("SERVING"));
}

// gradsyncctl refuses a token file others may read, as the daemon does.
TEST(NetworkAuth, GradsyncctlRefusesAnOpenTokenFile) {
  ScratchDir secrets;
  const std::string token_file = secrets.File("token");
  ASSERT_TRUE(WriteTokenFile(token_file, kToken));
  ASSERT_EQ(chmod(token_file.c_str(), 0644), 0);
  const CtlResult r = RunCtl("127.0.0.1:1", {"--token-file=" + token_file, "drain"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("token file " + token_file + " has mode 0644"));
}

// ---- refusing to start ------------------------------------------------------

// Starts a daemon expected to refuse: exit 2 before binding anything, its
// one line holding every piece of `parts`.
void ExpectRefusesToStart(const std::vector<std::string>& args,
                          const std::vector<std::string>& parts) {
  Daemon daemon(1, args);
  const ExitStatus st = daemon.process().Wait(seconds(10));
  EXPECT_TRUE(st.exited && st.code == 2) << st.ToString() << "\n" << daemon.process().Log();
  for (const std::string& part : parts) {
    EXPECT_THAT(daemon.process().Log(), HasSubstr(part));
  }
  EXPECT_NE(access(daemon.socket().c_str(), F_OK), 0) << "the socket was created";
}

TEST(NetworkAuth, DaemonsThatWouldBeOpenRefuseToStart) {
  ScratchDir secrets;
  // Several nodes, no token: before, a stranger could join as node 1.
  ExpectRefusesToStart({"--num-nodes=2", "--node-rank=0", "--job-id=j"},
                       {"--num-nodes 2 needs --job-token-file", "--insecure"});
  ExpectRefusesToStart({"--num-nodes=2", "--node-rank=1", "--leader=127.0.0.1:1", "--job-id=j"},
                       {"--num-nodes 2 needs --job-token-file"});
  const std::string open_file = secrets.File("open");
  ASSERT_TRUE(WriteTokenFile(open_file, kToken));
  ASSERT_EQ(chmod(open_file.c_str(), 0644), 0);
  ExpectRefusesToStart({"--num-nodes=2", "--node-rank=0", "--job-token-file=" + open_file},
                       {"--job-token-file: token file " + open_file + " has mode 0644"});
  const std::string blank_file = secrets.File("blank");
  ASSERT_TRUE(WriteTokenFile(blank_file, "  \n"));
  ExpectRefusesToStart({"--num-nodes=2", "--node-rank=0", "--job-token-file=" + blank_file},
                       {"token file " + blank_file + " is empty or holds only whitespace"});
  // One node reachable from other hosts, no token.
  ExpectRefusesToStart({"--listen=0.0.0.0:0"},
                       {"--listen 0.0.0.0:0 is reachable from other hosts"});

  // --insecure starts, and says so at start.
  Daemon insecure(1, {"--num-nodes=2", "--node-rank=0", "--job-id=j", "--insecure"});
  ASSERT_TRUE(insecure.WaitReady(seconds(10))) << insecure.process().Log();
  EXPECT_THAT(insecure.process().Log(), HasSubstr("level=warning"));
  EXPECT_THAT(insecure.process().Log(), HasSubstr("event=network_auth mode=insecure"));
}

// ---- TLS --------------------------------------------------------------------

class NetworkTls : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status generated = pki_.Generate();
    ASSERT_TRUE(generated.ok()) << generated;
  }
  std::vector<std::string> DaemonTls() const {
    return {"--tls-cert=" + pki_.File("node.pem"), "--tls-key=" + pki_.File("node.key"),
            "--tls-ca=" + pki_.File("ca.pem")};
  }
  TlsFiles Operator() const {
    return {pki_.File("operator.pem"), pki_.File("operator.key"), pki_.File("ca.pem")};
  }
  TestPki pki_;
};

TEST_F(NetworkTls, PlaintextAndOtherCaClientsAreRefusedAndTheJobsCaCertificateReplacesTheToken) {
  Daemon daemon(1, DaemonTls());
  const std::string addr = StartedAddr(daemon);
  ASSERT_FALSE(addr.empty()) << daemon.process().Log();
  EXPECT_THAT(daemon.process().Log(), HasSubstr("tls=on"));

  // A certificate of the job's CA: accepted (the test can fail).
  EXPECT_TRUE(Stats(Channel(addr, Operator())).ok());
  // Plaintext: no TLS handshake, no call.
  const grpc::Status plain = Stats(Channel(addr));
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
  // A client certificate another CA signed: the handshake fails.
  const grpc::Status stranger = Stats(
      Channel(addr, {pki_.File("stranger.pem"), pki_.File("stranger.key"), pki_.File("ca.pem")}));
  EXPECT_EQ(stranger.error_code(), grpc::StatusCode::UNAVAILABLE) << stranger.error_message();
  // No client certificate at all, even trusting the right CA.
  const grpc::Status anonymous = Stats(Channel(addr, {"", "", pki_.File("ca.pem")}));
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAVAILABLE) << anonymous.error_message();
  // A client that trusts another CA does not accept the daemon.
  const grpc::Status distrust = Stats(Channel(
      addr, {pki_.File("operator.pem"), pki_.File("operator.key"), pki_.File("other-ca.pem")}));
  EXPECT_EQ(distrust.error_code(), grpc::StatusCode::UNAVAILABLE) << distrust.error_message();

  // gradsyncctl: plaintext cannot reach it; with the operator's certificate
  // (no token) it may drain.
  const CtlResult plain_ctl = RunCtl(addr, {"stats"});
  EXPECT_EQ(plain_ctl.code, 3) << plain_ctl.err;
  EXPECT_TRUE(daemon.process().Running()) << daemon.process().Log();
  const CtlResult drain =
      RunCtl(addr, {"--tls-ca=" + pki_.File("ca.pem"), "--tls-cert=" + pki_.File("operator.pem"),
                    "--tls-key=" + pki_.File("operator.key"), "drain"});
  EXPECT_EQ(drain.code, 0) << drain.err;
  const ExitStatus d = daemon.process().Wait(kBound);
  EXPECT_TRUE(d.exited && d.code == 0) << d.ToString() << "\n" << daemon.process().Log();
}

// A two-node job whose node 1 reaches the leader through a recording proxy.
// Returns what the proxy carried; the trainers must finish.
std::string RecordTwoNodeJob(const std::vector<std::string>& tls, const std::string& token_file) {
  const std::vector<std::string> common = {"--num-nodes=2", "--job-id=capture",
                                           "--job-token-file=" + token_file, "--timeout-s=20"};
  std::vector<std::string> lead = common;
  lead.push_back("--node-rank=0");
  lead.insert(lead.end(), tls.begin(), tls.end());
  Daemon leader(1, lead);
  const std::string leader_addr = StartedAddr(leader);
  EXPECT_FALSE(leader_addr.empty()) << leader.process().Log();
  if (leader_addr.empty()) return "";
  RecordingProxy proxy(leader.ListenPort(seconds(1)));
  EXPECT_GT(proxy.port(), 0);
  std::vector<std::string> follow = common;
  follow.insert(follow.end(), {"--node-rank=1", absl::StrCat("--leader=127.0.0.1:", proxy.port())});
  follow.insert(follow.end(), tls.begin(), tls.end());
  Daemon follower(1, follow);
  EXPECT_TRUE(follower.WaitReady(seconds(10))) << follower.process().Log();
  std::vector<Process> trainers;
  trainers.push_back(StartTrainer(leader, 0, {"--steps=3"}, ""));
  trainers.push_back(StartTrainer(follower, 0, {"--steps=3"}, ""));
  for (auto& t : trainers) {
    const ExitStatus st = t.Wait(kBound);
    EXPECT_TRUE(st.exited && st.code == 0) << t.Log() << "\nleader:\n"
                                           << leader.process().Log() << "\nfollower:\n"
                                           << follower.process().Log();
  }
  return proxy.Recorded();
}

TEST_F(NetworkTls, TheTokenIsNotInTheBytesBetweenANodeAndItsLeaderWithTls) {
  ScratchDir secrets;
  const std::string token_file = secrets.File("token");
  ASSERT_TRUE(WriteTokenFile(token_file, kToken));

  const std::string encrypted = RecordTwoNodeJob(DaemonTls(), token_file);
  // The proxy carried the rendezvous (a TLS handshake record first)...
  ASSERT_GT(encrypted.size(), 1000u);
  EXPECT_EQ(encrypted[0], '\x16') << "not a TLS handshake record";
  // ...and neither the token nor anything else readable of the job.
  EXPECT_EQ(encrypted.find(kToken), std::string::npos) << "the token crossed the wire in clear";
  EXPECT_EQ(encrypted.find("gradsync.v1.Rendezvous"), std::string::npos);

  // Without TLS the same job shows its token to anyone on the path: what
  // the docs warn about, and proof that the proxy sees the metadata.
  const std::string plain = RecordTwoNodeJob({}, token_file);
  EXPECT_NE(plain.find(kToken), std::string::npos);
}

}  // namespace
}  // namespace gradsync::testing
