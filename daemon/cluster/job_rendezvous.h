// JobRendezvous: what a node needs of its job's rendezvous, wherever it
// lives. Two implementations: RendezvousClient (rendezvous_client.h), the
// embedded default, talks to the service inside node 0's daemon;
// EtcdRendezvous (etcd_rendezvous.h) keeps the same membership, generations,
// heartbeats and records in etcd, so that no node is special.
//
// The contract is the leader's (rendezvous_service.h): Join blocks until a
// generation forms (TIMEOUT naming the missing node ranks); keys under
// "g<generation>/" belong to that generation and a Wait on them ends with
// PEER_FAILED once it aborts; a Heartbeat reporting a node error, a Leave,
// a Depart, or a silent (dead) member aborts the generation, and every later
// Heartbeat answers abort with the reason and the members not heard from
// since. The store's errors are KeyValueStore's.
//
// Thread-safe: a heartbeat thread and Gloo's store share one.
#ifndef GRADSYNC_DAEMON_CLUSTER_JOB_RENDEZVOUS_H_
#define GRADSYNC_DAEMON_CLUSTER_JOB_RENDEZVOUS_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/backends/key_value_store.h"

namespace gradsync {

struct RendezvousPeer {
  int node_rank = 0;
  std::string host;
  int local_size = 0;
  std::string listen_address;  // its daemon's, to probe (liveness_probe.h); "": none
  int rank_offset = 0;         // the global rank of its local rank 0 (rank_offsets.h)
  bool joins_running = false;  // Peer.joins_running: never the first member
};

struct JoinParams {
  int node_rank = 0;
  int num_nodes = 1;
  int local_size = 1;
  std::string host;  // the address this node's Gloo device binds
  // HOST:PORT of this daemon's --listen server, which the others probe
  // when it falls silent (liveness_probe.h); "": none.
  std::string listen_address;
  // Elastic re-formation (rendezvous.proto): the aborted generation this
  // node survived and the iteration it redoes; 0: a fresh join.
  uint64_t resume_generation = 0;
  uint64_t resume_iteration = 0;
  absl::Duration timeout = absl::Seconds(300);
};

struct JoinResult {
  uint64_t incarnation = 0;  // the leader's run
  uint64_t generation = 0;
  std::vector<RendezvousPeer> peers;  // ordered by node rank
  int world_size = 0;
  // The iteration the generation starts at (JoinResponse.start_iteration).
  uint64_t start_iteration = 0;
};

struct HeartbeatParams {
  int node_rank = 0;
  uint64_t generation = 0;
  uint64_t iteration = 0;
  int64_t last_launched_bucket = -1;
  absl::Status node_error;   // non-OK: this node saw a failure (aborts the generation)
  std::string stall_report;  // non-empty: a local stall, for the leader's log
};

struct SilentMember {
  int node_rank = 0;
  std::string host;
  absl::Duration silent;  // since its last heartbeat
  bool departed = false;  // it left the job for good (Depart): gone at once
  // Its daemon's listen address refused a connect: gone at once.
  bool refuses_connections = false;
  std::string listen_address;  // the address probed
};

struct HeartbeatResult {
  uint64_t generation = 0;
  bool abort = false;
  std::string abort_reason;
  // With abort: the node error whose report caused it, as the node sent
  // it (HeartbeatResponse.abort_error); OK when none did (a death, a Leave).
  absl::Status abort_error;
  uint64_t config_version = 0;
  // With abort: members not heard from since (see rendezvous.proto).
  std::vector<SilentMember> silent_members;
};

class JobRendezvous : public KeyValueStore {
 public:
  // Blocks until every node has joined (or params.timeout, which must be
  // positive, passes: TIMEOUT naming the missing node ranks).
  virtual absl::StatusOr<JoinResult> Join(const JoinParams& params) = 0;
  using KeyValueStore::WaitForValues;
  // WaitForValues, plus the values of `read_keys` that are set (not waited
  // for; one that is not set is absent from the answer).
  virtual absl::StatusOr<std::map<std::string, std::string>> WaitForValues(
      const std::vector<std::string>& keys, const std::vector<std::string>& read_keys,
      absl::Duration timeout) = 0;
  virtual absl::StatusOr<HeartbeatResult> Heartbeat(const HeartbeatParams& params) = 0;
  // generation 0: the current one.
  virtual absl::Status Leave(int node_rank, uint64_t generation, std::string_view reason) = 0;
  // Leaves the job for good (the daemon shuts down), not only `generation`:
  // aborts it with `reason`, and every later Heartbeat names this node among
  // the silent members as departed, so that an elastic job's survivors
  // re-form without it at once rather than after kPresumedDeadAfter.
  virtual absl::Status Depart(int node_rank, uint64_t generation, std::string_view reason) = 0;
  // How errors name the rendezvous: "the leader daemon at HOST:PORT",
  // "etcd at HOST:PORT,...".
  virtual std::string Describe() const = 0;
  // Whether the rendezvous lives in node 0's daemon (its loss is the
  // leader's death) rather than outside every node.
  virtual bool embedded() const = 0;
  // An embedded rendezvous: waits up to `limit` while the connection to the
  // leader stays up; true when it is not up (lost, or not yet back), which
  // a liveness probe of the leader's port then explains. The bound lets the
  // watcher look at its own stop between waits. One outside every node has
  // no leader to lose, so nothing to wait for: false at once.
  virtual bool AwaitLeaderConnectionDown(absl::Duration /*limit*/) { return false; }
  // This node leaves its generation at a grow boundary (the next one forms
  // through another client) without leaving it: nothing of this client may
  // tell the members still in it that the node is gone. The leader hears of
  // it by the node's Join of the next generation: nothing to do.
  virtual void Retire() {}
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_JOB_RENDEZVOUS_H_
