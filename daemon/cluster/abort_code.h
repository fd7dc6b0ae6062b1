// The code a node's error takes once the rendezvous' abort carries another
// node's reported error (HeartbeatResult.abort_error): every trainer of the
// job must end with the culprit's code, whichever news reached its node
// first (the abort, or its own look at a failed collective).
#ifndef GRADSYNC_DAEMON_CLUSTER_ABORT_CODE_H_
#define GRADSYNC_DAEMON_CLUSTER_ABORT_CODE_H_

#include "absl/status/status.h"
#include "gradsync/v1/local.pb.h"

namespace gradsync {

// `reported`'s code where it blames the job's input, which no node may
// train on (INVALID_ARGUMENT: a non-finite gradient, a write after a mark;
// MISMATCH: trainers or nodes that disagree); `own` otherwise (OK, or
// another node's timeout, death or internal failure: to this node a
// peer's failure, as its own symptom says).
v1::Code CodeAfterAbort(v1::Code own, const absl::Status& reported);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ABORT_CODE_H_
