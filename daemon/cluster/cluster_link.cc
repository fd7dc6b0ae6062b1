#include "daemon/cluster/cluster_link.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "common/tls_credentials.h"
#include "daemon/backends/gloo_backend.h"
#include "daemon/backends/gloo_store.h"
#include "daemon/backends/gloo_worker_backend.h"
#include "daemon/backends/wire_dtype.h"
#include "daemon/cluster/abort_code.h"
#include "daemon/cluster/etcd/etcd_operation_deadline.h"
#include "daemon/cluster/etcd_rendezvous_config.h"
#include "daemon/cluster/failed_grow.h"
#include "daemon/cluster/forming_watch.h"
#include "daemon/cluster/liveness_probe.h"
#include "daemon/cluster/rendezvous_client.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

constexpr absl::Duration kHeartbeatEvery = absl::Milliseconds(500);
// Each RPC to the leader. Short: a dead leader must not hold up a node's
// shutdown for long.
constexpr absl::Duration kLeaderRpcTimeout = absl::Seconds(3);
// After an abort, a member that stays silent this long while the others
// answer is presumed dead (four missed heartbeats: a loaded but live node
// answers well within it).
constexpr absl::Duration kPresumedDeadAfter = absl::Milliseconds(4 * 500);
// How often the leader is asked meanwhile.
constexpr absl::Duration kSilencePoll = absl::Milliseconds(100);
// How long a node whose collective failed waits for another node's report
// of the cause (sent at once, one RPC) before reporting its own symptom.
constexpr absl::Duration kCauseReportGrace = absl::Milliseconds(2 * 500);

// How long the leader watch waits on the connection at a time: what the
// link's destruction may wait for it.
constexpr absl::Duration kLeaderWatchPoll = absl::Milliseconds(50);
// While the connection to the leader is down and its port does not refuse
// (a reconnect, a partition), how often the port is probed again.
constexpr absl::Duration kLeaderReprobeEvery = absl::Milliseconds(250);
// A killed daemon's connections can reset a moment before its listening
// port closes: a port that still accepts right after the connection to it
// was lost is probed again, this often, for this long.
constexpr absl::Duration kLeaderDyingReprobe = absl::Milliseconds(20);
constexpr absl::Duration kLeaderDyingFor = absl::Milliseconds(500);

// Every node's records of a generation, key -> value, fetched in one Wait.
using Records = std::map<std::string, std::string>;

// MISMATCH naming the first member whose `flag` (published under
// key_of(node)) differs from the first member's, and both values: every node
// compares with the same first member, so all report the same error. A
// member that published none (an older daemon) counts as `if_absent`.
absl::Status CompareFlagAcrossNodes(const Records& records, const std::vector<int>& members,
                                    absl::FunctionRef<std::string(int)> key_of,
                                    absl::string_view flag, absl::string_view if_absent) {
  std::vector<std::string> by_node;
  for (int n : members) {
    const auto it = records.find(key_of(n));
    by_node.push_back(it != records.end() ? it->second : std::string(if_absent));
  }
  for (size_t i = 1; i < members.size(); ++i) {
    if (by_node[i] == by_node[0]) continue;
    return MakeError(v1::MISMATCH,
                     absl::StrCat(flag, " differs between nodes: node ", members[0], " runs ", flag,
                                  "=", by_node[0], " but node ", members[i], " runs ", flag, "=",
                                  by_node[i], "; every node of a job must use the same ", flag));
  }
  return absl::OkStatus();
}

// The version of the rule daemon/engine/bucket_planner.cc cuts buckets by:
// daemons that cut differently would pair unlike buckets, so the nodes
// compare it when a generation forms. Raise it with any change to the cut.
constexpr int kBucketCuttingRule = 1;

// Each node's bucket-cutting rule, decimal ("g<gen>/bucket_rule/<rank>").
std::string BucketRuleKey(uint64_t generation, int node_rank) {
  return absl::StrCat(GenerationKeyPrefix(generation), "bucket_rule/", node_rank);
}

// Test-only (inert unless set): the bucket-cutting rule this daemon
// advertises instead of its own, to stand for a daemon of another version.
constexpr char kAdvertiseBucketRule[] = "GRADSYNC_TEST_ADVERTISE_BUCKET_RULE";

// Test-only (inert unless set): a re-formation holds after its Join until
// the file named here exists (at most the forming deadline), so that a
// test can take etcd's quorum away while the survivors form the new world.
constexpr char kHoldReformUntil[] = "GRADSYNC_TEST_HOLD_REFORM_AFTER_JOIN_UNTIL";

void MaybeHoldReform(const ResumePoint& resume, uint64_t generation, absl::Time deadline) {
  const char* until = std::getenv(kHoldReformUntil);
  if (until == nullptr || *until == '\0' || resume.generation == 0 || resume.grow) return;
  spdlog::warn("event=test_hook_armed hook={} generation={} until_file={}", kHoldReformUntil,
               generation, LogValue(until));
  while (::access(until, F_OK) != 0 && MonotonicNow() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// Test-only (inert unless set): a node joining the running job holds just
// before it connects its Gloo mesh (or, with the second, before it
// publishes its records for the agreement) until the file named here
// exists (at most the forming deadline), so that a test can kill it at
// that moment.
constexpr char kHoldJoinerBeforeMesh[] = "GRADSYNC_TEST_HOLD_JOINER_BEFORE_MESH_UNTIL";
constexpr char kHoldJoinerBeforeAgreement[] = "GRADSYNC_TEST_HOLD_JOINER_BEFORE_AGREEMENT_UNTIL";

void MaybeHoldJoiner(const char* hook, bool joins_running, uint64_t generation,
                     absl::Time deadline) {
  const char* until = std::getenv(hook);
  if (until == nullptr || *until == '\0' || !joins_running) return;
  spdlog::warn("event=test_hook_armed hook={} generation={} until_file={}", hook, generation,
               LogValue(until));
  while (::access(until, F_OK) != 0 && MonotonicNow() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string AdvertisedBucketRule() {
  const char* rule = std::getenv(kAdvertiseBucketRule);
  if (rule == nullptr || *rule == '\0') return absl::StrCat(kBucketCuttingRule);
  spdlog::warn("event=test_hook_armed hook={} rule={}", kAdvertiseBucketRule, LogValue(rule));
  return rule;
}

// MISMATCH naming the first member whose bucket-cutting rule differs from
// the first member's, both nodes and both rules. A member that published
// none is a daemon from before the rule was published: it cut by rule 1.
absl::Status CompareBucketRules(const Records& records, uint64_t gen,
                                const std::vector<int>& members) {
  std::vector<std::string> rules;
  for (int n : members) {
    const auto it = records.find(BucketRuleKey(gen, n));
    rules.push_back(it != records.end() ? it->second : "1");
  }
  for (size_t i = 1; i < members.size(); ++i) {
    if (rules[i] == rules[0]) continue;
    return MakeError(
        v1::MISMATCH,
        absl::StrCat("the nodes' gradsyncd versions cut buckets differently: node ", members[0],
                     " cuts by bucket rule ", rules[0], " but node ", members[i],
                     " by bucket rule ", rules[i],
                     "; every node of a job must run a gradsyncd that cuts buckets alike"));
  }
  return absl::OkStatus();
}

// The flags every node of a job must share, compared when the job forms
// rather than found out later: --wire-dtype (nodes that cast differently
// would pair 16-bit halves with fp32 words), --check-replicas-every (a node
// checking at other iterations would meet the others' comparison with a
// collective of its own), --min-nodes (a node that would fail at a death
// while the others re-form, or the reverse) and --autotune (the first
// member tunes for every node: one without it would neither tune nor be
// tuned for, yet report that the first member tunes).
absl::Status CompareSharedFlags(const Records& records, uint64_t gen,
                                const std::vector<int>& members) {
  RETURN_IF_ERROR(CompareFlagAcrossNodes(
      records, members, [gen](int n) { return WireDTypeKey(gen, n); }, "--wire-dtype", "(none)"));
  RETURN_IF_ERROR(CompareFlagAcrossNodes(
      records, members, [gen](int n) { return CheckReplicasEveryKey(gen, n); },
      "--check-replicas-every", "0"));
  RETURN_IF_ERROR(CompareFlagAcrossNodes(
      records, members, [gen](int n) { return MinNodesKey(gen, n); }, "--min-nodes", "(none)"));
  RETURN_IF_ERROR(CompareBucketRules(records, gen, members));
  return CompareFlagAcrossNodes(
      records, members, [gen](int n) { return AutotuneKey(gen, n); }, "--autotune", "(none)");
}

// Where the embedded leader's daemon listens, for a node other than the
// leader's; "" where there is none to probe (etcd, the leader's own node,
// a leader that sent no listen address).
std::string LeaderAddress(const DaemonConfig& config, const JobRendezvous& client,
                          const std::vector<RendezvousPeer>& probe_targets) {
  if (!client.embedded() || config.is_leader()) return "";
  const auto leader = std::find_if(probe_targets.begin(), probe_targets.end(),
                                   [](const RendezvousPeer& p) { return p.node_rank == 0; });
  return leader != probe_targets.end() ? leader->listen_address : "";
}

}  // namespace

ClusterLink::ClusterLink(const DaemonConfig& config, std::shared_ptr<JobRendezvous> client,
                         uint64_t generation, std::vector<int> members,
                         std::vector<RendezvousPeer> probe_targets, size_t num_tensors,
                         std::function<void(const absl::Status&)> on_failure)
    : config_(config),
      client_(std::move(client)),
      generation_(generation),
      members_(std::move(members)),
      probe_targets_(std::move(probe_targets)),
      leader_address_(LeaderAddress(config_, *client_, probe_targets_)),
      num_tensors_(num_tensors),
      on_failure_(std::move(on_failure)),
      config_log_(generation, config.node_rank,
                  [this](const std::string& key) { return client_->Get(key); }) {
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  // The embedded leader lives in node 0's daemon: its death shows first as
  // the connection to it closing, long before a heartbeat's deadline.
  if (!leader_address_.empty()) leader_watch_ = std::thread([this] { WatchLeader(); });
}

ClusterLink::~ClusterLink() {
  {
    MonotonicMutexLock lock(&mu_);
    stop_ = true;
  }
  if (leader_watch_.joinable()) leader_watch_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Departing, the Depart is this node's last word (the loop may have sent it).
  bool departing = false;
  {
    MonotonicMutexLock lock(&mu_);
    departing = !departure_.ok();
    if (retired_ && !departing) return;  // its Join of the next generation says it all
  }
  if (departing) {
    SendDeparture();
    PrepareGlooWorker();
    return;
  }
  // An error reported just before the job ended (its trainers left at
  // once) goes before the Leave: the leader's abort reason must be the
  // cause, which names the culprit, not "left".
  HeartbeatParams last;
  {
    MonotonicMutexLock lock(&mu_);
    if (!error_sent_) last.node_error = node_error_;
  }
  if (!last.node_error.ok()) {
    last.node_rank = config_.node_rank;
    last.generation = generation_;
    client_->Heartbeat(last).IgnoreError();
  }
  absl::Status st = client_->Leave(config_.node_rank, generation_, "the job's trainers closed");
  if (!st.ok()) {
    spdlog::info("event=leave_failed generation={} error={}", generation_, LogValue(st.message()));
  }
  PrepareGlooWorker();
}

void ClusterLink::PrepareGlooWorker() { GlooWorkerBackend::PrepareSpare(); }

namespace {

// The daemon's own certificate is its client certificate too. With
// --rendezvous etcd://..., etcd instead of the leader daemon.
absl::StatusOr<std::shared_ptr<JobRendezvous>> ConnectRendezvous(const DaemonConfig& config,
                                                                 const std::string& leader) {
  if (!config.rendezvous.empty()) {
    ASSIGN_OR_RETURN(std::shared_ptr<EtcdRendezvous> etcd, ConnectEtcdRendezvous(config));
    return std::shared_ptr<JobRendezvous>(std::move(etcd));
  }
  ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::ChannelCredentials> credentials,
      MakeChannelCredentials(TlsFiles{config.tls_cert, config.tls_key, config.tls_ca}));
  RendezvousClientOptions options;
  options.leader = leader;
  options.job_id = config.job_id;
  options.job_token = config.job_token;
  options.credentials = std::move(credentials);
  options.rpc_timeout = kLeaderRpcTimeout;
  return std::shared_ptr<JobRendezvous>(RendezvousClient::Connect(options));
}

// Who aborted a generation, as errors name it.
std::string AbortSource(const JobRendezvous& client) {
  return client.embedded() ? "the leader" : "etcd";
}

// Marks a status as the leader's refused probe, which proves its death.
constexpr absl::string_view kLeaderRefusedPayload = "gradsync.leader_refuses_connections";

absl::Status LeaderRefusal(const std::string& address) {
  absl::Status refused = MakeError(v1::UNAVAILABLE, RefusesConnections(address));
  refused.SetPayload(kLeaderRefusedPayload, absl::Cord("1"));
  return refused;
}

// How a rendezvous that did not answer is named: the leader daemon, whose
// loss ends the job, or etcd. A node cut off by a partition sees the same
// silence as at the leader's death, so the error names both, unless the
// leader's port refused connections: only a dead daemon does that.
std::string Unreachable(const JobRendezvous& client, const absl::Status& transport) {
  if (client.embedded()) {
    const bool proved = transport.GetPayload(kLeaderRefusedPayload).has_value();
    return absl::StrCat(client.Describe(), " is unreachable: the leader is dead",
                        proved ? "" : " or this node is cut off from it", " (", transport.message(),
                        ")");
  }
  // Its errors start with its name ("etcd at ... has not answered"): once.
  absl::string_view cause = transport.message();
  if (absl::ConsumePrefix(&cause, client.Describe())) {
    return absl::StrCat("the job's rendezvous, ", client.Describe(), ", is unreachable: it", cause);
  }
  return absl::StrCat("the job's rendezvous, ", client.Describe(), ", is unreachable (", cause,
                      ")");
}

// The address this node's Gloo device binds: --host, else --listen's host,
// with loopback for none or a wildcard.
std::string GlooHost(const DaemonConfig& config) {
  if (!config.host.empty()) return config.host;
  // --listen is HOST:PORT with an IPv6 host in brackets: the host is what
  // precedes the last ':', without the brackets Gloo's resolver refuses.
  const size_t colon = config.listen.rfind(':');
  std::string host = colon == std::string::npos ? "" : config.listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "::") host = "127.0.0.1";
  return host;
}

// Joins the next generation. A node whose previous generation has not been
// aborted yet is told STATE: retry until the leader has moved on or the
// deadline passes.
absl::StatusOr<JoinResult> JoinGeneration(JobRendezvous& client, const DaemonConfig& config,
                                          const std::string& leader, const std::string& host,
                                          const std::string& listen_address,
                                          const ResumePoint& resume, absl::Time deadline) {
  JoinParams join;
  join.listen_address = listen_address;
  join.resume_generation = resume.generation;
  join.resume_iteration = resume.iteration;
  join.node_rank = config.node_rank;
  join.num_nodes = config.num_nodes;
  join.local_size = config.local_size;
  join.host = host;
  absl::StatusOr<JoinResult> joined;
  while (true) {
    join.timeout = std::max(absl::Seconds(1), deadline - MonotonicNow());
    joined = client.Join(join);
    // A survivor's refusal (STATE) will not change: it fails at once.
    if (joined.ok() || CodeOf(joined.status()) != v1::STATE || MonotonicNow() >= deadline ||
        resume.generation != 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (!joined.ok()) {
    // Named once: etcd's own errors start with its name.
    const bool named = absl::StartsWith(joined.status().message(), client.Describe());
    return MakeError(
        CodeOf(joined.status()),
        absl::StrCat("joining the job",
                     client.embedded() ? absl::StrCat(" at the leader daemon (", leader, ")")
                     : named           ? ""
                                       : absl::StrCat(" at ", client.Describe()),
                     ": ", joined.status().message()));
  }
  return joined;
}

// The global rank of this node's local rank 0, as the rendezvous assigned
// it (rank_offsets.h): kept across re-formations, never another's.
int RankOffset(const JoinResult& joined, int node_rank) {
  for (const RendezvousPeer& p : joined.peers) {
    if (p.node_rank == node_rank) return p.rank_offset;
  }
  return 0;
}

// Publishes this node's records: its --check-replicas-every, --min-nodes,
// --autotune, layout and wire dtype; the generation's first member (node 0 unless it
// died: on etcd any node may) also the job's bucket caps and
// --uneven-inputs. Returns the wire dtype published.
absl::StatusOr<WireDType> PublishRecords(JobRendezvous& client, const DaemonConfig& config,
                                         uint64_t gen, int first_member, const Layout& layout) {
  // Before the layout, which the others wait for: once it is there, so are these.
  RETURN_IF_ERROR(client.Set(CheckReplicasEveryKey(gen, config.node_rank),
                             absl::StrCat(config.check_replicas_every)));
  RETURN_IF_ERROR(
      client.Set(MinNodesKey(gen, config.node_rank), absl::StrCat(config.min_nodes_or_num())));
  RETURN_IF_ERROR(client.Set(AutotuneKey(gen, config.node_rank), config.autotune ? "on" : "off"));
  RETURN_IF_ERROR(client.Set(BucketRuleKey(gen, config.node_rank), AdvertisedBucketRule()));
  RETURN_IF_ERROR(client.Set(LayoutKey(gen, config.node_rank), EncodeLayout(layout)));
  ASSIGN_OR_RETURN(WireDType wire_dtype, ParseWireDType(config.wire_dtype));
  RETURN_IF_ERROR(client.Set(WireDTypeKey(gen, config.node_rank), WireDTypeName(wire_dtype)));
  if (config.node_rank == first_member) {
    RETURN_IF_ERROR(
        client.Set(CapsKey(gen), EncodeCaps(config.bucket_cap_mb, config.first_bucket_cap_mb)));
    RETURN_IF_ERROR(client.Set(UnevenInputsKey(gen), config.uneven_inputs ? "1" : "0"));
  }
  return wire_dtype;
}

// Every node's records, once all are published (up to `wait`).
absl::StatusOr<Records> WaitForRecords(JobRendezvous& client, const std::vector<int>& members,
                                       uint64_t gen, absl::Duration wait) {
  std::vector<std::string> keys;
  for (int n : members) keys.push_back(LayoutKey(gen, n));
  keys.push_back(CapsKey(gen));
  for (int n : members) keys.push_back(WireDTypeKey(gen, n));
  keys.push_back(UnevenInputsKey(gen));
  // Published before each node's layout, read in the same answer; one a
  // node did not publish (an older daemon) counts as its flag's default.
  std::vector<std::string> read_keys;
  for (int n : members) read_keys.push_back(MinNodesKey(gen, n));
  for (int n : members) read_keys.push_back(CheckReplicasEveryKey(gen, n));
  for (int n : members) read_keys.push_back(AutotuneKey(gen, n));
  for (int n : members) read_keys.push_back(BucketRuleKey(gen, n));
  absl::StatusOr<Records> records = client.WaitForValues(keys, read_keys, wait);
  if (!records.ok()) {
    return MakeError(CodeOf(records.status()),
                     absl::StrCat("waiting for every node's layout: ", records.status().message()));
  }
  return records;
}

std::optional<std::string> Lookup(const Records& records, const std::string& key) {
  const auto it = records.find(key);
  return it == records.end() ? std::nullopt : std::optional<std::string>(it->second);
}

// A node joining the running job: the members' plan, published by the
// generation's first member (up to `deadline`).
absl::StatusOr<RunningPlan> FetchRunningPlan(JobRendezvous& client, uint64_t gen,
                                             size_t num_tensors, absl::Time deadline) {
  const std::string key = RunningPlanKey(gen);
  absl::StatusOr<Records> value =
      client.WaitForValues({key}, std::max(absl::Seconds(1), deadline - MonotonicNow()));
  if (!value.ok()) {
    return MakeError(CodeOf(value.status()),
                     absl::StrCat("joining the running job: waiting for the members' plan: ",
                                  value.status().message()));
  }
  return DecodeRunningPlan(key, Lookup(*value, key), num_tensors);
}

// MISMATCH naming the first node whose layout differs from node 0's, and
// the first differing tensor: every node compares with node 0, so all
// report the same error.
absl::Status CompareLayouts(const Records& records, uint64_t gen, const std::vector<int>& members) {
  std::vector<Layout> layouts;
  for (int n : members) {
    const std::string key = LayoutKey(gen, n);
    ASSIGN_OR_RETURN(Layout layout, DecodeLayout(key, Lookup(records, key)));
    layouts.push_back(std::move(layout));
  }
  for (size_t i = 1; i < members.size(); ++i) {
    if (auto diff = FirstDifference(layouts[0], layouts[i])) {
      return MakeError(v1::MISMATCH,
                       absl::StrCat("layout mismatch between nodes: node ", members[i],
                                    " registered a different layout than node ", members[0],
                                    ": first difference at ", *diff));
    }
  }
  return absl::OkStatus();
}

// Every comparison of the records of `members`.
absl::Status CompareRecords(const Records& records, uint64_t gen, const std::vector<int>& members) {
  RETURN_IF_ERROR(CompareLayouts(records, gen, members));
  return CompareSharedFlags(records, gen, members);
}

// CompareRecords; a disagreement where the members that ran before agree
// among themselves is the fault of the joiners that differ from them
// (failed_grow.h: the members drop those and train on).
absl::Status CompareWithJoiners(const Records& records, uint64_t gen,
                                const std::vector<int>& members, const std::vector<int>& joiners) {
  absl::Status st = CompareRecords(records, gen, members);
  if (st.ok() || joiners.empty()) return st;
  auto joins = [&joiners](int n) {
    return std::find(joiners.begin(), joiners.end(), n) != joiners.end();
  };
  std::vector<int> old;
  for (int n : members) {
    if (!joins(n)) old.push_back(n);
  }
  if (old.empty() || !CompareRecords(records, gen, old).ok()) return st;
  std::vector<int> culprits;
  for (int j : joiners) {
    std::vector<int> with = old;
    with.insert(std::upper_bound(with.begin(), with.end(), j), j);
    if (!CompareRecords(records, gen, with).ok()) culprits.push_back(j);
  }
  return BlameJoiners(std::move(st), culprits);
}

// What every node of the generation agreed on.
struct Agreement {
  WireDType wire_dtype = WireDType::kOff;
  BucketCaps caps{0, 0};       // node 0's, so every node plans the same buckets
  bool uneven_inputs = false;  // node 0's
};

// Every node publishes its records and compares every other node's with
// the first member's (so every node reports the same mismatch); then reads
// the caps and --uneven-inputs of `first_member` (node 0 unless it died or
// joins the running job).
absl::StatusOr<Agreement> Agree(JobRendezvous& client, const DaemonConfig& config, uint64_t gen,
                                const std::vector<int>& members, const std::vector<int>& joiners,
                                int first_member, const Layout& layout, absl::Time deadline) {
  const absl::Duration wait = std::max(absl::Seconds(1), deadline - MonotonicNow());
  Agreement agreed;
  {
    // On etcd, the records' writes end with the agreement too, not a call
    // budget each (the wait for the others' bounds its own reads).
    EtcdOperationDeadline bound("agreement", MonotonicNow() + wait, wait);
    ASSIGN_OR_RETURN(agreed.wire_dtype, PublishRecords(client, config, gen, first_member, layout));
  }
  ASSIGN_OR_RETURN(const Records records, WaitForRecords(client, members, gen, wait));
  RETURN_IF_ERROR(CompareWithJoiners(records, gen, members, joiners));
  ASSIGN_OR_RETURN(agreed.caps, DecodeCaps(CapsKey(gen), Lookup(records, CapsKey(gen))));
  const std::optional<std::string> uneven = Lookup(records, UnevenInputsKey(gen));
  agreed.uneven_inputs = uneven.has_value() && *uneven == "1";
  return agreed;
}

// Gloo ranks are places in the generation's member list: node ranks keep
// naming daemons when an elastic job re-formed without some.
GlooBackendOptions GlooOptions(const DaemonConfig& config, std::shared_ptr<JobRendezvous> client,
                               const std::string& host, uint64_t gen, WireDType wire_dtype,
                               int world_size, const std::vector<int>& members) {
  GlooBackendOptions gloo;
  gloo.node_rank = static_cast<int>(std::find(members.begin(), members.end(), config.node_rank) -
                                    members.begin());
  gloo.num_nodes = static_cast<int>(members.size());
  gloo.host = host;
  gloo.generation = gen;
  gloo.store_prefix = GlooKeyPrefix(gen);
  // Longer than the timeout: a node waiting for its own stopped trainer
  // fails at the timeout naming it, and the leader's abort carries that
  // name here; a Gloo timeout first would only say "timed out waiting for
  // recv". A stopped node is caught by the leader's heartbeat timeout.
  gloo.timeout = 2 * absl::Milliseconds(config.timeout_ms);
  gloo.store =
      std::make_shared<GlooStore>(std::move(client), absl::Milliseconds(config.timeout_ms));
  gloo.wire_dtype = wire_dtype;
  gloo.world_size = world_size;
  return gloo;
}

// Gloo runs in a worker process: a malformed message on its port can only
// fail this generation (daemon/backends/gloo_worker_backend.h). `backend`
// was started before the agreement, so that the worker's process start-up
// overlaps the rendezvous traffic.
absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> ConnectGloo(
    std::shared_ptr<JobRendezvous> client, int node_rank, const GlooBackendOptions& gloo,
    std::unique_ptr<GlooWorkerBackend> backend, std::vector<RendezvousPeer> joiners) {
  absl::Status connected;
  {
    // Another node failing while the mesh connects aborts the generation
    // at the leader: stop connecting then, with its reason.
    // A joiner killed meanwhile is found by its refused port (forming_watch.h).
    FormingWatch watch(std::move(client), node_rank, gloo.generation, backend.get(),
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(kHeartbeatEvery)),
                       std::move(joiners));
    connected = backend->ConnectMesh(gloo);
  }  // the watch is gone before the backend may be
  RETURN_IF_ERROR(connected);
  return backend;
}

// Gloo did not connect: tells the leader, so the other nodes stop waiting.
// The error names the leader's abort reason when another node failed first
// (that is the cause, what Gloo saw here, a refused connection, only its
// symptom).
absl::Status GlooFailed(JobRendezvous& client, int node_rank, uint64_t gen,
                        const absl::Status& error) {
  HeartbeatParams report;
  report.node_rank = node_rank;
  report.generation = gen;
  report.node_error = error;
  const absl::StatusOr<HeartbeatResult> r = client.Heartbeat(report);
  std::string leader_says;
  if (r.ok() && r->abort && !r->abort_reason.empty() &&
      !absl::StartsWith(r->abort_reason, absl::StrCat("node_rank=", node_rank, " ")) &&
      !absl::StrContains(error.message(), r->abort_reason)) {
    leader_says = absl::StrCat("; ", AbortSource(client), " reports: ", r->abort_reason);
  }
  return MakeError(
      CodeOf(error) == v1::INTERNAL || !leader_says.empty() ? v1::PEER_FAILED : CodeOf(error),
      absl::StrCat("connecting Gloo: ", error.message(), leader_says));
}

// The members a failure lost, logged and named: those that left the job
// (their daemon shut down) and those presumed dead (silent while the
// others answered).
std::string DescribeLostNodes(uint64_t generation, const std::vector<SilentMember>& lost) {
  std::string departed, refused, dead;
  int dead_count = 0;
  absl::Duration silent;
  for (const SilentMember& m : lost) {
    if (m.departed) {
      absl::StrAppend(&departed, departed.empty() ? "" : ", ", "node_rank=", m.node_rank,
                      " (host=", m.host, ")");
      spdlog::warn("event=node_departed generation={} node_rank={} host={}", generation,
                   m.node_rank, m.host);
      continue;
    }
    if (m.refuses_connections) {
      absl::StrAppend(&refused, refused.empty() ? "" : "; ", "node_rank=", m.node_rank,
                      " (host=", m.host, ") is dead: ", RefusesConnections(m.listen_address));
      spdlog::error(
          "event=node_presumed_dead generation={} node_rank={} host={} address={} "
          "reason=\"connection refused\"",
          generation, m.node_rank, m.host, m.listen_address);
      continue;
    }
    absl::StrAppend(&dead, dead.empty() ? "" : ", ", "node_rank=", m.node_rank, " (host=", m.host,
                    ")");
    if (dead_count++ == 0) silent = m.silent;
    spdlog::error("event=node_presumed_dead generation={} node_rank={} host={} silent_ms={}",
                  generation, m.node_rank, m.host, absl::ToInt64Milliseconds(m.silent));
  }
  std::string out;
  if (!departed.empty()) absl::StrAppend(&out, departed, " left the job: its daemon shut down");
  if (!refused.empty()) absl::StrAppend(&out, out.empty() ? "" : "; ", refused);
  if (!dead.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", dead, dead_count == 1 ? " is" : " are",
                    " dead: no heartbeat from its daemon for ", absl::ToInt64Milliseconds(silent),
                    " ms, while the other nodes answered after the failure");
  }
  return out;
}

}  // namespace

absl::Status ClusterLink::ReportForming(const DaemonConfig& config, const std::string& leader,
                                        const std::string& report) {
  ASSIGN_OR_RETURN(std::shared_ptr<JobRendezvous> client, ConnectRendezvous(config, leader));
  return client->Set(FormingReportKey(config.node_rank), report);
}

absl::StatusOr<JobWorld> ClusterLink::Form(const DaemonConfig& config, const std::string& leader,
                                           const std::string& listen_address, const Layout& layout,
                                           std::function<void(const absl::Status&)> on_failure,
                                           const ResumePoint& resume) {
  ASSIGN_OR_RETURN(std::shared_ptr<JobRendezvous> client, ConnectRendezvous(config, leader));
  GrowAttempt attempt;
  absl::StatusOr<JobWorld> world =
      FormWith(config, client, leader, listen_address, layout, on_failure, resume, &attempt);
  if (world.ok() || attempt.generation == 0) return world;
  // A joiner that could not join leaves for good: the members count it
  // out at once rather than after its silence.
  if (attempt.joins_running) {
    return DepartFailedJoiner(*client, config.node_rank, attempt.generation, world.status());
  }
  if (!resume.grow) return world;
  const std::vector<DroppedJoiner> dropped =
      CulpritJoiners(*client, config.node_rank, attempt, world.status());
  if (dropped.empty()) return world;
  // The members re-form the aborted grown generation among themselves, at
  // the same boundary, as survivors of a death do.
  DropJoiners(*client, config.node_rank, attempt.generation, dropped);
  const ResumePoint without{attempt.generation, resume.iteration, false, {}};
  GrowAttempt again;
  return FormWith(config, client, leader, listen_address, layout, std::move(on_failure), without,
                  &again);
}

absl::StatusOr<JobWorld> ClusterLink::FormWith(const DaemonConfig& config,
                                               std::shared_ptr<JobRendezvous> client,
                                               const std::string& leader,
                                               const std::string& listen_address,
                                               const Layout& layout,
                                               std::function<void(const absl::Status&)> on_failure,
                                               const ResumePoint& resume, GrowAttempt* attempt) {
  const std::string host = GlooHost(config);
  const absl::Time deadline = MonotonicNow() + absl::Milliseconds(config.timeout_ms);
  ASSIGN_OR_RETURN(JoinResult joined,
                   JoinGeneration(*client, config, leader, host, listen_address, resume, deadline));
  const uint64_t gen = joined.generation;
  *attempt = AttemptOf(joined, config.node_rank);
  const int rank_offset = RankOffset(joined, config.node_rank);
  std::vector<int> members;
  std::vector<RendezvousPeer> probe_targets;
  // The lowest member that holds the job's state: a node joining the
  // running job (node 0 too, on etcd) publishes neither caps nor plan.
  int first_member = -1;
  for (const RendezvousPeer& p : joined.peers) {
    if (p.local_size > 0) members.push_back(p.node_rank);
    if (p.local_size > 0 && !p.joins_running && first_member < 0) first_member = p.node_rank;
    if (p.local_size > 0 && p.node_rank != config.node_rank && !p.listen_address.empty()) {
      probe_targets.push_back(p);
    }
  }
  if (std::find(members.begin(), members.end(), config.node_rank) == members.end()) {
    return MakeError(v1::INTERNAL, absl::StrCat("generation ", gen, " formed without node_rank=",
                                                config.node_rank, ", which joined it"));
  }
  if (first_member < 0) first_member = members.front();
  spdlog::info(
      "event=joined generation={} node_rank={} num_nodes={} members={} world_size={} "
      "rank_offset={}",
      gen, config.node_rank, config.num_nodes, members.size(), joined.world_size, rank_offset);
  MaybeHoldReform(resume, gen, deadline);
  // Started now, connected once the agreement has the wire dtype.
  GlooBackendOptions gloo =
      GlooOptions(config, client, host, gen, WireDType::kOff, joined.world_size, members);
  absl::StatusOr<std::unique_ptr<GlooWorkerBackend>> backend = GlooWorkerBackend::Start(gloo);
  if (!backend.ok()) return GlooFailed(*client, config.node_rank, gen, backend.status());
  // Nodes join the running job: the first member hands them the plan.
  if (resume.grow && config.node_rank == first_member) {
    RETURN_IF_ERROR(client->Set(RunningPlanKey(gen), EncodeRunningPlan(resume.plan)));
  }
  std::vector<int> joiners;
  for (const RendezvousPeer& p : attempt->joiners) joiners.push_back(p.node_rank);
  if (attempt->joins_running) joiners.push_back(config.node_rank);
  MaybeHoldJoiner(kHoldJoinerBeforeAgreement, attempt->joins_running, gen, deadline);
  absl::StatusOr<Agreement> agreed;
  {
    // A joiner killed before it published its records: the rendezvous's
    // abort ends the wait for them (forming_watch.h), not the timeout.
    std::optional<FormingWatch> watch;
    if (!attempt->joiners.empty()) {
      watch.emplace(client, config.node_rank, gen, backend->get(),
                    std::chrono::milliseconds(absl::ToInt64Milliseconds(kHeartbeatEvery)),
                    attempt->joiners);
    }
    agreed = Agree(*client, config, gen, members, joiners, first_member, layout, deadline);
  }
  if (!agreed.ok()) return agreed.status();
  gloo.wire_dtype = agreed->wire_dtype;
  const bool joins_running = resume.generation == 0 && joined.start_iteration > 0;
  RunningPlan running;
  if (joins_running) {
    ASSIGN_OR_RETURN(running, FetchRunningPlan(*client, gen, layout.size(), deadline));
    spdlog::info(
        "event=joined_running_job generation={} node_rank={} start_iteration={} "
        "plan_version={}",
        gen, config.node_rank, joined.start_iteration, running.plan_version);
  }
  MaybeHoldJoiner(kHoldJoinerBeforeMesh, attempt->joins_running, gen, deadline);
  backend = ConnectGloo(client, config.node_rank, gloo, *std::move(backend), attempt->joiners);
  if (!backend.ok()) return GlooFailed(*client, config.node_rank, gen, backend.status());

  auto link = std::unique_ptr<ClusterLink>(new ClusterLink(config, client, gen, members,
                                                           std::move(probe_targets), layout.size(),
                                                           std::move(on_failure)));
  ClusterLink* raw = link.get();
  raw->first_member_ = first_member;
  // The job gets the config log as it stood when the world formed before
  // its first iteration: a change held meanwhile is version 1 at iteration
  // 2, which a GPU node (no agreement on versions held) must have by then.
  // Bounded like one heartbeat RPC; a slower leader is the loop's to judge.
  raw->AwaitFirstHeartbeat(kLeaderRpcTimeout);
  JobWorld world;
  world.world_size = joined.world_size;
  world.rank_offset = rank_offset;
  world.generation = gen;
  world.num_nodes = static_cast<int>(members.size());
  world.node_index = gloo.node_rank;
  world.first_member = first_member;
  world.backend = std::move(*backend);
  world.caps = agreed->caps;
  world.uneven_inputs = agreed->uneven_inputs;
  if (joins_running) {
    world.start_iteration = joined.start_iteration;
    world.running_plan = std::move(running);
  }
  world.agree_order = [raw](const std::vector<uint32_t>& local) { return raw->AgreeOrder(local); };
  world.check_plan = [raw](const PlanStamp& stamp) { return raw->CheckPlan(stamp); };
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
  // A failed exchange is explained like a failed collective: a dead leader
  // or node is named, not the RPC that noticed it (the fault matrix).
  if (config_.node_rank == first_member_) {
    if (absl::Status st = client_->Set(key, EncodeOrder(local)); !st.ok()) return Explain(st);
  }
  absl::StatusOr<Records> value =
      client_->WaitForValues({key}, absl::Milliseconds(config_.timeout_ms));
  if (!value.ok()) return Explain(value.status());
  return DecodeOrder(key, Lookup(*value, key), num_tensors_);
}

absl::Status ClusterLink::CheckPlan(const PlanStamp& stamp) {
  // Rendezvous failures are explained as in AgreeOrder.
  if (absl::Status st = client_->Set(PlanKey(generation_, stamp.plan_version, config_.node_rank),
                                     EncodePlanStamp(stamp));
      !st.ok()) {
    return Explain(st);
  }
  std::vector<std::string> keys;
  for (int n : members_) keys.push_back(PlanKey(generation_, stamp.plan_version, n));
  absl::StatusOr<Records> values =
      client_->WaitForValues(keys, absl::Milliseconds(config_.timeout_ms));
  if (!values.ok()) {
    const absl::Status& st = values.status();
    return Explain(MakeError(CodeOf(st), absl::StrCat("comparing plan version ", stamp.plan_version,
                                                      " with the other nodes: ", st.message())));
  }
  std::vector<PlanStamp> stamps;
  for (const std::string& key : keys) {
    ASSIGN_OR_RETURN(PlanStamp s, DecodePlanStamp(key, Lookup(*values, key)));
    stamps.push_back(s);
  }
  return ComparePlanStamps(stamps);
}

absl::Status ClusterLink::Publish(const std::string& name, const std::string& value) {
  return client_->Set(GpuKey(generation_, name), value);
}

absl::StatusOr<std::string> ClusterLink::Fetch(const std::string& name, absl::Time deadline) {
  const std::string key = GpuKey(generation_, name);
  ASSIGN_OR_RETURN(Records value, client_->WaitForValues({key}, std::max(deadline - MonotonicNow(),
                                                                         absl::ZeroDuration())));
  return std::move(value[key]);
}

void ClusterLink::ReportError(const absl::Status& error) {
  MonotonicMutexLock lock(&mu_);
  if (failed_) return;  // the failure came from elsewhere: already known
  failed_ = true;
  node_error_ = error;
}

void ClusterLink::ReportDeparture(const absl::Status& why) {
  // The embedded leader's node takes the job's membership with it.
  const bool job_goes_on = config_.min_nodes_or_num() < config_.num_nodes &&
                           !(client_->embedded() && config_.is_leader());
  if (!job_goes_on) {
    ReportError(why);
    return;
  }
  MonotonicMutexLock lock(&mu_);
  // Even after another node's failure: the survivors' re-formation must
  // count this node out rather than wait for its silence.
  if (!departure_.ok()) return;
  failed_ = true;
  departure_ = why.ok() ? MakeError(v1::UNAVAILABLE, "the daemon is shutting down") : why;
}

bool ClusterLink::SendDeparture() {
  std::string reason;
  {
    MonotonicMutexLock lock(&mu_);
    if (departure_.ok() || departure_sent_) return false;
    departure_sent_ = true;
    reason = std::string(departure_.message());
  }
  spdlog::warn("event=departing generation={} node_rank={} reason={}", generation_,
               config_.node_rank, LogValue(reason));
  absl::Status st = client_->Depart(config_.node_rank, generation_, reason);
  if (!st.ok()) {
    spdlog::warn("event=depart_failed generation={} error={}", generation_, LogValue(st.message()));
  }
  MonotonicMutexLock lock(&mu_);
  departure_done_ = true;
  return true;
}

void ClusterLink::AwaitDeparted(absl::Duration limit) {
  MonotonicMutexLock lock(&mu_);
  auto heard = [this] {
    mu_.AssertReaderHeld();
    // A job that cannot go on without this node reported an error instead.
    return departure_.ok() ? node_error_.ok() || error_sent_ : departure_done_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&heard), limit);
}

absl::Status ClusterLink::LeaderUnreachable(const absl::Status& error,
                                            const absl::Status& transport) const {
  return MakeError(v1::PEER_FAILED,
                   absl::StrCat(error.message(), "; ", Unreachable(*client_, transport)));
}

absl::Status ClusterLink::Explain(const absl::Status& error) {
  absl::Status silent;
  {
    MonotonicMutexLock lock(&mu_);
    // This link's own explanation (the heartbeat's, which failed the job):
    // asking the leader again would only repeat it, and its dead nodes.
    if (!explained_.empty() && absl::StrContains(error.message(), explained_)) return error;
    // DeadNodes answers for this explanation only (a dead leader names none).
    dead_nodes_.clear();
    silent = rendezvous_silent_;
  }
  // A heartbeat already waited out a whole RPC deadline (a partition, a
  // dead leader): asking again would only make the error later than the
  // job's timeout.
  if (!silent.ok()) {
    // The failure that ended the collective said it already (it is what
    // aborted it): once is enough.
    if (absl::StrContains(error.message(), Unreachable(*client_, silent))) {
      return MakeError(v1::PEER_FAILED, error.message());
    }
    return LeaderUnreachable(error, silent);
  }
  // A failed collective is a symptom. The node that saw the cause (e.g. its
  // own trainer stopped) reports it when it closes its Gloo sockets, which
  // is what failed here: give that report a moment to become the leader's
  // abort reason, which names the culprit, before reporting this symptom.
  // A peer whose daemon is gone reports nothing: its refused connection is
  // the cause, and the grace would only delay the survivors.
  const std::vector<int> refusing = PeersRefusingConnections();
  // The embedded leader lives in node 0's daemon: gone, it cannot answer.
  if (client_->embedded() && !refusing.empty() && refusing.front() == 0) {
    const auto leader = std::find_if(probe_targets_.begin(), probe_targets_.end(),
                                     [](const RendezvousPeer& p) { return p.node_rank == 0; });
    return LeaderUnreachable(error, LeaderRefusal(leader->listen_address));
  }
  if (!refusing.empty()) return NameFailedNodes(error, error);
  HeartbeatParams hb;
  hb.node_rank = config_.node_rank;
  hb.generation = generation_;
  const absl::Time until = MonotonicNow() + kCauseReportGrace;
  while (MonotonicNow() < until) {
    absl::StatusOr<HeartbeatResult> r = client_->Heartbeat(hb);
    if (!r.ok()) return LeaderUnreachable(error, r.status());
    if (r->abort) return NameFailedNodes(error, absl::OkStatus());
    absl::SleepFor(kSilencePoll);
  }
  // Reported now: the leader aborts the generation and starts counting
  // who answers after it.
  return NameFailedNodes(error, error);
}

std::vector<int> ClusterLink::PeersRefusingConnections() const {
  std::vector<std::string> addresses;
  for (const RendezvousPeer& p : probe_targets_) addresses.push_back(p.listen_address);
  const std::vector<ProbeOutcome> outcomes = ProbeListeners(addresses);
  std::vector<int> refused;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (outcomes[i].liveness != Liveness::kRefused) continue;
    spdlog::warn("event=peer_refuses_connections generation={} node_rank={} host={} address={}",
                 generation_, probe_targets_[i].node_rank, probe_targets_[i].host, addresses[i]);
    refused.push_back(probe_targets_[i].node_rank);
  }
  return refused;
}

absl::Status ClusterLink::NameFailedNodes(const absl::Status& error, const absl::Status& report) {
  HeartbeatParams hb;
  hb.node_rank = config_.node_rank;
  hb.generation = generation_;
  hb.node_error = report;
  const absl::Time give_up = MonotonicNow() + kPresumedDeadAfter + 2 * kHeartbeatEvery;
  absl::StatusOr<HeartbeatResult> r;
  std::vector<SilentMember> dead;
  while (true) {
    r = client_->Heartbeat(hb);
    if (!r.ok()) return LeaderUnreachable(error, r.status());
    // Every other member either answered since the abort, or stayed silent
    // long enough to be presumed dead; or this is taking too long.
    dead.clear();
    bool undecided = false;
    for (const SilentMember& m : r->silent_members) {
      if (m.node_rank == config_.node_rank) continue;
      if (m.departed || m.refuses_connections || m.silent >= kPresumedDeadAfter) {
        dead.push_back(m);
      } else {
        undecided = true;
      }
    }
    // A reported error shows as the abort: an answer without one predates
    // it (etcd's last answer while its client fails over to another
    // member), so ask again.
    const bool decided = r->abort ? !undecided : report.ok();
    if (decided || MonotonicNow() >= give_up) break;
    absl::SleepFor(kSilencePoll);
  }
  // Not when `error` says it already (an error explained twice: the
  // heartbeat's, then the re-formation's) or it is this node's own report
  // of `error`, restated.
  const bool own_report =
      absl::StartsWith(r->abort_reason, absl::StrCat("node_rank=", config_.node_rank, " ")) &&
      absl::EndsWith(r->abort_reason, error.message());
  const bool news = r->abort && !r->abort_reason.empty() && !own_report &&
                    !absl::StrContains(error.message(), r->abort_reason);
  const std::string leader_says =
      news ? absl::StrCat("; ", AbortSource(*client_), " reports: ", r->abort_reason) : "";
  absl::Status explained = error;
  if (dead.empty() && !leader_says.empty()) {
    // The culprit's code, whether the abort or this node's own failed
    // collective brought the news first.
    explained = MakeError(CodeAfterAbort(CodeOf(error), r->abort_error),
                          absl::StrCat(error.message(), leader_says));
  } else if (!dead.empty()) {
    // A fixed job cannot lose a node; an elastic one re-forms (job_reform.cc).
    const std::string fixed =
        config_.min_nodes_or_num() < config_.num_nodes
            ? ""
            : absl::StrCat(" (a fixed job: --min-nodes ", config_.min_nodes_or_num(),
                           " = --num-nodes, so it ends)");
    explained = MakeError(v1::PEER_FAILED, absl::StrCat(DescribeLostNodes(generation_, dead), fixed,
                                                        "; ", error.message(), leader_says));
  }
  MonotonicMutexLock lock(&mu_);
  if (!dead.empty()) {
    dead_nodes_.clear();
    for (const SilentMember& m : dead) dead_nodes_.push_back(m.node_rank);
  }
  explained_ = std::string(explained.message());
  return explained;
}

void ClusterLink::Retire() {
  client_->Retire();
  MonotonicMutexLock lock(&mu_);
  retired_ = true;
}

std::vector<int> ClusterLink::DeadNodes() {
  MonotonicMutexLock lock(&mu_);
  return dead_nodes_;
}

void ClusterLink::SetConfigListener(
    std::function<void(const BucketCaps& caps, uint64_t at_iteration, uint64_t version, bool grow)>
        listener) {
  config_log_.SetListener(std::move(listener));
}

void ClusterLink::ReportStall(const std::string& description) {
  MonotonicMutexLock lock(&mu_);
  stall_report_ = description;
}

void ClusterLink::SetProgress(std::function<uint64_t()> iteration) {
  MonotonicMutexLock lock(&mu_);
  progress_ = std::move(iteration);
}

void ClusterLink::AwaitFirstHeartbeat(absl::Duration limit) {
  MonotonicMutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&first_beat_done_), limit);
}

absl::Status ClusterLink::LeaderRefuses() const {
  if (leader_address_.empty()) return absl::OkStatus();
  const absl::Time until = MonotonicNow() + kLeaderDyingFor;
  while (true) {
    const Liveness liveness = ProbeListeners({leader_address_}).front().liveness;
    if (liveness == Liveness::kRefused) break;
    // Timed out or unreachable proves nothing (a partition). Accepted: the
    // daemon may be dying still, its connections reset before its
    // listening port closes, so look again for a moment.
    if (liveness != Liveness::kListening || MonotonicNow() >= until) return absl::OkStatus();
    absl::SleepFor(kLeaderDyingReprobe);
  }
  spdlog::error("event=leader_refuses_connections generation={} address={}", generation_,
                leader_address_);
  return LeaderRefusal(leader_address_);
}

bool ClusterLink::Failed() {
  MonotonicMutexLock lock(&mu_);
  return stop_ || failed_;
}

void ClusterLink::WatchLeader() {
  while (!Failed()) {
    if (!client_->AwaitLeaderConnectionDown(kLeaderWatchPoll)) continue;
    // A refused connect proves the leader's daemon gone; anything else
    // (a reconnect in progress, a partition) is the heartbeat's to judge.
    if (absl::Status refused = LeaderRefuses(); !refused.ok()) {
      bool notify = false;
      {
        MonotonicMutexLock lock(&mu_);
        if (!failed_ && !stop_) {
          failed_ = true;
          notify = true;
          if (rendezvous_silent_.ok()) rendezvous_silent_ = refused;  // Explain must not wait
        }
      }
      if (notify) on_failure_(MakeError(v1::PEER_FAILED, Unreachable(*client_, refused)));
      return;
    }
    MonotonicMutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop_), kLeaderReprobeEvery);
  }
}

void ClusterLink::HeartbeatLoop() {
  while (true) {
    // Departed: no more heartbeats (this node is no member any more).
    if (SendDeparture()) {
      MonotonicMutexLock lock(&mu_);
      mu_.Await(absl::Condition(&stop_));
      return;
    }
    // Under mu_: what this heartbeat carries.
    HeartbeatParams hb;
    bool sending_error = false;
    {
      MonotonicMutexLock lock(&mu_);
      if (stop_) return;
      hb.node_rank = config_.node_rank;
      hb.generation = generation_;
      hb.iteration = progress_ ? progress_() : 0;
      hb.node_error = error_sent_ ? absl::OkStatus() : node_error_;
      hb.stall_report = std::move(stall_report_);
      stall_report_.clear();
      sending_error = !node_error_.ok() && !error_sent_;
    }
    // Without mu_: the RPC, and what it asks for (config, failing the job).
    absl::StatusOr<HeartbeatResult> r = client_->Heartbeat(hb);
    // Unanswered: a leader whose port refuses is dead, whatever the RPC saw
    // (a reset connection, a deadline), and the job's error says so.
    if (!r.ok() && !Failed()) {
      if (absl::Status refused = LeaderRefuses(); !refused.ok()) r = refused;
    }
    if (sending_error && r.ok()) {
      MonotonicMutexLock lock(&mu_);
      error_sent_ = true;
    }
    absl::Status config_error;
    if (r.ok() && r->generation == generation_ && !r->abort) {
      config_error = config_log_.CatchUp(r->config_version);
    }
    absl::Status failure;
    if (!config_error.ok()) {
      failure = config_error;
      MonotonicMutexLock lock(&mu_);
      if (!failed_) node_error_ = config_error;  // the other nodes must stop too
    } else if (!r.ok()) {
      failure = MakeError(v1::PEER_FAILED, Unreachable(*client_, r.status()));
    } else if (r->abort || r->generation != generation_) {
      failure = MakeError(
          v1::PEER_FAILED,
          absl::StrCat("the job was aborted by ", AbortSource(*client_), ": ",
                       r->abort_reason.empty() ? "a newer generation formed" : r->abort_reason));
    }
    bool notify = false;
    if (!failure.ok()) {
      MonotonicMutexLock lock(&mu_);
      // The first silence kept is the one the job's error quotes (the
      // leader watch's, when it failed the job first).
      if (!r.ok() && rendezvous_silent_.ok()) rendezvous_silent_ = r.status();
      if (!failed_ && !stop_) {
        failed_ = true;
        notify = true;
      }
    }
    // An abort: which node died, if one did (the leader only knows who
    // reported the failure first, usually a survivor).
    if (notify && r.ok() && r->abort && !r->abort_reason.empty()) {
      failure = NameFailedNodes(MakeError(v1::PEER_FAILED, absl::StrCat("the job was aborted by ",
                                                                        AbortSource(*client_))),
                                absl::OkStatus());
    }
    // Fails the local job; it reports back via ReportError (ignored).
    if (notify) on_failure_(failure);

    // Until the next beat, or sooner for an error or stall to report.
    MonotonicMutexLock lock(&mu_);
    first_beat_done_ = true;
    auto report_now = [this] {
      mu_.AssertReaderHeld();
      return stop_ || (!node_error_.ok() && !error_sent_) || !stall_report_.empty() ||
             (!departure_.ok() && !departure_sent_);
    };
    mu_.AwaitWithTimeout(absl::Condition(&report_now), kHeartbeatEvery);
  }
}

}  // namespace gradsync
