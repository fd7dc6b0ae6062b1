// A Gloo worker process (gloo_worker.h) spawned and waiting for its connect
// request, and the one spare the daemon keeps ready.
//
// A worker is generic until it is connected (everything about its
// generation comes in the connect request), so one can be started ahead:
// its process start-up (tens of ms of CPU; on a loaded machine with many
// daemons starting at once, hundreds of ms) then overlaps the daemon's wait
// for its trainers and the join instead of following the join.
#ifndef GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_PROCESS_H_
#define GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/backends/worker_channel.h"

namespace gradsync {

struct GlooWorkerProcess {
  GlooWorkerProcess() = default;
  GlooWorkerProcess(GlooWorkerProcess&& other) noexcept;
  GlooWorkerProcess& operator=(GlooWorkerProcess&&) = delete;
  // An unadopted worker: its channel closes (so it exits) and it is reaped.
  ~GlooWorkerProcess();

  pid_t pid = 0;
  int pidfd = -1;         // -1 on kernels without pidfd_open
  WorkerChannel channel;  // the daemon's end
  int buffer_fd = -1;     // the memfd shared with it
};

// This very executable in worker mode: the argv every daemon uses.
std::vector<std::string> ThisExecutableAsGlooWorker();

// Spawns `argv` (this executable in worker mode) with its channel and an
// empty shared buffer at the fixed descriptors the worker expects. INTERNAL
// naming the executable when it cannot be started. For
// ThisExecutableAsGlooWorker(), while the worker zygote runs
// (worker_zygote.h), the worker is forked from it instead of executed.
absl::StatusOr<GlooWorkerProcess> SpawnGlooWorkerProcess(const std::vector<std::string>& argv);

// Spawns the spare for `argv` unless one is kept already (a failure is
// logged: the next generation then spawns its own).
void PrepareSpareGlooWorker(const std::vector<std::string>& argv);

// The spare for `argv` if one is kept and still alive (a dead one is reaped
// and dropped), else nullopt.
std::optional<GlooWorkerProcess> TakeSpareGlooWorker(const std::vector<std::string>& argv);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_PROCESS_H_
