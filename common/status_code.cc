#include "common/status_code.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"

namespace gradsync {
namespace {

constexpr char kPayloadUrl[] = "type.googleapis.com/gradsync.v1.Code";

absl::StatusCode AbslCodeFor(v1::Code code) {
  switch (code) {
    case v1::OK:
      return absl::StatusCode::kOk;
    case v1::INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case v1::UNAVAILABLE:
      return absl::StatusCode::kUnavailable;
    case v1::MISMATCH:
      return absl::StatusCode::kFailedPrecondition;
    case v1::PEER_FAILED:
      return absl::StatusCode::kAborted;
    case v1::TIMEOUT:
      return absl::StatusCode::kDeadlineExceeded;
    case v1::STATE:
      return absl::StatusCode::kFailedPrecondition;
    case v1::RESOURCE_EXHAUSTED:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status MakeError(v1::Code code, absl::string_view message) {
  if (code == v1::OK) code = v1::INTERNAL;
  absl::Status status(AbslCodeFor(code), message);
  status.SetPayload(kPayloadUrl, absl::Cord(std::to_string(static_cast<int>(code))));
  return status;
}

v1::Code CodeOf(const absl::Status& status) {
  if (status.ok()) return v1::OK;
  if (auto payload = status.GetPayload(kPayloadUrl)) {
    int value = 0;
    if (absl::SimpleAtoi(std::string(*payload), &value) && v1::Code_IsValid(value) &&
        value != v1::OK) {
      return static_cast<v1::Code>(value);
    }
  }
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    // A missing or wrong job token (or certificate) is this node's
    // configuration, not a failure of the peer that refused it.
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kDataLoss:
      return v1::INVALID_ARGUMENT;
    case absl::StatusCode::kUnavailable:
      return v1::UNAVAILABLE;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      return v1::PEER_FAILED;
    case absl::StatusCode::kDeadlineExceeded:
      return v1::TIMEOUT;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
      return v1::STATE;
    case absl::StatusCode::kResourceExhausted:
      return v1::RESOURCE_EXHAUSTED;
    default:
      return v1::INTERNAL;
  }
}

void ToProto(const absl::Status& status, v1::Error* out) {
  out->set_code(CodeOf(status));
  out->set_message(std::string(status.message()));
}

absl::Status FromProto(const v1::Error& error) {
  if (error.code() == v1::OK) return absl::OkStatus();
  return MakeError(error.code(), error.message());
}

}  // namespace gradsync
