// Daemon: gradsyncd's top level. Owns the node segment (doorbell and
// heartbeat), the job registry, the Local service on the unix socket, and
// the network-facing server on --listen (Control, Rendezvous on the leader,
// grpc.health.v1.Health, server reflection).
//
// Threads: Start and Run belong to main's thread; RequestShutdown and Drain
// are thread-safe (signal thread, Control RPCs). mu_ guards the shutdown
// and drain state; it is taken before the registry's lock. node_mu_ guards
// the node segments and is taken last (the registry calls in under its lock).
#ifndef GRADSYNC_DAEMON_DAEMON_H_
#define GRADSYNC_DAEMON_DAEMON_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/monotonic_mutex.h"
#include "daemon/autotune_driver.h"
#include "daemon/cluster/rendezvous_service.h"
#include "daemon/config.h"
#include "daemon/connection_acceptor.h"
#include "daemon/control_service.h"
#include "daemon/engine/job_registry.h"
#include "daemon/local_service.h"
#include "daemon/observe/latency_stats.h"
#include "daemon/observe/metrics_endpoint.h"
#include "daemon/observe/timeline_writer.h"
#include "grpcpp/grpcpp.h"
#include "ipc/node_segment.h"

namespace gradsync {

class EtcdRendezvous;

class Daemon {
 public:
  // `gpu`: the GPU path's device, chosen by main (none: CUDA tensors are refused).
  explicit Daemon(DaemonConfig config, GpuRuntime gpu = {});
  ~Daemon();

  // Starts the servers, cleans up what a killed daemon left, creates the
  // node segment. Errors name what could not be set up; a failed start
  // leaves no segment behind (the destructor removes it).
  absl::Status Start();
  // Blocks until RequestShutdown, then stops cleanly: trainers get an
  // error, segments and the socket file are removed.
  void Run();
  // Thread-safe; called from the signal thread or the Drain RPC.
  void RequestShutdown(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

  int listen_port() const { return listen_port_; }

  // Stop accepting trainers, let the current iteration finish, then exit.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Start's steps, in the order Start runs them.
  // Opens --trace-file, starts --autotune's driver where this node tunes,
  // and returns what every job reports through.
  absl::StatusOr<JobHooks> MakeJobHooks();
  // --listen: Control, health, reflection and (leader) the rendezvous.
  absl::Status StartListenServer();
  void LogNetworkAuth(const CallAuth& auth) const;
  void CreateListenControlService(const CallAuth& auth);
  // Control's stats beyond the jobs': iteration durations, autotuning.
  void AttachControlStats();
  // Plaintext through our own ConnectionAcceptor, TLS through gRPC's listener.
  absl::Status AddListeningPort(grpc::ServerBuilder& builder,
                                std::shared_ptr<grpc::ServerCredentials> credentials);
  // --metrics-listen (with a Control service of its own without --listen).
  absl::Status StartMetricsEndpoint();
  // Where FormWorld joins: --leader, or on the leader its own listen address.
  absl::Status ResolveLeaderAddress();
  // The Local service on the unix socket, behind the peer-credential check.
  absl::Status StartLocalServer();

  absl::StatusOr<JobWorld> FormWorld(const Layout& layout,
                                     std::function<void(const absl::Status&)> on_failure);
  absl::Status PrepareSocketPath();
  // The leader's job-wide caps change (ControlService::PublishCaps): into
  // the running generation's config log, or held for the next generation.
  absl::Status PublishCaps(const DaemonConfig& next, uint64_t version);
  // PublishCaps with the rendezvous in etcd.
  absl::Status PublishCapsOnEtcd(const DaemonConfig& next);
  // The first iteration a job-wide change published now can start at on
  // every node (ahead of the fastest one).
  uint64_t EarliestJobWideIteration();
  // --autotune's way to change the running job's caps: generation
  // `generation`'s config log (the leader's, or etcd's), the job itself on
  // one node. Returns the iteration they apply at.
  absl::StatusOr<uint64_t> PublishAutotunedCaps(const CapsCandidate& caps, uint64_t at,
                                                uint64_t generation);
  // Tells --autotune's driver who tunes a world that formed: its first member.
  void SeatTuner(const JobWorld& world, const ResumePoint& resume);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Sweeps what dead daemons of this prefix left, then creates node<1>.
  absl::Status CreateFirstNodeSegment() ABSL_LOCKS_EXCLUDED(node_mu_);
  // Unlinks the current node segment if its name is still ours (idempotent).
  void RemoveNodeSegment() ABSL_LOCKS_EXCLUDED(node_mu_);
  // A node segment under a fresh random name ("node<generation>.<random>").
  absl::StatusOr<ipc::NodeSegment> CreateNodeSegment(int generation) const;
  // The node segment a fresh job gets: the current one if it is intact,
  // else a new one (new name), logged; running jobs keep theirs.
  std::shared_ptr<ipc::NodeSegment> NodeSegmentForNewJob() ABSL_LOCKS_EXCLUDED(node_mu_);
  // Bumps the heartbeat of every node segment a job may still use.
  void BeatNodeSegments() ABSL_LOCKS_EXCLUDED(node_mu_);

  DaemonConfig config_;
  GpuRuntime gpu_;
  absl::Mutex node_mu_;
  std::shared_ptr<ipc::NodeSegment> node_ ABSL_GUARDED_BY(node_mu_);
  // Replaced segments, alive while a job that started with them lives: its
  // trainers still watch their heartbeat.
  std::vector<std::weak_ptr<ipc::NodeSegment>> retired_nodes_ ABSL_GUARDED_BY(node_mu_);
  int node_generation_ ABSL_GUARDED_BY(node_mu_) = 1;
  // The tuner's connection to etcd, made on its first publish; only the
  // driver's thread uses it (declared first: it outlives the driver).
  std::shared_ptr<EtcdRendezvous> tuner_etcd_;
  // `config set`'s connection to etcd, made on its first use and kept: a
  // change it holds while no generation runs lives under its lease, so as
  // long as this daemon (EtcdRendezvous::AppendOrHoldConfig).
  absl::Mutex config_etcd_mu_;
  std::shared_ptr<EtcdRendezvous> config_etcd_ ABSL_GUARDED_BY(config_etcd_mu_);
  // --autotune (every node; the generation's first member tunes); declared
  // before jobs_ so the jobs' schedulers, which report to it, stop first.
  // Run stops its thread before the jobs go: it reads them.
  std::unique_ptr<AutotuneDriver> autotune_;
  // --trace-file; declared before jobs_ so that it outlives every job.
  std::unique_ptr<TimelineWriter> timeline_;
  // Every job's iteration durations (Stats.iteration_duration, /metrics'
  // gradsync_iteration_duration_seconds); declared before jobs_ so that it
  // outlives every job.
  LatencyStats iteration_durations_;
  std::unique_ptr<JobRegistry> jobs_;
  std::unique_ptr<LocalService> local_service_;
  std::unique_ptr<ControlService> control_service_;
  std::unique_ptr<RendezvousService> rendezvous_service_;  // the leader of a multi-node job
  std::unique_ptr<grpc::Server> local_server_;
  std::unique_ptr<grpc::Server> listen_server_;
  // Accept for the servers above (EMFILE-proof); declared after them, so
  // they stop before the servers go.
  std::unique_ptr<ConnectionAcceptor> local_acceptor_;
  std::unique_ptr<ConnectionAcceptor> listen_acceptor_;
  int listen_port_ = 0;
  std::unique_ptr<MetricsEndpoint> metrics_;  // --metrics-listen; stops before the services go
  // Where FormWorld joins the job: --leader, or on the leader an address its
  // own listen server answers on. Set by Start before trainers can attach.
  std::string leader_address_;
  // Where the other nodes reach this daemon's --listen server, sent in its
  // Join for them to probe when it falls silent ("" without --listen).
  std::string advertised_listen_;

  MonotonicMutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::string shutdown_reason_ ABSL_GUARDED_BY(mu_);
  std::thread heartbeat_;  // started by Start, joined by Run or the destructor
  std::thread drain_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_DAEMON_H_
