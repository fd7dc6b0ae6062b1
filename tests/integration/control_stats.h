// A daemon's Stats over its Control service (GetStats), as gradsyncctl
// reads them.
#ifndef GRADSYNC_TESTS_INTEGRATION_CONTROL_STATS_H_
#define GRADSYNC_TESTS_INTEGRATION_CONTROL_STATS_H_

#include <string>

#include "absl/status/statusor.h"
#include "gradsync/v1/control.pb.h"

namespace gradsync::testing {

// GetStats from the daemon listening on 127.0.0.1:`port` (10 s deadline);
// `token`, if any, is sent as the job's call token. UNAVAILABLE with the
// gRPC message when the call fails.
absl::StatusOr<v1::Stats> GetStats(int port, const std::string& token = "");

}  // namespace gradsync::testing

#endif  // GRADSYNC_TESTS_INTEGRATION_CONTROL_STATS_H_
