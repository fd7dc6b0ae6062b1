// A daemon's Control service as gradsyncctl uses it: its Stats (GetStats)
// and job-wide bucket caps (SetConfig).
#ifndef GRADSYNC_TESTS_INTEGRATION_CONTROL_STATS_H_
#define GRADSYNC_TESTS_INTEGRATION_CONTROL_STATS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradsync/v1/control.pb.h"

namespace gradsync::testing {

// GetStats from the daemon listening on 127.0.0.1:`port` (10 s deadline);
// `token`, if any, is sent as the job's call token. UNAVAILABLE with the
// gRPC message when the call fails.
absl::StatusOr<v1::Stats> GetStats(int port, const std::string& token = "");

// SetConfig of bucket_cap_mb and first_bucket_cap_mb (as gradsyncctl config
// set sends them) on the daemon at 127.0.0.1:`port`, 10 s deadline. OK only
// when both the call and the daemon's answer are; otherwise an error with
// the gRPC message and the daemon's.
absl::Status SetBucketCaps(int port, const std::string& token, const std::string& cap_mb,
                           const std::string& first_cap_mb);

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_CONTROL_STATS_H_
