// FormingWatch: while a node connects its cross-node backend for a new
// generation, it heart-beats the leader and aborts that connect as soon as
// the leader aborts the generation (another node failed while forming it,
// e.g. its Gloo worker was killed by a malformed message). Without it the
// node has no heartbeat thread yet (ClusterLink starts one once the world
// is formed), and Gloo retries a connection to a dead peer until its own
// timeout, twice the job's: the node would fail long after the others, as
// TIMEOUT and without the cause. The backend's error then carries the
// leader's reason, which names the node that failed and why.
//
// A member connecting the generation joiners grow it to also probes their
// listen addresses each look: a joiner's daemon killed before it connected
// its mesh leaves the members' connect waiting for its Gloo address, which
// only its silence would end. A refusal reports the death to the
// rendezvous (which aborts the generation, ending every wait on its keys)
// and aborts the connect, naming the joiner (failed_grow.h drops it).
//
// Threads: the constructor looks once before it returns (so a generation
// already aborted is never connected), then a thread of its own looks every
// `every`; the destructor stops and joins it (at most one heartbeat RPC
// later).
#ifndef GRADSYNC_DAEMON_CLUSTER_FORMING_WATCH_H_
#define GRADSYNC_DAEMON_CLUSTER_FORMING_WATCH_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/monotonic_mutex.h"
#include "daemon/backends/backend.h"
#include "daemon/cluster/job_rendezvous.h"

namespace gradsync {

class FormingWatch {
 public:
  // Heart-beats every `every` for `generation` as `node_rank`; on an abort
  // (or a newer generation) calls backend->Abort with the leader's reason.
  // `backend` must outlive the watch. `joiners`: the peers to probe.
  FormingWatch(std::shared_ptr<JobRendezvous> client, int node_rank, uint64_t generation,
               Backend* backend, std::chrono::milliseconds every,
               std::vector<RendezvousPeer> joiners = {});
  ~FormingWatch();
  FormingWatch(const FormingWatch&) = delete;
  FormingWatch& operator=(const FormingWatch&) = delete;

 private:
  // One heartbeat; true (and the backend aborted) when the generation is over.
  bool AbortedAtLeader();
  // Probes the joiners; true (the death reported, the backend aborted)
  // when one's daemon refuses connections.
  bool JoinerDied();
  void Run();

  const std::shared_ptr<JobRendezvous> client_;
  const int node_rank_;
  const uint64_t generation_;
  Backend* const backend_;
  const std::chrono::milliseconds every_;
  const std::vector<RendezvousPeer> joiners_;
  // Its wait is on the monotonic clock, whatever the wall clock does.
  MonotonicMutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_FORMING_WATCH_H_
