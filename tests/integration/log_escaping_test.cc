// The daemon's key=value log lines hold text from outside (tensor names,
// reasons sent by peers) escaped: a reason with a quote, a newline and a
// forged " key=value" stays inside its field, one event per line, and
// ParseLogFields gets it back verbatim.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/call_token.h"
#include "common/log_fields.h"
#include "gradsync/v1/rendezvous.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/harness.h"

namespace gradsync::testing {
namespace {

using std::chrono::seconds;

constexpr char kPrefixEnd[] = "component=gradsyncd ";

TEST(LogEscaping, PeerReasonWithQuoteAndNewlineStaysInOneParseableLine) {
  ScratchDir dir;
  const std::string token_file = dir.File("token");
  ASSERT_TRUE(WriteTokenFile(token_file, "s3cret"));
  // A leader waiting for its job: node 1's Leave is logged with its reason.
  Daemon daemon(1, {"--num-nodes=2", "--node-rank=0", "--listen=127.0.0.1:0", "--job-id=escjob",
                    "--job-token-file=" + token_file});
  ASSERT_TRUE(daemon.WaitReady(seconds(10))) << daemon.process().Log();
  const int port = daemon.ListenPort(seconds(10));
  ASSERT_GT(port, 0) << daemon.process().Log();

  const std::string reason = "disk \"full\"\nlevel=critical forged=yes";
  auto stub = v1::Rendezvous::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  v1::LeaveRequest request;
  request.mutable_job()->set_job_id("escjob");
  request.set_node_rank(1);
  request.set_reason(reason);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + seconds(20));
  AttachCallToken(&context, "s3cret");
  v1::LeaveResponse response;
  const grpc::Status status = stub->Leave(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(WaitForLog(daemon.process(), "event=leave node_rank=1", seconds(20)))
      << daemon.process().Log();
  daemon.Stop();

  const std::string log = daemon.process().Log();
  int leave_lines = 0;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    const size_t prefix = line.find(kPrefixEnd);
    // Every line is a whole event: timestamp, level, component, fields.
    ASSERT_NE(prefix, absl::string_view::npos) << "not one event per line: [" << line << "]\n"
                                               << log;
    const LogFields fields = ParseLogFields(line.substr(prefix + sizeof(kPrefixEnd) - 1));
    ASSERT_FALSE(fields.empty()) << line;
    for (const auto& [key, value] : fields) EXPECT_NE(key, "forged") << line;
    if (fields[0].second != "leave") continue;
    ++leave_lines;
    ASSERT_EQ(fields.back().first, "reason") << line;
    EXPECT_EQ(fields.back().second, reason) << line;
  }
  EXPECT_EQ(leave_lines, 1) << log;
}

}  // namespace
}  // namespace gradsync::testing
