// The worker zygote: a process forked from gradsyncd while it still has one
// thread, which forks each Gloo worker on request instead of the daemon
// executing itself again.
//
// Why: a worker started by exec pays the dynamic loader (26 shared objects,
// their relocations) and every page of its image faulting in again: tens of
// ms of CPU, and on a VM where a page fault costs 15 µs, most of a
// 16-daemon job's start-up. A fork of the zygote shares the pages the
// daemon already loaded and relocated, and pays only for what it writes.
// The daemon itself cannot fork a worker: once its threads run, a lock held
// by one of them (malloc's, spdlog's, gRPC's) would stay held in the child.
//
// Each worker is forked by a short-lived intermediate child of the zygote,
// which exits at once, and the daemon is a child subreaper
// (PR_SET_CHILD_SUBREAPER): the worker is re-parented to the daemon, which
// reaps it and reads how it ended exactly as for a worker it spawned. The
// zygote replies with the worker's pid only after reaping the intermediate,
// so by then the worker is already the daemon's child.
//
// The zygote exits when the daemon's end of its socket closes (the daemon
// exited or died) or when the daemon's main thread ends (PR_SET_PDEATHSIG).
// When the zygote is unavailable (not started, dead, or unresponsive),
// callers fall back to starting the worker by exec.
#ifndef GRADSYNC_DAEMON_BACKENDS_WORKER_ZYGOTE_H_
#define GRADSYNC_DAEMON_BACKENDS_WORKER_ZYGOTE_H_

#include <sys/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsync {

// The function a forked worker runs; its return value is the exit code.
using WorkerMain = int (*)();

// Forks the zygote. STATE when this process already runs more
// than one thread (forking then is unsafe; nothing is started), INTERNAL
// when a system call fails. Call at most once, early in main.
absl::Status StartWorkerZygote(WorkerMain worker_main);

// Whether a zygote was started and has not been found dead or unresponsive.
bool WorkerZygoteRunning();

// Forks a worker running `worker_main` with `channel_fd` and `buffer_fd`
// (this process's descriptors) at kGlooWorkerChannelFd and
// kGlooWorkerBufferFd, its other descriptors closed, its signal mask empty
// and SIGTERM/SIGINT at their default actions: the state an exec'd worker
// starts in. Returns its pid; it is this process's child. UNAVAILABLE when
// the zygote is gone or did not answer in time (it is then not used
// again), INTERNAL when its fork failed.
absl::StatusOr<pid_t> ForkWorkerFromZygote(int channel_fd, int buffer_fd);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_WORKER_ZYGOTE_H_
