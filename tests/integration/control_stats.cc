#include "tests/integration/control_stats.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/call_token.h"
#include "gradsync/v1/control.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace gradsync::testing {

absl::StatusOr<v1::Stats> GetStats(int port, const std::string& token) {
  auto stub = v1::Control::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) AttachCallToken(&context, token);
  v1::GetStatsResponse response;
  const grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("GetStats: ", status.error_message()));
  }
  return response.stats();
}

absl::Status SetBucketCaps(int port, const std::string& token, const std::string& cap_mb,
                           const std::string& first_cap_mb) {
  auto stub = v1::Control::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  v1::SetConfigRequest request;
  (*request.mutable_values())["bucket_cap_mb"] = cap_mb;
  (*request.mutable_values())["first_bucket_cap_mb"] = first_cap_mb;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) AttachCallToken(&context, token);
  v1::SetConfigResponse response;
  const grpc::Status status = stub->SetConfig(&context, request, &response);
  if (!status.ok() || response.error().code() != v1::OK) {
    return absl::UnknownError(
        absl::StrCat("SetConfig: ", status.error_message(), " ", response.error().message()));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::testing
