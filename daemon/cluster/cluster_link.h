// ClusterLink: this node's membership in a multi-node job for one
// generation. Forming it joins the leader's rendezvous, checks that every
// node registered the same layout (naming the node and the first differing
// tensor otherwise), adopts node 0's bucket caps so every node plans the
// same buckets, and connects the Gloo backend. While the job runs every
// plan decision is compared across nodes (CheckPlan), and the leader's
// ordered config log is applied version by version. While the job runs it
// heart-beats the leader: a node error is reported there (the leader then
// aborts the generation everywhere), and an abort or an unreachable leader
// fails the local job. It leaves the generation when the job ends, and the
// job for good when the daemon shuts down (an elastic job's survivors then
// re-form without this node at once).
//
// Threads: the WorldLink methods are thread-safe and called by the job
// (under its lock: they never block on the network, except Explain and
// AgreeOrder, which the job calls without its lock). The heartbeat thread
// talks to the leader and calls `on_failure` without holding mu_.
#ifndef GRADSYNC_DAEMON_CLUSTER_CLUSTER_LINK_H_
#define GRADSYNC_DAEMON_CLUSTER_CLUSTER_LINK_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/layout.h"
#include "common/monotonic_mutex.h"
#include "daemon/cluster/config_log_follower.h"
#include "daemon/cluster/job_rendezvous.h"
#include "daemon/config.h"
#include "daemon/engine/job.h"

namespace gradsync {

struct GrowAttempt;  // failed_grow.h

class ClusterLink final : public WorldLink {
 public:
  // Forms the world for `layout` (blocks up to the config's timeout).
  // `leader`: HOST:PORT of the rendezvous. `listen_address`: where the
  // other nodes reach this daemon's --listen server, which they probe when
  // this node falls silent (liveness_probe.h; "": none). `on_failure` is called from the
  // heartbeat thread when another node (or the leader) fails.
  // `resume`: an elastic job's survivor re-forming the generation a node's
  // death aborted (rendezvous_service.h, set_min_nodes); {} joins afresh.
  // A grown generation that fails because of a joiner is formed again
  // without it (failed_grow.h); a joiner that fails to join departs.
  static absl::StatusOr<JobWorld> Form(const DaemonConfig& config, const std::string& leader,
                                       const std::string& listen_address, const Layout& layout,
                                       std::function<void(const absl::Status&)> on_failure,
                                       const ResumePoint& resume = {});
  ~ClusterLink() override;
  // Before this node joins: tells the leader why it has not yet (`report`,
  // e.g. the local trainers it still waits for), so that the other nodes'
  // Join timeout names the culprit (RendezvousService quotes it).
  static absl::Status ReportForming(const DaemonConfig& config, const std::string& leader,
                                    const std::string& report);
  // Starts the Gloo worker process the next Form adopts, so that its
  // start-up overlaps the wait for the trainers and the join: once the
  // daemon serves, and when a generation ends (next job or re-formation).
  static void PrepareGlooWorker();

  void ReportError(const absl::Status& error) override ABSL_LOCKS_EXCLUDED(mu_);
  // An elastic job's node other than the embedded leader's leaves the job
  // for good (JobRendezvous::Depart, sent by the heartbeat thread at once);
  // a fixed job, or node 0 hosting the leader, reports the error instead:
  // the job cannot go on without it.
  void ReportDeparture(const absl::Status& why) override ABSL_LOCKS_EXCLUDED(mu_);
  void AwaitDeparted(absl::Duration limit) override ABSL_LOCKS_EXCLUDED(mu_);
  void SetProgress(std::function<uint64_t()> iteration) override ABSL_LOCKS_EXCLUDED(mu_);
  void ReportStall(const std::string& description) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Explain(const absl::Status& error) override;
  std::vector<int> DeadNodes() override ABSL_LOCKS_EXCLUDED(mu_);
  void Retire() override ABSL_LOCKS_EXCLUDED(mu_);
  void SetConfigListener(std::function<void(const BucketCaps& caps, uint64_t at_iteration,
                                            uint64_t version, bool grow)>
                             listener) override ABSL_LOCKS_EXCLUDED(mu_);

  // Node 0's order, distributed to every node (the plan rebuild); empty
  // when node 0 observed none (see Scheduler::OrderAgreement).
  absl::StatusOr<std::vector<uint32_t>> AgreeOrder(const std::vector<uint32_t>& local);
  // Publishes this node's plan decision and compares every node's for the
  // same plan version (blocks until all published or the timeout).
  absl::Status CheckPlan(const PlanStamp& stamp);
  // The GPU path's exchange (GpuKey of this generation): set once, read
  // once it exists or the deadline (a MonotonicNow() time) passes.
  absl::Status Publish(const std::string& name, const std::string& value);
  absl::StatusOr<std::string> Fetch(const std::string& name, absl::Time deadline);

 private:
  ClusterLink(const DaemonConfig& config, std::shared_ptr<JobRendezvous> client,
              uint64_t generation, std::vector<int> members,
              std::vector<RendezvousPeer> probe_targets, size_t num_tensors,
              std::function<void(const absl::Status&)> on_failure);
  // One formation through `client`; `attempt` says how far it got.
  static absl::StatusOr<JobWorld> FormWith(const DaemonConfig& config,
                                           std::shared_ptr<JobRendezvous> client,
                                           const std::string& leader,
                                           const std::string& listen_address, const Layout& layout,
                                           std::function<void(const absl::Status&)> on_failure,
                                           const ResumePoint& resume, GrowAttempt* attempt);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // A node other than the embedded leader's: once the connection to the
  // leader drops, probes its port (`address`); a refusal proves the leader
  // dead and fails the job at once, naming it, as a failed heartbeat would
  // only after its RPC deadline.
  void WatchLeader() ABSL_LOCKS_EXCLUDED(mu_);
  // Probes the embedded leader's port (leader_address_): UNAVAILABLE saying
  // it refuses connections, i.e. the leader is dead; OK otherwise or where
  // there is no leader to probe.
  absl::Status LeaderRefuses() const;
  // The job failed (on_failure_ was called, or the error came from here),
  // or the link is stopping.
  bool Failed() ABSL_LOCKS_EXCLUDED(mu_);
  // Sends a pending departure (JobRendezvous::Depart) once; true if one was.
  bool SendDeparture() ABSL_LOCKS_EXCLUDED(mu_);
  // Until the heartbeat loop's first round is over (the config log read up
  // to what the leader had then), at most `limit`.
  void AwaitFirstHeartbeat(absl::Duration limit) ABSL_LOCKS_EXCLUDED(mu_);
  // After a failure: heart-beats the leader (with `report`, if not OK, which
  // aborts the generation) until every other member answered since the
  // abort or stayed silent past a few heartbeats; returns `error` naming the
  // silent members as dead (PEER_FAILED), else with the leader's reason.
  // `error` explained by a leader that did not answer (`transport`).
  absl::Status LeaderUnreachable(const absl::Status& error, const absl::Status& transport) const;
  absl::Status NameFailedNodes(const absl::Status& error, const absl::Status& report)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Probes the other members' listen addresses (bounded by
  // kLivenessProbeTimeout): the node ranks, ascending, whose daemon
  // refuses connections, i.e. is gone and will report nothing.
  std::vector<int> PeersRefusingConnections() const;

  const DaemonConfig config_;
  const std::shared_ptr<JobRendezvous> client_;
  const uint64_t generation_;
  const std::vector<int> members_;  // node ranks of the generation, ascending
  // The first member that is no joiner: it publishes the rebuilt order.
  int first_member_ = 0;
  // The other members that sent a listen address (liveness_probe.h).
  const std::vector<RendezvousPeer> probe_targets_;
  // The embedded leader's, where this node is not the leader ("": none).
  const std::string leader_address_;
  const size_t num_tensors_;  // in the layout: a rebuilt order names each once
  const std::function<void(const absl::Status&)> on_failure_;

  MonotonicMutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool first_beat_done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status node_error_ ABSL_GUARDED_BY(mu_);  // reported with the next heartbeat
  bool error_sent_ ABSL_GUARDED_BY(mu_) = false;  // the leader has node_error_
  // This node leaves the job for good (ReportDeparture), why; sent once.
  absl::Status departure_ ABSL_GUARDED_BY(mu_);
  bool departure_sent_ ABSL_GUARDED_BY(mu_) = false;
  // The members move to the next generation together (nodes join): the
  // destructor sends no Leave, which would abort it for the others.
  bool retired_ ABSL_GUARDED_BY(mu_) = false;
  bool departure_done_ ABSL_GUARDED_BY(mu_) = false;  // the Depart RPC returned
  // on_failure_ was called (or the error came from here).
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::function<uint64_t()> progress_ ABSL_GUARDED_BY(mu_);
  std::string stall_report_ ABSL_GUARDED_BY(mu_);     // sent with the next heartbeat
  std::vector<int> dead_nodes_ ABSL_GUARDED_BY(mu_);  // named by the last NameFailedNodes
  // A heartbeat the rendezvous did not answer (its RPC error): Explain does
  // not wait out another deadline asking it.
  absl::Status rendezvous_silent_ ABSL_GUARDED_BY(mu_);
  std::string explained_ ABSL_GUARDED_BY(mu_);  // the last NameFailedNodes's message
  // The job-wide config log, read by the heartbeat thread.
  ConfigLogFollower config_log_;
  std::thread heartbeat_;
  std::thread leader_watch_;  // WatchLeader; none on the leader's node or on etcd
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_CLUSTER_LINK_H_
