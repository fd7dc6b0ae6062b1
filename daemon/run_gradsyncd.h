// The whole of gradsyncd's main — flags, config, signals, the daemon — with
// the GPU device injected, so that the release binary (daemon/gradsyncd.cc:
// real CUDA + NCCL) and the test-only one (tests/gpu:gradsyncd_sim: the
// simulated device) share everything else. The simulation is never
// selectable in a release gradsyncd: it is not linked into it.
#ifndef GRADSYNC_DAEMON_RUN_GRADSYNCD_H_
#define GRADSYNC_DAEMON_RUN_GRADSYNCD_H_

#include <functional>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/engine/gpu_session.h"

namespace gradsync {

// Called once, after the flags are parsed, unless --backend is gloo or
// local. An error is fatal with --backend=nccl; with auto the daemon runs
// without a GPU device (CUDA registrations are refused, saying why).
using GpuRuntimeFactory = std::function<absl::StatusOr<GpuRuntime>(const DaemonConfig& config)>;

int RunGradsyncd(int argc, char** argv, const GpuRuntimeFactory& gpu);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_RUN_GRADSYNCD_H_
