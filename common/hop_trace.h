// HopTrace: a debug trace of where one iteration's time goes across the
// processes it crosses (trainer, daemon, Gloo worker), for
// docs/PERFORMANCE.md's hop-by-hop breakdown (tests/bench/hop_report.py).
//
// Off unless $GRADSYNC_HOP_TRACE names a directory when the process first
// records; then each Record appends (hop, node, steady_clock ns) to a buffer
// allocated once, written to DIR/hops.<pid>.tsv whenever it fills and at
// exit (a process that ends with _exit loses its last partial buffer).
// Every process of the machine reads the same monotonic clock, so hops
// recorded by different processes compare. Off, a Record is one load and
// a branch.
//
// Threads: Record may be called from any thread.
#ifndef GRADSYNC_COMMON_HOP_TRACE_H_
#define GRADSYNC_COMMON_HOP_TRACE_H_

namespace gradsync {

enum class Hop {
  kTrainerMark,         // gs_mark_ready called
  kDaemonMarkSeen,      // the scheduler popped the mark from the ring
  kDaemonLaunch,        // the bucket is complete on the node; its reduction starts
  kDaemonIssue,         // the collective's request is sent to the Gloo worker
  kWorkerReceived,      // the worker read the request
  kWorkerGlooStart,     // the worker calls Gloo's allreduce of the bucket
  kWorkerGlooDone,      // Gloo's allreduce returned
  kDaemonDoneReceived,  // the daemon read the worker's answer
  kDaemonPosted,        // "iteration done" posted and the trainers' doorbells rung
  kTrainerWoken,        // gs_wait saw "iteration done"
};

// Whether $GRADSYNC_HOP_TRACE was set (read once).
bool HopTraceEnabled();
// `node`: the recording process's node rank (the trainer's global rank for
// one trainer per node), -1 where unknown.
void RecordHop(Hop hop, int node);
// Writes what is recorded so far (a process about to _exit, a test).
void FlushHopTrace();

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_HOP_TRACE_H_
