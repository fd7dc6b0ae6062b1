#include "daemon/daemon.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/default_socket.h"
#include "common/log_value.h"
#include "common/peer_credentials.h"
#include "common/stats_format.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "common/tls_credentials.h"
#include "daemon/auth/call_auth.h"
#include "daemon/cluster/cluster_link.h"
#include "daemon/cluster/etcd_rendezvous_config.h"
#include "daemon/cluster/rendezvous_records.h"
#include "daemon/listen_address.h"
#include "daemon/observe/trace_directory.h"
#include "daemon/server_limits.h"
#include "daemon/server_reflection.h"
#include "daemon/trainer_admission.h"
#include "grpcpp/health_check_service_interface.h"
#include "ipc/random_segment_name.h"
#include "ipc/shared_segment.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// True if something accepts connections on the unix socket at `path`.
bool SocketAnswers(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

}  // namespace

Daemon::Daemon(DaemonConfig config, GpuRuntime gpu)
    : config_(std::move(config)), gpu_(std::move(gpu)) {}

Daemon::~Daemon() {
  RequestShutdown("destroyed");
  if (heartbeat_.joinable()) heartbeat_.join();
  // A start that failed after creating the node segment never runs Run.
  RemoveNodeSegment();
}

absl::Status Daemon::PrepareSocketPath() {
  // The per-user default lives in a directory we create and check (under
  // systemd, RuntimeDirectory= made and owns it).
  const std::string dir = config_.socket_path.substr(0, config_.socket_path.rfind('/'));
  if (dir == PerUserSocketDirectory()) {
    RETURN_IF_ERROR(EnsurePrivateDirectory(dir));
  }
  struct stat st;
  if (lstat(config_.socket_path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--socket ", config_.socket_path, " exists and is not a socket"));
  }
  if (SocketAnswers(config_.socket_path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("another gradsyncd is already listening on ", config_.socket_path));
  }
  spdlog::info("event=stale_socket_removed path={}", LogToken(config_.socket_path));
  unlink(config_.socket_path.c_str());
  return absl::OkStatus();
}

absl::StatusOr<JobWorld> Daemon::FormWorld(const Layout& layout,
                                           std::function<void(const absl::Status&)> on_failure) {
  if (config_.num_nodes > 1) {
    ASSIGN_OR_RETURN(JobWorld world,
                     ClusterLink::Form(jobs_->config(), leader_address_, advertised_listen_, layout,
                                       std::move(on_failure)));
    SeatTuner(world, ResumePoint{});
    return world;
  }
  JobWorld world;
  world.world_size = config_.local_size;
  world.rank_offset = 0;
  world.first_member = config_.node_rank;
  world.backend = std::make_unique<LocalBackend>();
  SeatTuner(world, ResumePoint{});
  return world;
}

void Daemon::SeatTuner(const JobWorld& world, const ResumePoint& resume) {
  if (!autotune_) return;
  TuningSeat seat;
  // The job forming this world is the registry's current one.
  if (std::shared_ptr<Job> job = jobs_->Current()) seat.job = job->id();
  seat.generation = world.generation;
  seat.tuner_node_rank = world.first_member;
  seat.here = world.node_index == 0;
  seat.resumed = resume.generation != 0;
  seat.first_iteration = resume.iteration;
  autotune_->OnWorldFormed(seat);
}

absl::Status Daemon::Start() {
  RaiseOpenFileLimit();
  ASSIGN_OR_RETURN(JobHooks hooks, MakeJobHooks());
  jobs_ = std::make_unique<JobRegistry>(
      config_, [this] { return NodeSegmentForNewJob(); },
      [this](const Layout& layout, uint64_t, std::function<void(const absl::Status&)> on_failure) {
        return FormWorld(layout, std::move(on_failure));
      },
      std::move(hooks));
  if (!config_.listen.empty()) RETURN_IF_ERROR(StartListenServer());
  if (!config_.metrics_listen.empty()) RETURN_IF_ERROR(StartMetricsEndpoint());
  RETURN_IF_ERROR(ResolveLeaderAddress());

  // Trainers can attach only once everything they may touch is up. The
  // node segment comes after every port and file: a start that fails
  // before leaves nothing in /dev/shm, one that fails after removes it
  // (~Daemon).
  RETURN_IF_ERROR(CreateFirstNodeSegment());
  RETURN_IF_ERROR(PrepareSocketPath());
  RETURN_IF_ERROR(StartLocalServer());

  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  spdlog::info(
      "event=started pid={} socket={} listen={} listen_port={} node_rank={} num_nodes={} "
      "local_size={} bucket_cap_mb={} first_bucket_cap_mb={} timeout_s={}",
      getpid(), config_.socket_path, config_.listen, listen_port_, config_.node_rank,
      config_.num_nodes, config_.local_size, config_.bucket_cap_mb, config_.first_bucket_cap_mb,
      config_.timeout_ms / 1000.0);
  // Once this daemon serves (its own start-up comes first): the worker
  // starts up while the daemon waits for its trainers and the join.
  if (config_.num_nodes > 1) ClusterLink::PrepareGlooWorker();
  return absl::OkStatus();
}

absl::StatusOr<JobHooks> Daemon::MakeJobHooks() {
  JobHooks hooks;
  hooks.trace_dir = TraceDirectory(std::getenv);
  if (!config_.trace_file.empty()) {
    ASSIGN_OR_RETURN(timeline_, TimelineWriter::Open(config_.trace_file, config_.node_rank));
    hooks.timeline = timeline_.get();
    spdlog::info("event=timeline_started path={}", LogToken(config_.trace_file));
  }
  hooks.gpu = gpu_;
  hooks.iteration_durations = &iteration_durations_;
  if (config_.autotune) {
    // On every node: which one tunes is known once a generation forms.
    autotune_ = std::make_unique<AutotuneDriver>(
        [this] { return EarliestJobWideIteration(); },
        [this](const CapsCandidate& caps, uint64_t at, uint64_t generation) {
          return PublishAutotunedCaps(caps, at, generation);
        });
    hooks.on_iteration_done = [tuner = autotune_.get()](uint64_t job, uint64_t it, uint64_t bytes,
                                                        int64_t end_ns) {
      tuner->OnIterationDone(job, it, bytes, end_ns);
    };
  }
  hooks.on_health = [this](bool serving, const std::string& reason) {
    grpc::Server* server = listen_server_.get();
    if (server == nullptr || server->GetHealthCheckService() == nullptr) return;
    server->GetHealthCheckService()->SetServingStatus(serving);
    if (serving) {
      spdlog::info("event=health status=SERVING");
    } else {
      spdlog::warn("event=health status=NOT_SERVING reason={}", LogValue(reason));
    }
  };
  if (config_.num_nodes > 1 && config_.min_nodes_or_num() < config_.num_nodes) {
    hooks.reform_world =
        [this](const Layout& layout, const ResumePoint& resume,
               std::function<void(const absl::Status&)> on_failure) -> absl::StatusOr<JobWorld> {
      ASSIGN_OR_RETURN(JobWorld world,
                       ClusterLink::Form(jobs_->config(), leader_address_, advertised_listen_,
                                         layout, std::move(on_failure), resume));
      SeatTuner(world, resume);
      return world;
    };
  }
  if (config_.num_nodes > 1) {
    hooks.report_forming = [this](const std::string& report) {
      if (absl::Status st = ClusterLink::ReportForming(jobs_->config(), leader_address_, report);
          !st.ok()) {
        spdlog::info("event=forming_report_failed error={}", LogValue(st.message()));
      }
    };
  }
  return hooks;
}

absl::Status Daemon::StartListenServer() {
  grpc::EnableDefaultHealthCheckService(true);
  // Reflection answers without a token: off when reads need one. Off on
  // the leader of a multi-node job too: gRPC serves it on the server's
  // threads (a stream holds one while open), which there are the job's
  // rendezvous.
  const bool hosts_rendezvous = config_.is_leader() && config_.num_nodes > 1;
  if (!config_.require_auth_for_reads && !hosts_rendezvous) {
    EnableServerReflection();
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::ServerCredentials> credentials,
      MakeServerCredentials(TlsFiles{config_.tls_cert, config_.tls_key, config_.tls_ca}));
  const CallAuth auth(CallAuthPolicy{config_.job_token, !config_.tls_ca.empty(),
                                     config_.require_auth_for_reads, config_.insecure,
                                     ListensOnLoopbackOnly(config_.listen)});
  LogNetworkAuth(auth);
  CreateListenControlService(auth);
  grpc::ServerBuilder builder;
  RETURN_IF_ERROR(AddListeningPort(builder, std::move(credentials)));
  // Control runs on gRPC's callback API within ControlAdmission's bounds:
  // these threads serve the rendezvous (and reflection where it is on).
  LimitServerThreads(builder, "gradsyncd-listen", ListenServerMaxThreads(config_));
  LimitStreamsPerConnection(builder, kMaxStreamsPerListenConnection);
  builder.SetMaxReceiveMessageSize(kMaxRendezvousMessageBytes);
  builder.RegisterService(control_service_.get());
  if (hosts_rendezvous) {
    // Silence longer than this marks a node dead (SIGKILL is noticed at
    // once through Gloo's sockets; this catches hung nodes).
    const absl::Duration heartbeat_timeout =
        std::min(absl::Milliseconds(config_.timeout_ms), absl::Seconds(10));
    rendezvous_service_ = std::make_unique<RendezvousService>(
        config_.job_id, auth, config_.num_nodes, absl::Milliseconds(config_.timeout_ms),
        heartbeat_timeout);
    rendezvous_service_->set_min_nodes(config_.min_nodes_or_num());
    rendezvous_service_->set_max_nodes(config_.max_nodes_or_num());
    builder.RegisterService(rendezvous_service_.get());
  }
  listen_server_ = builder.BuildAndStart();
  if (!listen_server_ || listen_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --listen ", config_.listen));
  }
  listen_server_->GetHealthCheckService()->SetServingStatus(true);
  if (listen_acceptor_) listen_acceptor_->Start(listen_server_.get());
  return absl::OkStatus();
}

void Daemon::LogNetworkAuth(const CallAuth& auth) const {
  const char* tls = config_.tls_cert.empty() ? "off" : "on";
  if (config_.insecure && config_.job_token.empty()) {
    spdlog::warn(
        "event=network_auth {} tls={} listen={} risk=\"anyone reaching --listen may join the "
        "job, drain or reconfigure this daemon\"",
        auth.Describe(), tls, config_.listen);
  } else {
    spdlog::info("event=network_auth {} tls={} listen={}", auth.Describe(), tls, config_.listen);
  }
}

void Daemon::CreateListenControlService(const CallAuth& auth) {
  ControlService::PublishCaps publish;
  if (config_.num_nodes > 1) {
    publish = [this](const DaemonConfig& next, uint64_t version) {
      return PublishCaps(next, version);
    };
  }
  std::function<std::vector<std::string>()> job_stalls;
  if (config_.is_leader() && config_.num_nodes > 1) {
    job_stalls = [this]() -> std::vector<std::string> {
      return rendezvous_service_ ? rendezvous_service_->RecentStallReports()
                                 : std::vector<std::string>{};
    };
  }
  control_service_ = std::make_unique<ControlService>(
      jobs_.get(), [this] { Drain(); }, std::move(publish), std::move(job_stalls), auth);
  AttachControlStats();
}

void Daemon::AttachControlStats() {
  control_service_->set_iteration_durations(&iteration_durations_);
  if (autotune_) {
    control_service_->set_extra_stats(
        [tuner = autotune_.get()](v1::Stats* s) { tuner->FillStats(s); });
  }
}

absl::Status Daemon::AddListeningPort(grpc::ServerBuilder& builder,
                                      std::shared_ptr<grpc::ServerCredentials> credentials) {
  if (!config_.tls_cert.empty()) {
    // TLS needs gRPC's own listener (a handed-over fd is plaintext only):
    // EMFILE then relies on the raised RLIMIT_NOFILE (server_limits).
    builder.AddListeningPort(config_.listen, std::move(credentials), &listen_port_);
    return absl::OkStatus();
  }
  // Plaintext: our own accept loop, which survives running out of fds
  // (gRPC's own listener stops accepting for good after EMFILE).
  auto acceptor = ConnectionAcceptor::ListenTcp(config_.listen);
  if (!acceptor.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --listen ", config_.listen, ": ",
                                               acceptor.status().message()));
  }
  listen_acceptor_ = std::move(*acceptor);
  listen_port_ = listen_acceptor_->port();
  return absl::OkStatus();
}

absl::Status Daemon::StartMetricsEndpoint() {
  // Without --listen there is no Control service yet; /metrics needs its stats.
  if (!control_service_) {
    control_service_ = std::make_unique<ControlService>(jobs_.get(), [this] { Drain(); });
    AttachControlStats();
  }
  const ControlService* control = control_service_.get();
  ASSIGN_OR_RETURN(metrics_, MetricsEndpoint::Start(config_.metrics_listen, [control] {
                     v1::Stats stats;
                     control->FillStats(&stats);
                     return FormatStatsPrometheus(stats);
                   }));
  spdlog::info("event=metrics_listening metrics_listen={} port={}", config_.metrics_listen,
               metrics_->port());
  return absl::OkStatus();
}

absl::Status Daemon::ResolveLeaderAddress() {
  if (config_.num_nodes == 1) return absl::OkStatus();
  // Numeric: the other nodes probe it without a name lookup.
  advertised_listen_ =
      NumericHostPort(AdvertisedListenAddress(config_.listen, config_.host, listen_port_));
  if (!config_.rendezvous.empty()) {
    leader_address_ = config_.rendezvous;  // ClusterLink reaches etcd through it
    return absl::OkStatus();
  }
  if (!config_.is_leader()) {
    leader_address_ = config_.leader;
    return absl::OkStatus();
  }
  // Not 127.0.0.1 blindly: a leader bound to one address listens there only.
  ASSIGN_OR_RETURN(leader_address_, SelfDialAddress(config_.listen, listen_port_));
  return absl::OkStatus();
}

absl::Status Daemon::StartLocalServer() {
  local_service_ = std::make_unique<LocalService>(jobs_.get());
  // The socket is bound (with its mode) and listening before the server
  // starts, but nothing is accepted until the acceptor starts below.
  ASSIGN_OR_RETURN(local_acceptor_,
                   ConnectionAcceptor::ListenUnix(config_.socket_path, config_.socket_mode));
  grpc::ServerBuilder builder;
  LimitServerThreads(builder, "gradsyncd-local", LocalServerMaxThreads(config_));
  builder.RegisterService(local_service_.get());
  local_server_ = builder.BuildAndStart();
  if (!local_server_) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the Local service for ", config_.socket_path));
  }
  // Every connection is checked on the kernel's word before gRPC reads it.
  const std::string path = config_.socket_path;
  local_acceptor_->Start(
      local_server_.get(),
      [uid = geteuid(), group = config_.shm_group, path](int fd) -> ConnectionAcceptor::Verdict {
        absl::StatusOr<PeerCredentials> peer = ReadPeerCredentials(fd);
        if (!peer.ok()) return {peer.status(), "uid=unknown"};
        return {AdmitTrainer(*peer, uid, group),
                absl::StrCat("uid=", peer->uid, " pid=", peer->pid, " socket=", path)};
      });
  return absl::OkStatus();
}

absl::Status Daemon::CreateFirstNodeSegment() {
  for (const std::string& name : ipc::RemoveStaleSegments(config_.shm_prefix)) {
    spdlog::info("event=stale_segment_removed name={}", name);
  }
  ASSIGN_OR_RETURN(ipc::NodeSegment node, CreateNodeSegment(1));
  absl::MutexLock lock(&node_mu_);
  node_ = std::make_shared<ipc::NodeSegment>(std::move(node));
  return absl::OkStatus();
}

void Daemon::RemoveNodeSegment() {
  absl::MutexLock lock(&node_mu_);
  // Only while the name is still ours: someone of our user may have
  // replaced the object under it.
  if (node_ && node_->StillNamed()) ipc::SharedSegment::Remove(node_->name()).IgnoreError();
}

absl::StatusOr<ipc::NodeSegment> Daemon::CreateNodeSegment(int generation) const {
  return ipc::CreateUnderRandomName<ipc::NodeSegment>(
      config_.shm_prefix, getpid(), absl::StrCat("node", generation),
      [this](const std::string& name) {
        return ipc::NodeSegment::Create(name, getpid(), config_.shm_mode, config_.shm_group);
      });
}

std::shared_ptr<ipc::NodeSegment> Daemon::NodeSegmentForNewJob() {
  absl::MutexLock lock(&node_mu_);
  const absl::Status damage = node_->Check();
  if (damage.ok()) return node_;
  // A new name: the old one may now belong to someone else's object.
  auto fresh = CreateNodeSegment(++node_generation_);
  if (!fresh.ok()) {
    // The job's trainers then get Open's clear error instead of a hang.
    spdlog::error("event=node_segment_recreate_failed reason={} error={}",
                  LogValue(damage.message()), LogValue(fresh.status().message()));
    return node_;
  }
  // A damaged header under our own name: nobody may open it any more.
  if (node_->StillNamed()) ipc::SharedSegment::Remove(node_->name()).IgnoreError();
  spdlog::warn("event=node_segment_recreated reason={} old={} new={}", LogValue(damage.message()),
               node_->name(), fresh->name());
  retired_nodes_.erase(std::remove_if(retired_nodes_.begin(), retired_nodes_.end(),
                                      [](const auto& w) { return w.expired(); }),
                       retired_nodes_.end());
  retired_nodes_.push_back(node_);
  node_ = std::make_shared<ipc::NodeSegment>(std::move(*fresh));
  return node_;
}

void Daemon::BeatNodeSegments() {
  absl::MutexLock lock(&node_mu_);
  node_->header()->heartbeat.fetch_add(1, std::memory_order_release);
  for (const auto& weak : retired_nodes_) {
    if (auto old = weak.lock()) old->header()->heartbeat.fetch_add(1, std::memory_order_release);
  }
}

void Daemon::HeartbeatLoop() {
  while (true) {
    {
      MonotonicMutexLock lock(&mu_);
      if (shutdown_) return;
    }
    BeatNodeSegments();
    // Without mu_: reaping takes the registry's and the job's locks.
    if (std::shared_ptr<Job> job = jobs_->Current()) {
      for (uint64_t session : job->ReapUnwatched(std::chrono::seconds(10))) {
        jobs_->RemoveSession(session);
      }
    }
    MonotonicMutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&shutdown_), absl::Milliseconds(100));
  }
}

void Daemon::RequestShutdown(const std::string& why) {
  MonotonicMutexLock lock(&mu_);
  if (shutdown_) return;
  shutdown_ = true;
  shutdown_reason_ = why;
}

absl::Status Daemon::PublishCaps(const DaemonConfig& next, uint64_t version) {
  if (!config_.rendezvous.empty()) return PublishCapsOnEtcd(next);
  if (!config_.is_leader() || !rendezvous_service_) {
    return MakeError(v1::STATE, absl::StrCat("bucket caps are job-wide: set them on the leader "
                                             "daemon (node 0) at ",
                                             config_.leader));
  }
  const double cap_mb = next.bucket_cap_mb;
  const double first_cap_mb = next.first_bucket_cap_mb;
  // Held when no generation runs (the leader's job may be waiting for the
  // other nodes, its Join already made with the old caps): it becomes the
  // next generation's version 1 (RendezvousService::AppendOrHoldConfig).
  const std::optional<RendezvousService::ConfigEntry> entry =
      rendezvous_service_->AppendOrHoldConfig(
          EarliestJobWideIteration(),
          [cap_mb, first_cap_mb](const RendezvousService::ConfigEntry& e) {
            return std::make_pair(ConfigKey(e.generation, e.version),
                                  EncodeConfig(e.generation, e.at_iteration, cap_mb, first_cap_mb));
          });
  if (!entry) return absl::OkStatus();
  spdlog::info(
      "event=job_config_published config_version={} generation={} at_iteration={} "
      "control_version={}",
      entry->version, entry->generation, entry->at_iteration, version);
  return absl::OkStatus();
}

absl::Status Daemon::PublishCapsOnEtcd(const DaemonConfig& next) {
  // No leader: any node appends to the job-wide log in etcd. The nodes run
  // in lockstep, so this node's iteration stands for the job's. Held while
  // no generation runs, as the leader holds it.
  std::shared_ptr<EtcdRendezvous> etcd;
  {
    absl::MutexLock lock(&config_etcd_mu_);
    if (!config_etcd_) {
      ASSIGN_OR_RETURN(config_etcd_, ConnectEtcdRendezvous(config_));
    }
    etcd = config_etcd_;
  }
  ASSIGN_OR_RETURN(std::optional<EtcdConfigEntry> entry,
                   etcd->AppendOrHoldConfig(EarliestJobWideIteration(), next.bucket_cap_mb,
                                            next.first_bucket_cap_mb));
  if (!entry) return absl::OkStatus();
  spdlog::info(
      "event=job_config_published config_version={} generation={} at_iteration={} "
      "rendezvous=etcd",
      entry->version, entry->generation, entry->at_iteration);
  return absl::OkStatus();
}

uint64_t Daemon::EarliestJobWideIteration() {
  // Every node switches at the same iteration, chosen ahead of the fastest
  // node by what it can run in ~2 s (heartbeats carry the change within
  // 0.5 s; a loaded node takes longer); the log keeps it after every earlier
  // version's. A node that still arrives late fails clearly.
  uint64_t max_iteration = 0;
  if (rendezvous_service_) {
    for (const RendezvousStatus::Node& n : rendezvous_service_->GetStatus().nodes) {
      max_iteration = std::max(max_iteration, n.iteration);
    }
  }
  std::shared_ptr<Job> job = jobs_->Current();
  // This node's own count is fresh; the others' come with heartbeats.
  if (job) max_iteration = std::max(max_iteration, job->iteration());
  if (config_.num_nodes == 1) return max_iteration + 2;  // no other node to reach
  // The rate of the last few iterations (not since the job started: its
  // start-up would make a fast job look slow, and the switch land late).
  const double rate = job ? job->IterationRate() : 0;
  return max_iteration + 2 + static_cast<uint64_t>(rate * 2.0 + 0.5);
}

absl::StatusOr<uint64_t> Daemon::PublishAutotunedCaps(const CapsCandidate& caps, uint64_t at,
                                                      uint64_t generation) {
  const BucketCaps bytes{static_cast<uint64_t>(caps.bucket_cap_mb * (1 << 20)),
                         static_cast<uint64_t>(caps.first_bucket_cap_mb * (1 << 20))};
  if (config_.num_nodes == 1) {
    std::shared_ptr<Job> job = jobs_->Current();
    if (!job) return MakeError(v1::STATE, "no running job to tune");
    job->SetCaps(bytes, at);
    return at;
  }
  if (!config_.rendezvous.empty()) {
    // No leader: the tuning node appends to the job-wide log in etcd, as a
    // `config set` on it does.
    if (!tuner_etcd_) {
      ASSIGN_OR_RETURN(tuner_etcd_, ConnectEtcdRendezvous(config_));
    }
    auto record = [&caps](const EtcdConfigEntry& e) {
      return EncodeConfig(e.generation, e.at_iteration, caps.bucket_cap_mb,
                          caps.first_bucket_cap_mb);
    };
    ASSIGN_OR_RETURN(EtcdConfigEntry entry, tuner_etcd_->AppendConfig(at, record, generation));
    return entry.at_iteration;
  }
  if (!rendezvous_service_) {
    return MakeError(v1::STATE, "only the leader daemon (node 0) tunes the job's caps");
  }
  // The leader's log belongs to its active generation: candidates of an
  // older one must not land in a re-formed job's.
  if (std::shared_ptr<Job> job = jobs_->Current(); !job || job->generation() != generation) {
    return MakeError(v1::STATE, absl::StrCat("generation ", generation, " is over"));
  }
  ASSIGN_OR_RETURN(
      RendezvousService::ConfigEntry entry,
      rendezvous_service_->AppendConfig(at, [&caps](const RendezvousService::ConfigEntry& e) {
        return std::make_pair(ConfigKey(e.generation, e.version),
                              EncodeConfig(e.generation, e.at_iteration, caps.bucket_cap_mb,
                                           caps.first_bucket_cap_mb));
      }));
  return entry.at_iteration;
}

void Daemon::Drain() {
  MonotonicMutexLock lock(&mu_);
  if (drain_.joinable() || shutdown_) return;
  jobs_->StopAccepting();
  drain_ = std::thread([this] {
    // Let the iteration in flight complete (bounded by the timeout), so its
    // trainers get their result; then stop. Its own timeout counts from its
    // last progress, which may come just before the drain: outlast it by a
    // margin, so a stuck iteration ends with its TIMEOUT naming who held it
    // up rather than with the drain's shutdown.
    const int64_t margin_ms = std::min<int64_t>(config_.timeout_ms / 4, 1000);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(config_.timeout_ms + margin_ms);
    std::shared_ptr<Job> job = jobs_->Current();
    // Trainers start the next iteration microseconds after one completes:
    // stop when the iteration in flight at drain time has completed.
    const uint64_t in_flight = job ? job->iteration() : 0;
    while (job && std::chrono::steady_clock::now() < deadline) {
      if (!job->InIteration() || job->iteration() > in_flight) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    RequestShutdown("drain");
  });
}

void Daemon::Run() {
  std::string reason;
  {
    MonotonicMutexLock lock(&mu_);
    mu_.Await(absl::Condition(&shutdown_));
    reason = shutdown_reason_;
  }
  spdlog::info("event=shutdown reason={}", LogValue(reason));
  // From now on every etcd call ends within one short budget, all together:
  // an unreachable etcd must not hold the stop up (the lease expires).
  if (!config_.rendezvous.empty()) BeginEtcdShutdown();
  if (listen_server_) listen_server_->GetHealthCheckService()->SetServingStatus(false);
  // Control answers at once from now on: the server's shutdown does not wait
  // on trace renders.
  if (control_service_) control_service_->Stop();
  jobs_->DepartAll(
      MakeError(v1::UNAVAILABLE, absl::StrCat("gradsyncd is shutting down (", reason, ")")));
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  // No connection may be handed to a server that is shutting down.
  local_acceptor_->Stop();
  if (listen_acceptor_) listen_acceptor_->Stop();
  local_server_->Shutdown(deadline);
  if (listen_server_) listen_server_->Shutdown(deadline);
  metrics_.reset();  // no scrape may read the jobs once they go
  if (heartbeat_.joinable()) heartbeat_.join();
  std::thread drain;  // no Drain starts one after shutdown
  {
    MonotonicMutexLock lock(&mu_);
    drain = std::move(drain_);
  }
  if (drain.joinable()) drain.join();
  if (autotune_) autotune_->Stop();  // its thread reads jobs_
  jobs_.reset();                     // stops schedulers, removes trainer segments
  RemoveNodeSegment();
  unlink(config_.socket_path.c_str());
  spdlog::info("event=stopped");
}

}  // namespace gradsync
