// Threads started under a SCHED_BATCH caller inherit SCHED_BATCH.
//
// Gloo's TCP device runs one event-loop thread that, when a peer's message
// arrives while the user thread holds the pair's lock (mid-send), returns
// to epoll_wait at once, again and again: it busy-polls until the lock is
// free. Woken by that message, it preempts the user thread on its CPU and
// then spins there until the next scheduler tick (4 ms at HZ=250): the
// cross-node 4 KB iteration's ~4 ms floor. A SCHED_BATCH thread keeps its
// full CPU share but never preempts on wake-up, so the lock holder finishes
// its send first.
#ifndef GRADSYNC_DAEMON_BACKENDS_BATCH_SCHEDULING_H_
#define GRADSYNC_DAEMON_BACKENDS_BATCH_SCHEDULING_H_

namespace gradsync {

// Switches the calling thread to SCHED_BATCH for its lifetime; threads it
// starts meanwhile inherit the policy. The destructor restores the
// caller's policy. Best effort: a refused switch (seccomp, an RT caller)
// leaves everything as it was.
class InheritedBatchScheduling {
 public:
  InheritedBatchScheduling();
  ~InheritedBatchScheduling();
  InheritedBatchScheduling(const InheritedBatchScheduling&) = delete;
  InheritedBatchScheduling& operator=(const InheritedBatchScheduling&) = delete;

 private:
  int previous_policy_ = -1;  // -1: nothing to restore
};

// The calling thread's or `tid`'s scheduling policy (SCHED_OTHER, ...), -1
// if it cannot be read.
int SchedulingPolicyOf(int tid);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_BATCH_SCHEDULING_H_
