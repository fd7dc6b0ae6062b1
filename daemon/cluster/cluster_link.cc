#include "daemon/cluster/cluster_link.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/monotonic.h"
#include "daemon/backends/gloo_backend.h"
#include "daemon/backends/gloo_store.h"
#include "daemon/backends/gloo_worker_backend.h"
#include "daemon/cluster/rendezvous_records.h"
#include "common/status_code.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

constexpr absl::Duration kHeartbeatEvery = absl::Milliseconds(500);

}  // namespace

ClusterLink::ClusterLink(const DaemonConfig& config, std::shared_ptr<RendezvousClient> client,
                         uint64_t generation, std::function<void(const absl::Status&)> on_failure)
    : config_(config),
      client_(std::move(client)),
      generation_(generation),
      on_failure_(std::move(on_failure)) {
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

ClusterLink::~ClusterLink() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  absl::Status st = client_->Leave(config_.node_rank, generation_, "the job's trainers closed");
  if (!st.ok()) {
    spdlog::info("event=leave_failed generation={} error=\"{}\"", generation_,
                 std::string(st.message()));
  }
}

absl::StatusOr<JobWorld> ClusterLink::Form(const DaemonConfig& config, const std::string& leader,
                                           const Layout& layout,
                                           std::function<void(const absl::Status&)> on_failure) {
  RendezvousClientOptions options;
  options.leader = leader;
  options.job_id = config.job_id;
  options.job_token = config.job_token;
  // Short: a dead leader must not hold up a node's shutdown for long.
  options.rpc_timeout = absl::Seconds(3);
  std::shared_ptr<RendezvousClient> client = RendezvousClient::Connect(options);

  std::string host = config.host;
  if (host.empty()) {
    const std::vector<std::string> parts = absl::StrSplit(config.listen, ':');
    host = parts.empty() ? "" : parts[0];
    if (host.empty() || host == "0.0.0.0" || host == "[::]") host = "127.0.0.1";
  }

  // Join; a node whose previous generation has not been aborted yet is told
  // STATE: retry until the leader has moved on or the timeout passes.
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(config.timeout_ms);
  JoinParams join;
  join.node_rank = config.node_rank;
  join.num_nodes = config.num_nodes;
  join.local_size = config.local_size;
  join.host = host;
  absl::StatusOr<JoinResult> joined;
  while (true) {
    join.timeout = std::max(absl::Seconds(1), deadline - MonotonicNow());
    joined = client->Join(join);
    if (joined.ok() || CodeOf(joined.status()) != v1::STATE || MonotonicNow() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!joined.ok()) {
    return MakeError(CodeOf(joined.status()),
                     absl::StrCat("joining the job at leader ", leader, ": ", joined.status().message()));
  }
  const uint64_t gen = joined->generation;
  int rank_offset = 0;
  for (const RendezvousPeer& p : joined->peers) {
    if (p.node_rank < config.node_rank) rank_offset += p.local_size;
  }
  spdlog::info("event=joined generation={} node_rank={} num_nodes={} world_size={} rank_offset={}",
               gen, config.node_rank, config.num_nodes, joined->world_size, rank_offset);

  // Layout agreement: every node publishes its layout and compares every
  // other node's with node 0's, so every node reports the same mismatch.
  const absl::Duration wait = std::max(absl::Seconds(1), deadline - MonotonicNow());
  if (absl::Status st = client->Set(LayoutKey(gen, config.node_rank), EncodeLayout(layout));
      !st.ok()) {
    return st;
  }
  if (config.node_rank == 0) {
    if (absl::Status st = client->Set(
            CapsKey(gen), EncodeCaps(config.bucket_cap_mb, config.first_bucket_cap_mb));
        !st.ok()) {
      return st;
    }
  }
  std::vector<std::string> keys;
  for (int n = 0; n < config.num_nodes; ++n) keys.push_back(LayoutKey(gen, n));
  keys.push_back(CapsKey(gen));
  if (absl::Status st = client->Wait(keys, wait); !st.ok()) {
    return MakeError(CodeOf(st), absl::StrCat("waiting for every node's layout: ", st.message()));
  }
  std::vector<Layout> layouts;
  for (int n = 0; n < config.num_nodes; ++n) {
    absl::StatusOr<std::optional<std::string>> value = client->Get(keys[n]);
    if (!value.ok()) return value.status();
    absl::StatusOr<Layout> l = DecodeLayout(keys[n], *value);
    if (!l.ok()) return l.status();
    layouts.push_back(std::move(*l));
  }
  for (int n = 1; n < config.num_nodes; ++n) {
    if (auto diff = FirstDifference(layouts[0], layouts[n])) {
      return MakeError(v1::MISMATCH,
                       absl::StrCat("layout mismatch between nodes: node ", n,
                                    " registered a different layout than node 0: first difference "
                                    "at ",
                                    *diff));
    }
  }
  absl::StatusOr<std::optional<std::string>> caps_value = client->Get(CapsKey(gen));
  if (!caps_value.ok()) return caps_value.status();
  absl::StatusOr<BucketCaps> agreed = DecodeCaps(CapsKey(gen), *caps_value);
  if (!agreed.ok()) return agreed.status();

  GlooBackendOptions gloo;
  gloo.node_rank = config.node_rank;
  gloo.num_nodes = config.num_nodes;
  gloo.host = host;
  gloo.generation = gen;
  gloo.timeout = absl::Milliseconds(config.timeout_ms);
  gloo.store = std::make_shared<GlooStore>(client, absl::Milliseconds(config.timeout_ms));
  // Gloo runs in a worker process: a malformed message on its port can only
  // fail this generation (daemon/backends/gloo_worker_backend.h).
  absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> backend = GlooWorkerBackend::Create(gloo);
  if (!backend.ok()) {
    HeartbeatParams report;  // tell the leader, so the other nodes stop waiting
    report.node_rank = config.node_rank;
    report.generation = gen;
    report.node_error = backend.status();
    client->Heartbeat(report).IgnoreError();
    return MakeError(CodeOf(backend.status()) == v1::INTERNAL ? v1::PEER_FAILED
                                                              : CodeOf(backend.status()),
                     absl::StrCat("connecting Gloo: ", backend.status().message()));
  }

  auto link = std::unique_ptr<ClusterLink>(new ClusterLink(config, client, gen, std::move(on_failure)));
  ClusterLink* raw = link.get();
  JobWorld world;
  world.world_size = joined->world_size;
  world.rank_offset = rank_offset;
  world.generation = gen;
  world.backend = std::move(*backend);
  world.caps = *agreed;
  world.agree_order = [raw](const std::vector<uint32_t>& local) { return raw->AgreeOrder(local); };
  world.publish = [raw](const std::string& name, const std::string& value) {
    return raw->Publish(name, value);
  };
  world.fetch = [raw](const std::string& name, absl::Time deadline) {
    return raw->Fetch(name, deadline);
  };
  world.link = std::move(link);
  return world;
}

absl::StatusOr<std::vector<uint32_t>> ClusterLink::AgreeOrder(const std::vector<uint32_t>& local) {
  const std::string key = OrderKey(generation_);
  if (config_.node_rank == 0) {
    if (absl::Status st = client_->Set(key, EncodeOrder(local)); !st.ok()) return st;
  }
  if (absl::Status st = client_->Wait({key}, absl::Milliseconds(config_.timeout_ms)); !st.ok()) {
    return st;
  }
  absl::StatusOr<std::optional<std::string>> value = client_->Get(key);
  if (!value.ok()) return value.status();
  return DecodeOrder(key, *value, local.size());
}

absl::Status ClusterLink::Publish(const std::string& name, const std::string& value) {
  return client_->Set(GpuKey(generation_, name), value);
}

absl::StatusOr<std::string> ClusterLink::Fetch(const std::string& name, absl::Time deadline) {
  const std::string key = GpuKey(generation_, name);
  if (absl::Status st =
          client_->Wait({key}, std::max(deadline - MonotonicNow(), absl::ZeroDuration()));
      !st.ok()) {
    return st;
  }
  absl::StatusOr<std::optional<std::string>> value = client_->Get(key);
  if (!value.ok()) return value.status();
  if (!value->has_value()) {
    return MakeError(v1::INTERNAL, absl::StrCat("rendezvous key ", key, " vanished"));
  }
  return **value;
}

void ClusterLink::ReportError(const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  if (failed_) return;  // the failure came from elsewhere: already known
  failed_ = true;
  node_error_ = error;
}

absl::Status ClusterLink::Explain(const absl::Status& error) {
  HeartbeatParams hb;
  hb.node_rank = config_.node_rank;
  hb.generation = generation_;
  absl::StatusOr<HeartbeatResult> r = client_->Heartbeat(hb);
  if (!r.ok()) {
    return MakeError(v1::PEER_FAILED,
                     absl::StrCat(error.message(), "; the leader daemon at ", client_->leader(),
                                  " is unreachable: the leader is dead (",
                                  r.status().message(), ")"));
  }
  if (r->abort && !r->abort_reason.empty()) {
    return MakeError(CodeOf(error), absl::StrCat(error.message(), "; the leader reports: ",
                                                 r->abort_reason));
  }
  return error;
}

void ClusterLink::SetConfigListener(
    std::function<void(const BucketCaps& caps, uint64_t at_iteration)> listener) {
  absl::MutexLock lock(&mu_);
  config_listener_ = std::move(listener);
}

void ClusterLink::ApplyConfig(uint64_t version) {
  const std::string key = ConfigKey(version);
  absl::StatusOr<std::optional<std::string>> value = client_->Get(key);
  if (!value.ok() || !value->has_value()) return;
  absl::StatusOr<JobConfigChange> change = DecodeConfig(key, *value);
  if (!change.ok()) {
    spdlog::error("event=bad_config_record version={} error=\"{}\"", version,
                  std::string(change.status().message()));
    return;
  }
  if (change->generation != generation_) return;  // made for another generation
  std::function<void(const BucketCaps&, uint64_t)> listener;
  {
    absl::MutexLock lock(&mu_);
    listener = config_listener_;
  }
  spdlog::info("event=job_config version={} at_iteration={} bucket_cap_mb={} first_bucket_cap_mb={}",
               version, change->at_iteration, change->bucket_cap_mb, change->first_bucket_cap_mb);
  if (listener) listener(change->caps, change->at_iteration);
}

void ClusterLink::ReportStall(const std::string& description) {
  absl::MutexLock lock(&mu_);
  stall_report_ = description;
}

void ClusterLink::SetProgress(std::function<uint64_t()> iteration) {
  absl::MutexLock lock(&mu_);
  progress_ = std::move(iteration);
}

void ClusterLink::HeartbeatLoop() {
  bool error_sent = false;
  while (true) {
    // Under mu_: what this heartbeat carries.
    HeartbeatParams hb;
    bool sending_error = false;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      hb.node_rank = config_.node_rank;
      hb.generation = generation_;
      hb.iteration = progress_ ? progress_() : 0;
      hb.node_error = error_sent ? absl::OkStatus() : node_error_;
      hb.stall_report = std::move(stall_report_);
      stall_report_.clear();
      sending_error = !node_error_.ok() && !error_sent;
    }
    // Without mu_: the RPC, and what it asks for (config, failing the job).
    absl::StatusOr<HeartbeatResult> r = client_->Heartbeat(hb);
    if (sending_error && r.ok()) error_sent = true;
    uint64_t new_config_version = 0;
    if (r.ok()) {
      absl::MutexLock lock(&mu_);
      if (r->config_version > config_version_seen_) {
        config_version_seen_ = r->config_version;
        new_config_version = r->config_version;
      }
    }
    if (new_config_version != 0) ApplyConfig(new_config_version);
    absl::Status failure;
    if (!r.ok()) {
      failure = MakeError(v1::PEER_FAILED,
                          absl::StrCat("the leader daemon at ", client_->leader(),
                                       " is unreachable (dead leader?): ", r.status().message()));
    } else if (r->abort || r->generation != generation_) {
      failure = MakeError(v1::PEER_FAILED,
                          absl::StrCat("the job was aborted by the leader: ",
                                       r->abort_reason.empty() ? "a newer generation formed"
                                                               : r->abort_reason));
    }
    bool notify = false;
    if (!failure.ok()) {
      absl::MutexLock lock(&mu_);
      if (!failed_ && !stop_) {
        failed_ = true;
        notify = true;
      }
    }
    // Fails the local job; it reports back via ReportError (ignored).
    if (notify) on_failure_(failure);

    // Until the next beat, or sooner for an error or stall to report.
    absl::MutexLock lock(&mu_);
    auto report_now = [this, error_sent] {
      mu_.AssertReaderHeld();
      return stop_ || (!node_error_.ok() && !error_sent) || !stall_report_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&report_now), kHeartbeatEvery);
  }
}

}  // namespace gradsync
