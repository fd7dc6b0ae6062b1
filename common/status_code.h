// Translation between gradsync.v1.Code (the wire and the C ABI's gs_status)
// and absl::Status (what C++ code passes around). The exact gradsync code
// travels in a status payload, so MISMATCH and STATE (both
// kFailedPrecondition in absl terms) stay distinguishable end to end.
#ifndef GRADSYNC_COMMON_STATUS_CODE_H_
#define GRADSYNC_COMMON_STATUS_CODE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gradsync/v1/local.pb.h"

namespace gradsync {

// An error with an explicit gradsync code (code must not be OK).
absl::Status MakeError(v1::Code code, absl::string_view message);

// The gradsync code of a status: its payload if present, else by absl code.
v1::Code CodeOf(const absl::Status& status);

// Proto <-> absl::Status for the `Error` field of every response.
void ToProto(const absl::Status& status, v1::Error* out);
absl::Status FromProto(const v1::Error& error);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_STATUS_CODE_H_
