// The one translation between absl::Status and gradsync.v1.Code (the code
// every trainer sees as a gs_status): pinned row by row, so a changed row
// shows up here and not as a trainer told the wrong thing.
#include "common/status_code.h"

#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace gradsync {
namespace {

struct AbslRow {
  absl::StatusCode absl_code;
  v1::Code gradsync_code;
};

// A status made by code outside gradsync (gRPC, absl, Gloo wrappers) carries
// no gradsync code: its absl code decides.
TEST(StatusCode, EveryAbslCodeMapsToItsGradsyncCode) {
  const AbslRow rows[] = {
      {absl::StatusCode::kCancelled, v1::PEER_FAILED},
      {absl::StatusCode::kUnknown, v1::INTERNAL},
      {absl::StatusCode::kInvalidArgument, v1::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded, v1::TIMEOUT},
      {absl::StatusCode::kNotFound, v1::STATE},
      {absl::StatusCode::kAlreadyExists, v1::STATE},
      {absl::StatusCode::kPermissionDenied, v1::STATE},
      {absl::StatusCode::kResourceExhausted, v1::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition, v1::STATE},
      {absl::StatusCode::kAborted, v1::PEER_FAILED},
      {absl::StatusCode::kOutOfRange, v1::INVALID_ARGUMENT},
      {absl::StatusCode::kUnimplemented, v1::INTERNAL},
      {absl::StatusCode::kInternal, v1::INTERNAL},
      {absl::StatusCode::kUnavailable, v1::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, v1::INVALID_ARGUMENT},
      {absl::StatusCode::kUnauthenticated, v1::INVALID_ARGUMENT},
  };
  EXPECT_EQ(CodeOf(absl::OkStatus()), v1::OK);
  for (const AbslRow& row : rows) {
    const absl::Status status(row.absl_code, "from elsewhere");
    EXPECT_EQ(CodeOf(status), row.gradsync_code) << status;
  }
}

// MakeError's code survives: MISMATCH and STATE share an absl code, and the
// payload keeps them apart through ToProto/FromProto, as on the wire.
TEST(StatusCode, EveryGradsyncCodeSurvivesTheWire) {
  for (int value = v1::Code_MIN; value <= v1::Code_MAX; ++value) {
    if (!v1::Code_IsValid(value) || value == v1::OK) continue;
    const v1::Code code = static_cast<v1::Code>(value);
    const absl::Status made = MakeError(code, "node 1 said so");
    EXPECT_EQ(CodeOf(made), code) << made;
    v1::Error wire;
    ToProto(made, &wire);
    EXPECT_EQ(wire.code(), code);
    EXPECT_EQ(wire.message(), "node 1 said so");
    const absl::Status back = FromProto(wire);
    EXPECT_EQ(CodeOf(back), code) << back;
    EXPECT_EQ(back.message(), "node 1 said so");
  }
}

TEST(StatusCode, MakeErrorWithOkIsInternalNeverSuccess) {
  const absl::Status status = MakeError(v1::OK, "a bug");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(CodeOf(status), v1::INTERNAL);
}

TEST(StatusCode, AnOkErrorFieldIsOk) {
  v1::Error none;
  EXPECT_TRUE(FromProto(none).ok());
}

}  // namespace
}  // namespace gradsync
