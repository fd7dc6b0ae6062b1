// The Gloo worker: the process in which a node's Gloo device, pairs and
// collectives run, one per job generation, started by GlooWorkerBackend
// (gloo_worker_backend.h) as `gradsyncd --gloo-worker`.
//
// Why a process: Gloo's TCP pairs parse what arrives on their sockets on
// Gloo's own event-loop thread, and a well-formed but unexpected message
// (e.g. a SEND_UNBOUND_BUFFER preamble for a slot nobody posted, which
// anyone can send to a pair's listening port while the mesh forms) throws
// there, where nothing can catch it: std::terminate. Here that ends the
// worker only; its terminate handler first tells the daemon what was
// thrown and which TCP peers the worker was connected to.
//
// Protocol (proto/gradsync/v1/gloo_worker.proto, on fd kChannelFd): one
// `connect`, answered by `done` after the worker's store requests (served by
// the daemon's GlooStore: the worker holds no rendezvous credentials); then
// `allreduce` requests on the shared buffer (fd kBufferFd, a memfd the
// daemon grows), each answered by `done`. End of file: the worker exits.
// The worker exits as soon as the daemon's end of the channel closes.
#ifndef GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_H_
#define GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_H_

namespace gradsync {

// argv[1] of a gradsyncd that is to be a Gloo worker.
inline constexpr char kGlooWorkerFlag[] = "--gloo-worker";
inline constexpr int kGlooWorkerChannelFd = 3;
inline constexpr int kGlooWorkerBufferFd = 4;

// The worker's main; returns its exit code.
int RunGlooWorker();

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_GLOO_WORKER_H_
