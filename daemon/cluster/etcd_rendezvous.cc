#include "daemon/cluster/etcd_rendezvous.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/secure_random.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/cluster/etcd/etcd_operation_deadline.h"
#include "daemon/cluster/etcd_token_proof.h"
#include "daemon/cluster/liveness_probe.h"
#include "daemon/cluster/rank_offsets.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "daemon/cluster/resume_rule.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// A lost watch (etcd restarting) must not stall a wait: reads are retried
// this often even without a change reported.
constexpr absl::Duration kPollEvery = absl::Seconds(1);
// The embedded leader's presumption (rendezvous_service.h): a member silent
// this long after an abort, while the others answered, is dead.
constexpr absl::Duration kPresumedDeadAfter = absl::Milliseconds(2000);
// A silent member whose probe proved nothing is probed again this often.
constexpr absl::Duration kReprobeEvery = absl::Milliseconds(250);
// etcd's --max-txn-ops default: one GetMany reads at most this many keys.
constexpr size_t kMaxReadsPerTxn = 128;
int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// etcd did not answer (as opposed to answering no): worth retrying.
bool Unreachable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

JoinResult ToJoinResult(const v1::JoinResponse& generation) {
  JoinResult result;
  result.incarnation = generation.incarnation();
  result.generation = generation.generation();
  result.world_size = generation.world_size();
  result.start_iteration = generation.start_iteration();
  for (const v1::Peer& p : generation.peers()) {
    result.peers.push_back(RendezvousPeer{p.node_rank(), p.host(), p.local_size(),
                                          p.listen_address(), p.rank_offset(), p.joins_running()});
  }
  return result;
}

// The number after `prefix` in `key` ("…/join/3" -> 3), or -1.
int RankAfter(const std::string& key, const std::string& prefix) {
  int rank = -1;
  absl::string_view rest = key;
  if (!absl::ConsumePrefix(&rest, prefix) || !absl::SimpleAtoi(rest, &rank)) return -1;
  return rank;
}

// The generations `keys` are scoped to.
std::set<uint64_t> GenerationsOf(const std::vector<std::string>& keys) {
  std::set<uint64_t> out;
  for (const std::string& key : keys) {
    if (std::optional<uint64_t> g = KeyGeneration(key)) out.insert(*g);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<EtcdRendezvous>> EtcdRendezvous::Connect(
    EtcdRendezvousOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> client, EtcdClient::Connect(options.etcd));
  return std::shared_ptr<EtcdRendezvous>(new EtcdRendezvous(std::move(options), std::move(client)));
}

EtcdRendezvous::EtcdRendezvous(EtcdRendezvousOptions options, std::unique_ptr<EtcdClient> client)
    : options_(std::move(options)),
      client_(std::move(client)),
      root_(absl::StrCat(options_.prefix, "/job/", options_.job_id, "/")) {}

EtcdRendezvous::~EtcdRendezvous() {
  if (watch_) watch_->Stop();
  if (keeper_) keeper_->Stop();
  int64_t lease = 0;
  {
    MonotonicMutexLock lock(&mu_);
    lease = session_ && !retired_ ? lease_.id : 0;
  }
  // Its join keys go at once rather than a TTL later. Best effort, two
  // members' attempts at most: an unreachable etcd must not hold up the
  // daemon's shutdown, and the lease expires by itself.
  if (lease != 0) {
    client_->RevokeLease(lease, MonotonicNow() + 2 * client_->options().attempt_timeout)
        .IgnoreError();
  }
}

std::string EtcdRendezvous::Describe() const { return client_->Describe(); }

bool EtcdRendezvous::IsMember(const v1::JoinResponse& generation, int node_rank) {
  for (const v1::Peer& p : generation.peers()) {
    if (p.node_rank() == node_rank && p.local_size() > 0) return true;
  }
  return false;
}

std::vector<int> EtcdRendezvous::MemberRanks(const v1::JoinResponse& generation) {
  std::vector<int> ranks;
  for (const v1::Peer& p : generation.peers()) {
    if (p.local_size() > 0) ranks.push_back(p.node_rank());
  }
  return ranks;
}

void EtcdRendezvous::Retire() {
  MonotonicMutexLock lock(&mu_);
  retired_ = true;
}

bool EtcdRendezvous::Elastic(int num_nodes) const {
  return options_.min_nodes > 0 && options_.min_nodes < num_nodes;
}

int EtcdRendezvous::MaxNodes(int num_nodes) const {
  return std::max(num_nodes, options_.max_nodes);
}

std::string EtcdRendezvous::Key(absl::string_view suffix) const {
  return absl::StrCat(root_, suffix);
}
std::string EtcdRendezvous::StoreKey(absl::string_view key) const {
  return absl::StrCat(root_, "kv/", key);
}
std::string EtcdRendezvous::GenKey(uint64_t generation, absl::string_view suffix) const {
  return absl::StrCat(root_, "gen/", generation, "/", suffix);
}

absl::Status EtcdRendezvous::CheckTokenProof() {
  const std::string key = Key("token_proof");
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> stored, client_->Get(key));
  std::string proof;
  if (stored) {
    proof = stored->value;
  } else {
    ASSIGN_OR_RETURN(
        EtcdTxnResult created,
        client_->CreateIfAbsent(key, MakeEtcdTokenProof(options_.job_token, options_.job_id)));
    if (created.succeeded) return absl::OkStatus();
    proof = created.current ? created.current->value : "";
  }
  if (MatchesEtcdTokenProof(proof, options_.job_token, options_.job_id)) return absl::OkStatus();
  return absl::UnauthenticatedError(
      absl::StrCat("job ", options_.job_id, " in ", Describe(), " (key ", key,
                   ") was formed with another job token: this daemon's --job-token-file does "
                   "not match the job's first daemon's (a job id reused with a new token needs "
                   "its keys deleted: etcdctl del --prefix ",
                   root_, ")"));
}

absl::Status EtcdRendezvous::EnsureSession() {
  MonotonicMutexLock session_lock(&session_mu_);
  {
    MonotonicMutexLock lock(&mu_);
    if (session_) return lease_lost_;
  }
  RETURN_IF_ERROR(CheckTokenProof());
  ASSIGN_OR_RETURN(EtcdLease lease, client_->GrantLease(options_.lease_ttl));
  keeper_ = std::make_unique<EtcdLeaseKeeper>(client_.get(), lease, [this](absl::Status lost) {
    spdlog::error("event=etcd_lease_lost error={}", LogValue(lost.message()));
    MonotonicMutexLock lock(&mu_);
    lease_lost_ =
        MakeError(v1::PEER_FAILED,
                  absl::StrCat("this node's lease in ", Describe(),
                               " was lost, so the other nodes count it dead: ", lost.message()));
    ++changes_;
  });
  absl::StatusOr<std::unique_ptr<EtcdWatch>> watch = EtcdWatch::Start(
      client_.get(), root_, 0, [this](const std::vector<EtcdEvent>&) { OnWatchEvents(); },
      [](absl::Status end) {
        // Waits fall back to polling; heartbeats judge etcd's reachability.
        spdlog::warn("event=etcd_watch_ended error={}", LogValue(end.message()));
      });
  if (!watch.ok()) {
    keeper_->Stop();
    client_->RevokeLease(lease.id).IgnoreError();
    return watch.status();
  }
  watch_ = std::move(*watch);
  MonotonicMutexLock lock(&mu_);
  lease_ = lease;
  session_ = true;
  spdlog::info("event=etcd_session root={} lease={} ttl_ms={} etcd={}", LogValue(root_), lease.id,
               Millis(lease.ttl), LogValue(Describe()));
  return absl::OkStatus();
}

void EtcdRendezvous::OnWatchEvents() {
  MonotonicMutexLock lock(&mu_);
  ++changes_;
}

uint64_t EtcdRendezvous::Changes() {
  MonotonicMutexLock lock(&mu_);
  return changes_;
}

void EtcdRendezvous::AwaitChange(uint64_t seen, absl::Time until) {
  MonotonicMutexLock lock(&mu_);
  auto changed = [this, seen] {
    mu_.AssertReaderHeld();
    return changes_ != seen;
  };
  const absl::Duration left = until - MonotonicNow();
  if (left > absl::ZeroDuration()) {
    mu_.AwaitWithTimeout(absl::Condition(&changed), std::min(left, kPollEvery));
  }
}

absl::StatusOr<std::optional<v1::JoinResponse>> EtcdRendezvous::ReadCurrent(int64_t* mod_revision) {
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv, client_->Get(Key("current")));
  if (mod_revision != nullptr) *mod_revision = kv ? kv->mod_revision : 0;
  if (!kv) return std::optional<v1::JoinResponse>();
  v1::JoinResponse current;
  if (!current.ParseFromString(kv->value)) {
    return MakeError(v1::INTERNAL, absl::StrCat(Describe(), ": key ", Key("current"),
                                                " does not hold a generation record"));
  }
  return std::optional<v1::JoinResponse>(std::move(current));
}

absl::StatusOr<EtcdRendezvous::GenerationState> EtcdRendezvous::ReadGeneration(
    uint64_t generation) {
  ASSIGN_OR_RETURN(EtcdRange range, client_->GetPrefix(GenKey(generation, "")));
  GenerationState state;
  const std::string join_prefix = GenKey(generation, "join/");
  const std::string ack_prefix = GenKey(generation, "ack/");
  const std::string dead_prefix = GenKey(generation, "dead/");
  const std::string left_prefix = GenKey(generation, "left/");
  const std::string joining_prefix = GenKey(generation, "joining/");
  for (const EtcdKeyValue& kv : range.kvs) {
    if (kv.key == GenKey(generation, "abort")) {
      state.abort_reason = kv.value;
    } else if (kv.key == GenKey(generation, "abort_error")) {
      v1::Error cause;
      if (!cause.ParseFromString(kv.value)) {
        return MakeError(v1::INTERNAL,
                         absl::StrCat(Describe(), ": key ", kv.key, " does not hold an error"));
      }
      state.abort_error = FromProto(cause);
    } else if (int rank = RankAfter(kv.key, join_prefix); rank >= 0) {
      state.alive.insert(rank);
    } else if (int acked = RankAfter(kv.key, ack_prefix); acked >= 0) {
      state.acked.insert(acked);
    } else if (int dead = RankAfter(kv.key, dead_prefix); dead >= 0) {
      state.dead[dead] = kv.value;
    } else if (int left = RankAfter(kv.key, left_prefix); left >= 0) {
      state.left[left] = kv.value;
    } else if (int joining = RankAfter(kv.key, joining_prefix); joining >= 0) {
      state.joining.insert(joining);
    } else if (kv.key == GenKey(generation, "grow")) {
      const std::vector<std::string> parts = absl::StrSplit(kv.value, ' ');
      state.grow = true;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &state.grow_at)) {
        return MakeError(v1::INTERNAL,
                         absl::StrCat(Describe(), ": key ", kv.key, " does not hold a grow entry"));
      }
    } else if (kv.key == GenKey(generation, "config_head")) {
      const std::vector<std::string> parts = absl::StrSplit(kv.value, ' ');
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &state.config_version) ||
          !absl::SimpleAtoi(parts[1], &state.config_at)) {
        return MakeError(v1::INTERNAL, absl::StrCat(Describe(), ": key ", kv.key,
                                                    " does not hold a config log head"));
      }
    }
  }
  return state;
}

absl::StatusOr<std::string> EtcdRendezvous::AbortGeneration(uint64_t generation,
                                                            const std::string& reason,
                                                            const absl::Status& cause) {
  const std::string abort_key = GenKey(generation, "abort");
  const EtcdCompare absent{abort_key, EtcdCompare::Target::kCreateRevision, EtcdCompare::Op::kEqual,
                           0, ""};
  std::vector<EtcdTxnOp> record_abort = {{EtcdTxnOp::Kind::kPut, abort_key, reason, 0}};
  if (!cause.ok()) {
    v1::Error record;
    ToProto(cause, &record);
    record_abort.push_back(
        {EtcdTxnOp::Kind::kPut, GenKey(generation, "abort_error"), record.SerializeAsString(), 0});
  }
  ASSIGN_OR_RETURN(EtcdTxnResult r, client_->Txn({absent}, record_abort,
                                                 {{EtcdTxnOp::Kind::kGet, abort_key, "", 0}}));
  const std::string stands = r.succeeded || !r.current ? reason : r.current->value;
  if (r.succeeded) {
    spdlog::warn("event=generation_aborted generation={} reason={}", generation, LogValue(reason));
  }
  MonotonicMutexLock lock(&mu_);
  aborted_.insert(generation);
  return stands;
}

std::optional<std::string> EtcdRendezvous::DeadMemberReason(const v1::JoinResponse& current,
                                                            const std::set<int>& alive) const {
  for (const v1::Peer& p : current.peers()) {
    if (p.local_size() == 0 || alive.count(p.node_rank()) != 0) continue;
    return absl::StrCat("node_rank=", p.node_rank(), " (host=", p.host(),
                        ") is dead: its daemon's lease in ", Describe(),
                        " expired (no keepalive for ", Millis(options_.lease_ttl), " ms)");
  }
  return std::nullopt;
}

absl::StatusOr<JoinResult> EtcdRendezvous::Join(const JoinParams& params) {
  if (params.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("Join needs a positive timeout");
  }
  {
    MonotonicMutexLock lock(&mu_);
    host_ = params.host;
  }
  const absl::Time deadline = MonotonicNow() + params.timeout;
  JoinStep last;
  absl::Status last_error;
  {
    // No etcd call of the join outlives it (the timeout message's own
    // reads come after, unbounded by it).
    EtcdOperationDeadline bound("join", deadline, params.timeout);
    ASSIGN_OR_RETURN(std::optional<JoinResult> formed,
                     JoinUntil(params, deadline, &last, &last_error));
    if (formed) return *std::move(formed);
  }
  if (!last_error.ok()) {
    return MakeError(v1::UNAVAILABLE, absl::StrCat(Describe(), " did not answer the join for ",
                                                   Millis(params.timeout), " ms (",
                                                   WithoutEtcdPrefix(last_error.message()), ")"));
  }
  std::string message = JoinTimeoutMessage(last, params.num_nodes, params.timeout);
  // Out of the round: a later Join starts over.
  DropJoin(params.node_rank);
  spdlog::warn("event=join_timeout node_rank={} generation={} reason={}", params.node_rank,
               last.target, LogValue(message));
  return MakeError(v1::TIMEOUT, message);
}

absl::StatusOr<std::optional<JoinResult>> EtcdRendezvous::JoinUntil(const JoinParams& params,
                                                                    absl::Time deadline,
                                                                    JoinStep* last,
                                                                    absl::Status* last_error) {
  absl::Status session = EnsureSession();
  while (!session.ok() && Unreachable(session) && MonotonicNow() < deadline) {
    absl::SleepFor(std::min(kPollEvery, deadline - MonotonicNow()));
    session = EnsureSession();
  }
  if (!session.ok() && !Unreachable(session)) return session;
  *last_error = session;
  bool answered = false;
  while (session.ok()) {
    const uint64_t seen = Changes();
    absl::StatusOr<JoinStep> step = TryJoin(params);
    if (step.ok() && step->formed) {
      MonotonicMutexLock lock(&mu_);
      last_ok_ = MonotonicNow();
      return std::move(step->formed);
    }
    if (!step.ok() && !Unreachable(step.status())) return step.status();
    const bool over = MonotonicNow() >= deadline;
    if (step.ok()) {
      answered = true;
      *last = *std::move(step);
      *last_error = absl::OkStatus();
    } else if (!over || !answered) {
      // A look the deadline cut short, right after one etcd answered,
      // leaves the timeout to name what that look saw.
      *last_error = step.status();
      answered = false;
    }
    if (over) break;
    AwaitChange(seen, deadline);
  }
  return std::optional<JoinResult>();
}

std::string EtcdRendezvous::JoinTimeoutMessage(const JoinStep& step, int num_nodes,
                                               absl::Duration timeout) {
  std::string message =
      absl::StrCat("join timed out after ", Millis(timeout), " ms waiting for generation ",
                   step.target, " in ", Describe(), ": ");
  if (!step.blocked_by.empty()) return absl::StrCat(message, step.blocked_by);
  std::vector<int> missing;
  std::vector<std::string> report_keys;
  for (int r = 0; r < num_nodes; ++r) {
    if (step.joined.count(r) != 0) continue;
    missing.push_back(r);
    report_keys.push_back(StoreKey(FormingReportKey(r)));
  }
  absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>> reports =
      report_keys.size() <= kMaxReadsPerTxn
          ? client_->GetMany(report_keys)
          : absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>>(
                std::vector<std::optional<EtcdKeyValue>>(report_keys.size()));
  std::vector<std::string> named;
  for (size_t i = 0; i < missing.size(); ++i) {
    const bool reported = reports.ok() && (*reports)[i] && !(*reports)[i]->value.empty();
    named.push_back(absl::StrCat(
        "node_rank=", missing[i], " (",
        reported ? (*reports)[i]->value
                 : "no report from it: its daemon is down or stopped or unreachable or none of "
                   "its trainers registered",
        ")"));
  }
  return absl::StrCat(message, step.joined.size(), " of ", num_nodes,
                      " nodes joined; missing node ranks: ", absl::StrJoin(named, ", "));
}

absl::StatusOr<EtcdRendezvous::JoinStep> EtcdRendezvous::TryJoin(const JoinParams& params) {
  ASSIGN_OR_RETURN(std::optional<v1::JoinResponse> current, ReadCurrent(nullptr));
  const uint64_t g = current ? current->generation() : 0;
  GenerationState state;
  if (g == 0) return JoinRound(params, current, state);
  ASSIGN_OR_RETURN(state, ReadGeneration(g));
  const bool member = IsMember(*current, params.node_rank);
  const bool fresh_elastic = params.resume_generation == 0 && Elastic(params.num_nodes);
  // Growing: a member leaving at the boundary, or a joiner. A member that
  // died meanwhile is JudgeGrow's to count out, as on the leader.
  if (!state.abort_reason && state.grow &&
      (member ? params.resume_generation == g : fresh_elastic)) {
    return JoinRunning(params, *current, state);
  }
  ASSIGN_OR_RETURN(std::optional<std::string> dead, DeadMember(*current, state));
  if (!state.abort_reason && member && !dead) {
    // A member leaving the running generation with no grow entry: refused.
    if (params.resume_generation == g) return JoinRunning(params, *current, state);
    int64_t lease = 0;
    {
      MonotonicMutexLock lock(&mu_);
      lease = lease_.id;
    }
    ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> mine,
                     client_->Get(GenKey(g, absl::StrCat("join/", params.node_rank))));
    JoinStep step;
    if (mine && mine->lease == lease) {
      step.formed = ToJoinResult(*current);
      return step;
    }
    // An earlier daemon of this node is still a member: its lease must
    // expire (or it leaves) before the job can form again.
    step.target = g + 1;
    step.blocked_by =
        absl::StrCat("node_rank=", params.node_rank, " is still a member of active generation ", g,
                     " through an earlier daemon whose lease has not expired (TTL ",
                     Millis(options_.lease_ttl), " ms)");
    return step;
  }
  if (!state.abort_reason && dead) {
    ASSIGN_OR_RETURN(std::string stands, AbortGeneration(g, *dead));
    state.abort_reason = stands;
  } else if (!state.abort_reason) {
    // No member of the running generation: it joins it, as on the leader.
    if (fresh_elastic) return JoinRunning(params, *current, state);
    return MakeError(
        v1::STATE,
        params.resume_generation != 0
            ? absl::StrCat("generation ", g, " re-formed without node_rank=", params.node_rank,
                           ", which stayed silent past ", Millis(kPresumedDeadAfter),
                           " ms and was presumed dead")
            : absl::StrCat("node_rank=", params.node_rank, " is no member of running generation ",
                           g, " of job '", options_.job_id,
                           "' (members: node_rank=", absl::StrJoin(MemberRanks(*current), ","),
                           "), and only an elastic job (--min-nodes below --num-nodes) takes "
                           "nodes while it runs"));
  }
  if (fresh_elastic) {
    ASSIGN_OR_RETURN(std::optional<JoinStep> held, AwaitSurvivors(params, *current, state));
    if (held) return *std::move(held);
  }
  return JoinRound(params, current, state);
}

absl::Status EtcdRendezvous::RecordOutcome(const v1::JoinResponse& outcome) {
  if (outcome.has_error() && outcome.error().code() != v1::OK) {
    // The failed round becomes a generation without members, over before
    // it is current: a later fresh job forms the one after it.
    RETURN_IF_ERROR(AbortGeneration(outcome.generation(), outcome.error().message()).status());
  }
  return AdvanceCurrent(outcome);
}

absl::StatusOr<EtcdRendezvous::JoinStep> EtcdRendezvous::FromOutcome(
    const v1::JoinResponse& outcome, const JoinParams& params) {
  RETURN_IF_ERROR(RecordOutcome(outcome));
  if (outcome.has_error() && outcome.error().code() != v1::OK) {
    return MakeError(outcome.error().code(), outcome.error().message());
  }
  if (!IsMember(outcome, params.node_rank)) {
    return MakeError(v1::STATE,
                     absl::StrCat("generation ", outcome.generation(),
                                  " re-formed without node_rank=", params.node_rank,
                                  ", which stayed silent past ", Millis(kPresumedDeadAfter),
                                  " ms and was presumed dead"));
  }
  JoinStep step;
  step.target = outcome.generation();
  step.formed = ToJoinResult(outcome);
  return step;
}

absl::Status EtcdRendezvous::PutJoinOnce(const JoinParams& params, uint64_t target, bool joining) {
  int64_t lease = 0;
  uint64_t previous = 0;
  bool previous_joining = false;
  {
    MonotonicMutexLock lock(&mu_);
    if (joined_target_ == target && joined_joining_ == joining) return absl::OkStatus();
    lease = lease_.id;
    previous = joined_target_;
    previous_joining = joined_joining_;
  }
  // Once per round: every put wakes the other nodes' watches.
  v1::JoinRequest join;
  join.set_node_rank(params.node_rank);
  join.set_num_nodes(params.num_nodes);
  join.set_local_size(params.local_size);
  join.set_host(params.host);
  join.set_listen_address(params.listen_address);
  join.set_resume_generation(params.resume_generation);
  join.set_resume_iteration(params.resume_iteration);
  const std::string rank = absl::StrCat(params.node_rank);
  std::vector<EtcdTxnOp> ops;
  // Its Join of an earlier round (a joiner that came after that round was
  // decided) must not count in a later one.
  if (previous != 0 && previous != target) {
    ops.push_back({EtcdTxnOp::Kind::kDelete, GenKey(previous, "join/" + rank), "", 0});
    if (previous_joining) {
      ops.push_back({EtcdTxnOp::Kind::kDelete, GenKey(previous - 1, "joining/" + rank), "", 0});
    }
  }
  ops.push_back(
      {EtcdTxnOp::Kind::kPut, GenKey(target, "join/" + rank), join.SerializeAsString(), lease});
  // Its Join and the sign that it waits, in one transaction: a member that
  // reads the sign finds the Join in the grow round.
  if (joining) {
    ops.push_back({EtcdTxnOp::Kind::kPut, GenKey(target - 1, "joining/" + rank),
                   join.SerializeAsString(), lease});
  }
  RETURN_IF_ERROR(client_->Txn({}, ops, {}).status());
  // Joined: its report of why it had not is stale (the leader drops it too).
  client_->Delete(StoreKey(FormingReportKey(params.node_rank))).IgnoreError();
  MonotonicMutexLock lock(&mu_);
  joined_target_ = target;
  joined_joining_ = joining;
  round_started_.emplace(target, MonotonicNow());
  spdlog::info(
      "event=join_round node_rank={} generation={} resume_generation={} joins_running={} etcd={}",
      params.node_rank, target, params.resume_generation, joining ? 1 : 0, LogValue(Describe()));
  return absl::OkStatus();
}

void EtcdRendezvous::DropJoin(int node_rank) {
  uint64_t target = 0;
  bool joining = false;
  {
    MonotonicMutexLock lock(&mu_);
    target = joined_target_;
    joining = joined_joining_;
    joined_target_ = 0;
    joined_joining_ = false;
  }
  if (target == 0) return;
  client_->Delete(GenKey(target, absl::StrCat("join/", node_rank))).IgnoreError();
  if (joining)
    client_->Delete(GenKey(target - 1, absl::StrCat("joining/", node_rank))).IgnoreError();
}

absl::StatusOr<std::map<int, v1::JoinRequest>> EtcdRendezvous::ReadJoins(uint64_t target,
                                                                         const JoinParams& params) {
  ASSIGN_OR_RETURN(EtcdRange range, client_->GetPrefix(GenKey(target, "join/")));
  std::map<int, v1::JoinRequest> joins;
  for (const EtcdKeyValue& kv : range.kvs) {
    v1::JoinRequest join;
    if (!join.ParseFromString(kv.value)) continue;
    if (join.num_nodes() != params.num_nodes) {
      return MakeError(v1::INVALID_ARGUMENT,
                       absl::StrCat("node_rank=", join.node_rank(), " was started with num_nodes=",
                                    join.num_nodes(), " but node_rank=", params.node_rank,
                                    " with num_nodes=", params.num_nodes,
                                    "; every node of a job must use the same --num-nodes"));
    }
    if (join.node_rank() >= 0 && join.node_rank() < MaxNodes(params.num_nodes)) {
      joins[join.node_rank()] = std::move(join);
    }
  }
  return joins;
}

absl::StatusOr<EtcdRendezvous::JoinStep> EtcdRendezvous::JoinRound(
    const JoinParams& params, const std::optional<v1::JoinResponse>& current,
    const GenerationState& state) {
  const uint64_t g = current ? current->generation() : 0;
  const uint64_t target = g + 1;
  // A decided round is everyone's answer, a survivor left out included.
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> decided, client_->Get(GenKey(target, "outcome")));
  v1::JoinResponse outcome;
  JoinStep step;
  step.target = target;
  // Formed without this node (survivors, or a fresh job of --num-nodes'
  // ranks): a node joining an elastic job afresh joins it running.
  auto joins_later = [&](const v1::JoinResponse& outcome) {
    return params.resume_generation == 0 && Elastic(params.num_nodes) &&
           !(outcome.has_error() && outcome.error().code() != v1::OK) &&
           !IsMember(outcome, params.node_rank);
  };
  auto formed_without = [&](const v1::JoinResponse& outcome) -> absl::StatusOr<JoinStep> {
    RETURN_IF_ERROR(RecordOutcome(outcome));
    step.blocked_by =
        absl::StrCat("generation ", target, " formed without node_rank=", params.node_rank,
                     "; it joins it at its grow boundary");
    return step;
  };
  if (decided && outcome.ParseFromString(decided->value)) {
    if (joins_later(outcome)) return formed_without(outcome);
    return FromOutcome(outcome, params);
  }
  const bool resuming = params.resume_generation != 0;
  if (resuming && target > params.resume_generation + 1) {
    // Another survivor decided the round this node resumes into, and made
    // it current (a failed round is a generation too), before this node
    // read: that outcome is this node's answer as well.
    ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> earlier,
                     client_->Get(GenKey(params.resume_generation + 1, "outcome")));
    v1::JoinResponse decided_earlier;
    if (earlier && decided_earlier.ParseFromString(earlier->value)) {
      return FromOutcome(decided_earlier, params);
    }
  }
  if (resuming) RETURN_IF_ERROR(CheckResume(params, current, state));
  RETURN_IF_ERROR(PutJoinOnce(params, target));
  ASSIGN_OR_RETURN(JoinsByRank all, ReadJoins(target, params));
  JoinsByRank joins;
  for (auto& [rank, join] : all) {
    if ((join.resume_generation() != 0) == resuming) {
      // A fresh job is --num-nodes' ranks; survivors, the aborted members.
      if (resuming || rank < params.num_nodes) joins.emplace(rank, std::move(join));
      continue;
    }
    // A node joining afresh while survivors re-form waits for what they
    // form (AwaitSurvivors): not in their round, and out of it itself.
    if (resuming) continue;
    DropJoin(params.node_rank);
    step.blocked_by = absl::StrCat("node_rank=", rank, " resumes generation ", g,
                                   ": its survivors re-form, and node_rank=", params.node_rank,
                                   " joins the generation they form");
    return step;
  }
  // Survivors re-forming an elastic job all resume one iteration.
  uint64_t starts_at = 0;
  for (const auto& [rank, join] : joins) {
    step.joined.insert(rank);
    starts_at = std::max(starts_at, join.resume_iteration());
  }
  if (resuming) {
    ASSIGN_OR_RETURN(std::optional<v1::JoinResponse> judged, JudgeResume(*current, state, joins));
    if (!judged) {
      step.blocked_by =
          "waiting for the members of the aborted generation to join again or be "
          "presumed dead";
      return step;
    }
    outcome = *std::move(judged);
  } else if (joins.size() < static_cast<size_t>(params.num_nodes)) {
    return step;
  } else {
    outcome = MakeGeneration(joins, target, 0);
  }
  ASSIGN_OR_RETURN(outcome, DecideRound(std::move(outcome), starts_at));
  if (joins_later(outcome)) return formed_without(outcome);
  return FromOutcome(outcome, params);
}

absl::StatusOr<v1::JoinResponse> EtcdRendezvous::DecideRound(v1::JoinResponse outcome,
                                                             uint64_t starts_at) {
  const uint64_t target = outcome.generation();
  const std::string outcome_key = GenKey(target, "outcome");
  const bool forms = !outcome.has_error() || outcome.error().code() == v1::OK;
  for (int attempt = 0; attempt < 16; ++attempt) {
    // Of the nodes racing to decide the round, the first writes the
    // outcome; the others read it. A change held meanwhile (its key's
    // revision moved) makes the writer read it again.
    std::vector<EtcdCompare> compares = {
        {outcome_key, EtcdCompare::Target::kVersion, EtcdCompare::Op::kEqual, 0, ""}};
    std::vector<EtcdTxnOp> ops = {
        {EtcdTxnOp::Kind::kPut, outcome_key, outcome.SerializeAsString(), 0}};
    std::optional<JobConfigChange> held;
    if (forms) {
      ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> held_kv, client_->Get(Key("config_held")));
      compares.push_back({Key("config_held"), EtcdCompare::Target::kModRevision,
                          EtcdCompare::Op::kEqual, held_kv ? held_kv->mod_revision : 0, ""});
      if (held_kv) {
        ASSIGN_OR_RETURN(held, DecodeConfig(Key("config_held"), held_kv->value));
        held->generation = target;
        held->at_iteration = starts_at + kHeldConfigAfter;
        ops.push_back({EtcdTxnOp::Kind::kPut, StoreKey(ConfigKey(target, 1)),
                       EncodeConfig(target, held->at_iteration, held->bucket_cap_mb,
                                    held->first_bucket_cap_mb),
                       0});
        ops.push_back({EtcdTxnOp::Kind::kPut, GenKey(target, "config_head"),
                       absl::StrCat(1, " ", held->at_iteration), 0});
        ops.push_back({EtcdTxnOp::Kind::kDelete, Key("config_held"), "", 0});
      }
    }
    ASSIGN_OR_RETURN(EtcdTxnResult r, client_->Txn(compares, ops, {}));
    if (r.succeeded) {
      spdlog::info("event=generation_decided generation={} members={} error={} etcd={}", target,
                   outcome.peers_size(), LogValue(outcome.error().message()), LogValue(Describe()));
      if (held) {
        spdlog::info(
            "event=job_config_published config_version=1 generation={} at_iteration={} held=1 "
            "rendezvous=etcd",
            target, held->at_iteration);
      }
      return outcome;
    }
    ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> decided, client_->Get(outcome_key));
    if (!decided) continue;
    if (!outcome.ParseFromString(decided->value)) {
      return MakeError(v1::INTERNAL, absl::StrCat(Describe(), ": key ", outcome_key,
                                                  " does not hold a generation record"));
    }
    return outcome;
  }
  return MakeError(v1::INTERNAL,
                   absl::StrCat(Describe(), ": key ", Key("config_held"),
                                " kept changing while generation ", target, " was decided"));
}

absl::Status EtcdRendezvous::CheckResume(const JoinParams& params,
                                         const std::optional<v1::JoinResponse>& current,
                                         const GenerationState& state) const {
  const uint64_t resume = params.resume_generation;
  const std::string who =
      absl::StrCat("node_rank=", params.node_rank, " resumes generation ", resume);
  if (options_.min_nodes >= params.num_nodes) {
    return MakeError(v1::STATE, absl::StrCat(who,
                                             ", but this job is not elastic (--min-nodes = "
                                             "--num-nodes ",
                                             params.num_nodes, ")"));
  }
  const uint64_t g = current ? current->generation() : 0;
  if (resume != g || !state.abort_reason) {
    return MakeError(v1::STATE, absl::StrCat(who, ", but the current generation is ", g,
                                             state.abort_reason ? " (aborted)" : ""));
  }
  if (!IsMember(*current, params.node_rank)) {
    return MakeError(v1::STATE, absl::StrCat(who, ", of which it is not a member"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<v1::JoinResponse>> EtcdRendezvous::JudgeResume(
    const v1::JoinResponse& aborted, const GenerationState& state,
    const std::map<int, v1::JoinRequest>& joins) {
  const uint64_t g = aborted.generation();
  absl::Duration waited;
  {
    MonotonicMutexLock lock(&mu_);
    // Since this node joined the round (PutJoinOnce), or from now.
    const absl::Time now = MonotonicNow();
    waited = now - round_started_.emplace(g + 1, now).first->second;
  }
  // A member of the aborted generation is alive when it joined again, dead
  // when a survivor presumed it so, its daemon refuses connections, its
  // lease went unacknowledged, or it stays silent; the round waits for
  // every other one.
  const std::map<int, std::string> refused = ProbeUndecided(aborted, state, joins);
  std::vector<std::string> dead;
  for (const v1::Peer& p : aborted.peers()) {
    const int r = p.node_rank();
    if (p.local_size() == 0 || joins.count(r) != 0) continue;
    const bool acked = state.acked.count(r) != 0;
    std::string silent;
    if (auto it = state.left.find(r); it != state.left.end()) {
      silent = absl::StrCat("left the job: ", it->second);
    } else if (auto it = state.dead.find(r); it != state.dead.end()) {
      silent = it->second;
    } else if (auto it = refused.find(r); it != refused.end()) {
      silent = it->second;
    } else if (!acked && state.alive.count(r) == 0) {
      silent = absl::StrCat("its lease expired, TTL ", Millis(options_.lease_ttl), " ms");
    } else if ((!acked && waited >= kPresumedDeadAfter) ||
               waited >= options_.lease_ttl + kPresumedDeadAfter) {
      silent = absl::StrCat("silent ", Millis(waited), " ms");
    } else {
      return std::optional<v1::JoinResponse>();
    }
    dead.push_back(absl::StrCat("node_rank=", r, " (host=", p.host(), ", ", silent, ")"));
  }
  const std::string dead_list = dead.empty() ? "none" : absl::StrJoin(dead, ", ");
  v1::JoinResponse outcome;
  outcome.set_generation(g + 1);
  if (static_cast<int>(joins.size()) < options_.min_nodes) {
    // Joiners only join a running generation: nothing can make up the
    // number, so the survivors fail now instead of at their timeout.
    outcome.mutable_error()->set_code(v1::PEER_FAILED);
    outcome.mutable_error()->set_message(absl::StrCat(
        "only ", joins.size(), " node(s) survive generation ", g,
        ", fewer than --min-nodes=", options_.min_nodes, "; dead: ", dead_list, "; the job ends"));
    return std::optional<v1::JoinResponse>(std::move(outcome));
  }
  // Survivors one iteration apart commit the iteration a death split
  // (resume_rule.h), as on the embedded leader.
  std::map<int, uint64_t> resumes;
  for (const auto& [rank, join] : joins) resumes[rank] = join.resume_iteration();
  if (std::string split = CheckResumeIterations(g, resumes, dead_list); !split.empty()) {
    outcome.mutable_error()->set_code(v1::PEER_FAILED);
    outcome.mutable_error()->set_message(split);
    return std::optional<v1::JoinResponse>(std::move(outcome));
  }
  spdlog::warn("event=reforming generation={} survivors={} dead={}", g + 1, joins.size(),
               LogValue(dead_list));
  // One apart: the generation starts at the higher (the others commit the
  // split iteration first), as on the embedded leader.
  uint64_t starts_at = 0;
  for (const auto& [rank, resume] : resumes) starts_at = std::max(starts_at, resume);
  return std::optional<v1::JoinResponse>(MakeGeneration(joins, g + 1, starts_at, &aborted));
}

std::map<int, std::string> EtcdRendezvous::ProbeUndecided(
    const v1::JoinResponse& aborted, const GenerationState& state,
    const std::map<int, v1::JoinRequest>& joins) {
  std::vector<const v1::Peer*> undecided;
  std::vector<std::string> addresses;
  for (const v1::Peer& p : aborted.peers()) {
    const int r = p.node_rank();
    if (p.local_size() == 0 || joins.count(r) != 0 || state.left.count(r) != 0 ||
        state.dead.count(r) != 0 || p.listen_address().empty()) {
      continue;
    }
    undecided.push_back(&p);
    addresses.push_back(p.listen_address());
  }
  std::map<int, std::string> refused;
  if (addresses.empty()) return refused;
  const std::vector<ProbeOutcome> outcomes = ProbeListeners(addresses);
  for (size_t i = 0; i < undecided.size(); ++i) {
    if (outcomes[i].liveness != Liveness::kRefused) continue;
    const v1::Peer& p = *undecided[i];
    refused[p.node_rank()] = RefusesConnections(p.listen_address());
    MarkRefused(aborted.generation(), p);
  }
  return refused;
}

void EtcdRendezvous::MarkRefused(uint64_t generation, const v1::Peer& peer) {
  spdlog::error(
      "event=node_presumed_dead generation={} node_rank={} host={} address={} "
      "reason=\"connection refused\" etcd={}",
      generation, peer.node_rank(), peer.host(), peer.listen_address(), LogValue(Describe()));
  // Said in etcd, so that every survivor counts it out at once.
  client_
      ->Put(GenKey(generation, absl::StrCat("dead/", peer.node_rank())),
            RefusesConnections(peer.listen_address()))
      .IgnoreError();
}

v1::JoinResponse EtcdRendezvous::MakeGeneration(const std::map<int, v1::JoinRequest>& joins,
                                                uint64_t target, uint64_t start_iteration,
                                                const v1::JoinResponse* previous) const {
  v1::JoinResponse record;
  record.set_generation(target);
  record.set_start_iteration(start_iteration);
  record.set_incarnation(SecureRandom64() | 1);
  // Members going on keep their trainers' ranks (rank_offsets.h), as on
  // the embedded leader.
  std::map<int, int> kept;
  if (previous != nullptr) {
    for (const v1::Peer& p : previous->peers()) {
      if (p.local_size() > 0) kept[p.node_rank()] = p.rank_offset();
    }
  }
  std::vector<RankClaim> claims;
  for (const auto& [rank, join] : joins) {
    const auto it = kept.find(rank);
    const bool goes_on = it != kept.end() && join.resume_generation() != 0 &&
                         join.resume_generation() == previous->generation();
    claims.push_back({rank, join.local_size(), goes_on ? it->second : -1});
  }
  const std::vector<int> offsets = AssignRankOffsets(claims);
  int world_size = 0;
  size_t i = 0;
  for (const auto& [rank, join] : joins) {
    v1::Peer* peer = record.add_peers();
    peer->set_node_rank(rank);
    peer->set_host(join.host());
    peer->set_local_size(join.local_size());
    peer->set_listen_address(join.listen_address());
    peer->set_rank_offset(offsets[i++]);
    peer->set_joins_running(previous != nullptr && join.resume_generation() == 0);
    world_size += join.local_size();
  }
  record.set_world_size(world_size);
  return record;
}

absl::Status EtcdRendezvous::AdvanceCurrent(const v1::JoinResponse& formed) {
  // A compare-and-swap on the revision read: ROOT/current only moves
  // forward, whoever of the members writes it.
  for (int attempt = 0; attempt < 16; ++attempt) {
    int64_t revision = 0;
    ASSIGN_OR_RETURN(std::optional<v1::JoinResponse> current, ReadCurrent(&revision));
    if (current && current->generation() >= formed.generation()) return absl::OkStatus();
    EtcdCompare unchanged;
    unchanged.key = Key("current");
    unchanged.target = EtcdCompare::Target::kModRevision;
    unchanged.op = EtcdCompare::Op::kEqual;
    unchanged.number = revision;
    ASSIGN_OR_RETURN(EtcdTxnResult r, client_->Txn({unchanged},
                                                   {EtcdTxnOp{EtcdTxnOp::Kind::kPut, Key("current"),
                                                              formed.SerializeAsString(), 0}},
                                                   {}));
    if (!r.succeeded) continue;
    spdlog::info("event=generation_formed generation={} members={} world_size={} etcd={}",
                 formed.generation(), formed.peers_size(), formed.world_size(),
                 LogValue(Describe()));
    // The previous generation's keys are of no use to anyone now.
    if (formed.generation() > 1) {
      client_->DeletePrefix(StoreKey(GenerationKeyPrefix(formed.generation() - 1))).IgnoreError();
      client_->DeletePrefix(GenKey(formed.generation() - 1, "")).IgnoreError();
    }
    return absl::OkStatus();
  }
  return MakeError(v1::INTERNAL, absl::StrCat(Describe(), ": key ", Key("current"),
                                              " kept changing while generation ",
                                              formed.generation(), " was recorded"));
}

absl::Status EtcdRendezvous::Set(std::string_view key, std::string_view value) {
  return client_->Put(StoreKey(absl::string_view(key.data(), key.size())), std::string(value))
      .status();
}

absl::StatusOr<std::optional<std::string>> EtcdRendezvous::Get(std::string_view key) {
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> kv,
                   client_->Get(StoreKey(absl::string_view(key.data(), key.size()))));
  if (!kv) return std::optional<std::string>();
  return std::optional<std::string>(std::move(kv->value));
}

absl::Status EtcdRendezvous::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  return WaitForValues(keys, {}, timeout).status();
}

absl::StatusOr<std::map<std::string, std::string>> EtcdRendezvous::WaitForValues(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  return WaitForValues(keys, {}, timeout);
}

absl::StatusOr<std::map<std::string, std::string>> EtcdRendezvous::WaitForValues(
    const std::vector<std::string>& keys, const std::vector<std::string>& read_keys,
    absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) {
    return MakeError(v1::TIMEOUT, absl::StrCat("wait timed out after 0 ms; missing keys: ",
                                               absl::StrJoin(keys, ", ")));
  }
  const absl::Time deadline = MonotonicNow() + timeout;
  EtcdOperationDeadline bound("wait", deadline, timeout);
  // The keys, the read keys, then each scoped generation's abort key.
  const std::set<uint64_t> generations = GenerationsOf(keys);
  std::vector<std::string> etcd_keys;
  for (const std::string& k : keys) etcd_keys.push_back(StoreKey(k));
  for (const std::string& k : read_keys) etcd_keys.push_back(StoreKey(k));
  for (uint64_t g : generations) etcd_keys.push_back(GenKey(g, "abort"));
  etcd_keys.push_back(Key("current"));
  // What the last read etcd answered still missed (nullopt: none answered).
  std::optional<std::vector<std::string>> last_missing;
  while (true) {
    const uint64_t seen = Changes();
    std::vector<std::optional<EtcdKeyValue>> values;
    absl::Status read;
    for (size_t i = 0; i < etcd_keys.size() && read.ok(); i += kMaxReadsPerTxn) {
      const std::vector<std::string> chunk(
          etcd_keys.begin() + i,
          etcd_keys.begin() + std::min(etcd_keys.size(), i + kMaxReadsPerTxn));
      absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>> got = client_->GetMany(chunk);
      if (got.ok()) values.insert(values.end(), got->begin(), got->end());
      read = got.status();
    }
    if (!read.ok() && !Unreachable(read)) return read;
    if (read.ok()) {
      std::vector<std::string> missing;
      std::map<std::string, std::string> out;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (values[i]) {
          out[keys[i]] = values[i]->value;
        } else {
          missing.push_back(keys[i]);
        }
      }
      if (missing.empty()) {
        for (size_t i = 0; i < read_keys.size(); ++i) {
          if (values[keys.size() + i]) out[read_keys[i]] = values[keys.size() + i]->value;
        }
        return out;
      }
      size_t at = keys.size() + read_keys.size();
      for (uint64_t g : generations) {
        if (const std::optional<EtcdKeyValue>& abort = values[at++]) {
          return MakeError(v1::PEER_FAILED,
                           absl::StrCat("generation ", g, " aborted while waiting for keys [",
                                        absl::StrJoin(missing, ", "), "]: ", abort->value));
        }
      }
      // A newer generation formed (its predecessor's abort key is gone).
      v1::JoinResponse current;
      if (values[at] && current.ParseFromString(values[at]->value) && !generations.empty() &&
          current.generation() > *generations.begin()) {
        return MakeError(v1::PEER_FAILED,
                         absl::StrCat("generation ", *generations.begin(), " is over (generation ",
                                      current.generation(), " formed) while waiting for keys [",
                                      absl::StrJoin(missing, ", "), "]"));
      }
      last_missing = missing;
    } else if (MonotonicNow() < deadline) {
      last_missing.reset();  // etcd failed with time left: not the deadline's doing
    }
    if (MonotonicNow() >= deadline && last_missing) {
      // A read the deadline cut short, after etcd had answered, leaves the
      // timeout to name what the last answered read missed.
      return MakeError(v1::TIMEOUT,
                       absl::StrCat("wait timed out after ", Millis(timeout),
                                    " ms; missing keys: ", absl::StrJoin(*last_missing, ", ")));
    }
    if (!read.ok() && MonotonicNow() >= deadline) {
      return MakeError(
          v1::UNAVAILABLE,
          absl::StrCat("waiting for keys: ", Describe(), " did not answer for ", Millis(timeout),
                       " ms (", WithoutEtcdPrefix(read.message()), ")"));
    }
    AwaitChange(seen, deadline);
  }
}

absl::StatusOr<HeartbeatResult> EtcdRendezvous::Heartbeat(const HeartbeatParams& params) {
  {
    MonotonicMutexLock lock(&mu_);
    if (!lease_lost_.ok()) return lease_lost_;
  }
  if (!params.stall_report.empty()) {
    spdlog::warn("event=job_stall generation={} node_rank={} iteration={} report={}",
                 params.generation, params.node_rank, params.iteration,
                 LogValue(params.stall_report));
  }
  absl::StatusOr<HeartbeatResult> r = ReadHeartbeatBounded(params);
  MonotonicMutexLock lock(&mu_);
  const absl::Time now = MonotonicNow();
  if (r.ok()) {
    last_ok_ = now;
    last_result_ = *r;
    return r;
  }
  if (!Unreachable(r.status())) return r;
  // etcd out of reach for less than a lease: the other nodes do not count
  // this one dead yet, so neither does it give up on them.
  if (last_ok_ != absl::Time() && now - last_ok_ < options_.lease_ttl) return last_result_;
  return MakeError(v1::UNAVAILABLE,
                   absl::StrCat(Describe(), " has not answered for ", Millis(now - last_ok_),
                                " ms, longer than the lease TTL (", Millis(options_.lease_ttl),
                                " ms) after which the other nodes count this node dead (",
                                WithoutEtcdPrefix(r.status().message()), ")"));
}

absl::StatusOr<HeartbeatResult> EtcdRendezvous::ReadHeartbeatBounded(
    const HeartbeatParams& params) {
  EtcdOperationDeadline bound("heartbeat", MonotonicNow() + options_.etcd.call_timeout,
                              options_.etcd.call_timeout);
  return ReadHeartbeat(params);
}

std::string EtcdRendezvous::WithoutEtcdPrefix(absl::string_view message) const {
  absl::ConsumePrefix(&message, absl::StrCat(Describe(), ": "));
  return std::string(message);
}

absl::StatusOr<HeartbeatResult> EtcdRendezvous::ReadHeartbeat(const HeartbeatParams& params) {
  const int rank = params.node_rank;
  const uint64_t gen = params.generation;
  std::string host;
  bool known_aborted = false;
  {
    MonotonicMutexLock lock(&mu_);
    host = host_;
    known_aborted = aborted_.count(gen) != 0;
  }
  if (!params.node_error.ok() && gen != 0 && !known_aborted) {
    RETURN_IF_ERROR(AbortGeneration(gen,
                                    absl::StrCat("node_rank=", rank, " (host=", host, ") reported ",
                                                 v1::Code_Name(CodeOf(params.node_error)), ": ",
                                                 params.node_error.message()),
                                    params.node_error)
                        .status());
  }
  ASSIGN_OR_RETURN(std::optional<v1::JoinResponse> current, ReadCurrent(nullptr));
  HeartbeatResult result;
  result.generation = current ? current->generation() : 0;
  if (gen == 0) return result;
  if (gen < result.generation) {
    result.abort = true;
    result.abort_reason =
        absl::StrCat("generation ", gen, " is over: generation ", result.generation, " has formed");
    return result;
  }
  if (gen > result.generation) {
    return MakeError(v1::STATE, absl::StrCat("node_rank=", rank, " heartbeats for generation ", gen,
                                             ", which has not formed in ", Describe()));
  }
  ASSIGN_OR_RETURN(GenerationState state, ReadGeneration(gen));
  result.config_version = state.config_version;
  if (!state.abort_reason) {
    ASSIGN_OR_RETURN(std::optional<std::string> dead, DeadMember(*current, state));
    if (dead) {
      ASSIGN_OR_RETURN(std::string stands, AbortGeneration(gen, *dead));
      state.abort_reason = stands;
    }
  }
  if (!state.abort_reason) {
    if (!state.joining.empty() && !state.grow && FirstAliveMember(*current, state) == rank) {
      // Not this heartbeat's failure: the next one tries again, and the
      // joiner's own timeout bounds its wait.
      absl::StatusOr<std::optional<EtcdConfigEntry>> grow = ScheduleGrow(*current, params);
      if (!grow.ok()) {
        spdlog::warn("event=job_grow_append_failed generation={} error={}", gen,
                     LogValue(grow.status().message()));
      } else if (*grow) {
        result.config_version = std::max(result.config_version, (*grow)->version);
      }
    }
    return result;
  }
  result.abort = true;
  result.abort_reason = *state.abort_reason;
  result.abort_error = state.abort_error;
  bool ack = false;
  absl::Time seen_at;
  {
    MonotonicMutexLock lock(&mu_);
    aborted_.insert(gen);
    ack = acked_.insert(gen).second;
    seen_at = abort_seen_.emplace(gen, MonotonicNow()).first->second;
  }
  if (ack) RETURN_IF_ERROR(client_->Put(GenKey(gen, absl::StrCat("ack/", rank)), "").status());
  const absl::Duration since = MonotonicNow() - seen_at;
  const std::set<int> refused = ProbeSilent(*current, state, rank);
  for (const v1::Peer& p : current->peers()) {
    if (p.node_rank() == rank || p.local_size() == 0) continue;
    if (state.left.count(p.node_rank()) != 0) {
      result.silent_members.push_back(
          SilentMember{p.node_rank(), p.host(), since, true, false, p.listen_address()});
      continue;
    }
    if (state.acked.count(p.node_rank()) != 0) continue;
    // A member whose lease is gone has been silent a whole TTL at least.
    const bool alive = state.alive.count(p.node_rank()) != 0;
    const absl::Duration silent = alive ? since : std::max(since, options_.lease_ttl);
    result.silent_members.push_back(SilentMember{p.node_rank(), p.host(), silent, false,
                                                 refused.count(p.node_rank()) != 0,
                                                 p.listen_address()});
    if (refused.count(p.node_rank()) != 0) continue;
    // Presumed dead: said in etcd, so that every survivor's re-formation
    // round counts it out at once.
    if (silent >= kPresumedDeadAfter && state.dead.count(p.node_rank()) == 0) {
      client_
          ->Put(GenKey(gen, absl::StrCat("dead/", p.node_rank())),
                absl::StrCat("silent ", Millis(silent), " ms after the abort"))
          .IgnoreError();
    }
  }
  return result;
}

std::set<int> EtcdRendezvous::ProbeSilent(const v1::JoinResponse& current,
                                          const GenerationState& state, int rank) {
  std::set<int> refused;
  std::vector<const v1::Peer*> targets;
  std::vector<std::string> addresses;
  const absl::Time now = MonotonicNow();
  for (const v1::Peer& p : current.peers()) {
    const int r = p.node_rank();
    if (r == rank || p.local_size() == 0 || state.left.count(r) != 0 || state.acked.count(r) != 0 ||
        p.listen_address().empty()) {
      continue;
    }
    // Another survivor's probe, recorded in etcd.
    if (auto it = state.dead.find(r); it != state.dead.end()) {
      if (it->second == RefusesConnections(p.listen_address())) refused.insert(r);
      continue;
    }
    MonotonicMutexLock lock(&mu_);
    auto [last, fresh] = probed_.try_emplace({current.generation(), r}, now);
    if (!fresh && now - last->second < kReprobeEvery) continue;
    last->second = now;
    targets.push_back(&p);
    addresses.push_back(p.listen_address());
  }
  if (addresses.empty()) return refused;
  const std::vector<ProbeOutcome> outcomes = ProbeListeners(addresses);
  for (size_t i = 0; i < targets.size(); ++i) {
    if (outcomes[i].liveness != Liveness::kRefused) continue;
    refused.insert(targets[i]->node_rank());
    MarkRefused(current.generation(), *targets[i]);
  }
  return refused;
}

absl::StatusOr<EtcdRendezvous::ConfigTarget> EtcdRendezvous::ReadConfigTarget() {
  ConfigTarget target;
  ASSIGN_OR_RETURN(std::optional<v1::JoinResponse> current, ReadCurrent(&target.current_revision));
  target.generation = current ? current->generation() : 0;
  if (target.generation == 0) return target;
  ASSIGN_OR_RETURN(GenerationState state, ReadGeneration(target.generation));
  target.active = !state.abort_reason;
  target.config_version = state.config_version;
  target.config_at = state.config_at;
  return target;
}

absl::StatusOr<std::optional<EtcdConfigEntry>> EtcdRendezvous::TryAppendConfig(
    const ConfigTarget& target, uint64_t min_at_iteration,
    const std::function<std::string(const EtcdConfigEntry&)>& value, bool grow) {
  const uint64_t g = target.generation;
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> head, client_->Get(GenKey(g, "config_head")));
  // Strictly increasing: two versions never switch at the same boundary,
  // and a later one never switches before an earlier one.
  const EtcdConfigEntry entry{g, target.config_version + 1,
                              std::max(min_at_iteration, target.config_at + 1)};
  std::vector<EtcdCompare> compares(3);
  compares[0] = {Key("current"), EtcdCompare::Target::kModRevision, EtcdCompare::Op::kEqual,
                 target.current_revision, ""};
  compares[1] = {GenKey(g, "config_head"), EtcdCompare::Target::kModRevision,
                 EtcdCompare::Op::kEqual, head ? head->mod_revision : 0, ""};
  compares[2] = {GenKey(g, "abort"), EtcdCompare::Target::kVersion, EtcdCompare::Op::kEqual, 0, ""};
  std::vector<EtcdTxnOp> ops = {
      {EtcdTxnOp::Kind::kPut, StoreKey(ConfigKey(g, entry.version)), value(entry), 0},
      {EtcdTxnOp::Kind::kPut, GenKey(g, "config_head"),
       absl::StrCat(entry.version, " ", entry.at_iteration), 0}};
  if (entry.version > kConfigLogKeep) {
    ops.push_back(
        {EtcdTxnOp::Kind::kDelete, StoreKey(ConfigKey(g, entry.version - kConfigLogKeep)), "", 0});
  }
  if (grow) {
    // One grow entry per generation, however many members race to append.
    compares.push_back(
        {GenKey(g, "grow"), EtcdCompare::Target::kVersion, EtcdCompare::Op::kEqual, 0, ""});
    ops.push_back({EtcdTxnOp::Kind::kPut, GenKey(g, "grow"),
                   absl::StrCat(entry.version, " ", entry.at_iteration), 0});
  }
  ASSIGN_OR_RETURN(EtcdTxnResult r, client_->Txn(compares, ops, {}));
  if (!r.succeeded) return std::optional<EtcdConfigEntry>();
  return std::optional<EtcdConfigEntry>(entry);
}

absl::StatusOr<bool> EtcdRendezvous::TryHoldConfig(const ConfigTarget& target,
                                                   const std::string& record) {
  // Held only while ROOT/current is as read and the next round undecided:
  // a round decided first takes no change written after it.
  const std::vector<EtcdCompare> compares = {
      {Key("current"), EtcdCompare::Target::kModRevision, EtcdCompare::Op::kEqual,
       target.current_revision, ""},
      {GenKey(target.generation + 1, "outcome"), EtcdCompare::Target::kVersion,
       EtcdCompare::Op::kEqual, 0, ""}};
  // With this daemon's lease: no daemon left, no change held.
  RETURN_IF_ERROR(EnsureSession());
  int64_t lease = 0;
  {
    MonotonicMutexLock lock(&mu_);
    lease = lease_.id;
  }
  ASSIGN_OR_RETURN(
      EtcdTxnResult r,
      client_->Txn(compares, {{EtcdTxnOp::Kind::kPut, Key("config_held"), record, lease}}, {}));
  return r.succeeded;
}

absl::StatusOr<EtcdConfigEntry> EtcdRendezvous::AppendConfig(
    uint64_t min_at_iteration, const std::function<std::string(const EtcdConfigEntry&)>& value,
    uint64_t generation) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    ASSIGN_OR_RETURN(const ConfigTarget target, ReadConfigTarget());
    if (!target.active) {
      return MakeError(
          v1::STATE,
          absl::StrCat("no active generation to change in ", Describe(), " (generation ",
                       target.generation, target.generation == 0 ? " has not formed" : " aborted",
                       "); set the caps again once the job runs"));
    }
    if (generation != 0 && target.generation != generation) {
      return MakeError(
          v1::STATE,
          absl::StrCat("generation ", generation, " is not the job's active generation in ",
                       Describe(), " (generation ", target.generation, " is)"));
    }
    ASSIGN_OR_RETURN(std::optional<EtcdConfigEntry> entry,
                     TryAppendConfig(target, min_at_iteration, value));
    if (entry) return *entry;
  }
  return MakeError(v1::STATE, absl::StrCat("the config log in ", Describe(),
                                           " kept changing while this change was appended"));
}

absl::StatusOr<std::optional<EtcdConfigEntry>> EtcdRendezvous::AppendOrHoldConfig(
    uint64_t min_at_iteration, double bucket_cap_mb, double first_bucket_cap_mb) {
  auto value = [bucket_cap_mb, first_bucket_cap_mb](const EtcdConfigEntry& e) {
    return EncodeConfig(e.generation, e.at_iteration, bucket_cap_mb, first_bucket_cap_mb);
  };
  for (int attempt = 0; attempt < 16; ++attempt) {
    ASSIGN_OR_RETURN(const ConfigTarget target, ReadConfigTarget());
    if (target.active) {
      ASSIGN_OR_RETURN(std::optional<EtcdConfigEntry> entry,
                       TryAppendConfig(target, min_at_iteration, value));
      if (entry) return entry;
      continue;
    }
    // The next round decided but not yet current: it is formed (or failed),
    // so make it current and go on from there rather than hold past it.
    const std::string next_key = GenKey(target.generation + 1, "outcome");
    ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> decided, client_->Get(next_key));
    if (decided) {
      v1::JoinResponse outcome;
      if (!outcome.ParseFromString(decided->value)) {
        return MakeError(v1::INTERNAL, absl::StrCat(Describe(), ": key ", next_key,
                                                    " does not hold a generation record"));
      }
      RETURN_IF_ERROR(RecordOutcome(outcome));
      continue;
    }
    // Generation 0 marks it as not yet placed in any log.
    ASSIGN_OR_RETURN(bool held, TryHoldConfig(target, value(EtcdConfigEntry{})));
    if (!held) continue;
    spdlog::info("event=job_config_held generation={} state={} rendezvous=etcd",
                 target.generation + 1, target.generation == 0 ? "forming" : "re-forming");
    return std::optional<EtcdConfigEntry>();
  }
  return MakeError(v1::STATE, absl::StrCat("the rendezvous in ", Describe(),
                                           " kept changing while this change was appended"));
}

absl::Status EtcdRendezvous::Leave(int node_rank, uint64_t generation, std::string_view reason) {
  return LeaveGeneration(node_rank, generation, reason, /*departing=*/false);
}

absl::Status EtcdRendezvous::Depart(int node_rank, uint64_t generation, std::string_view reason) {
  return LeaveGeneration(node_rank, generation, reason, /*departing=*/true);
}

absl::Status EtcdRendezvous::LeaveGeneration(int node_rank, uint64_t generation,
                                             std::string_view reason, bool departing) {
  // Its writes together within one call budget; at shutdown the daemon's
  // shorter shutdown budget binds them (EtcdShutdownBudget).
  EtcdOperationDeadline bound(departing ? "depart" : "leave",
                              MonotonicNow() + options_.etcd.call_timeout,
                              options_.etcd.call_timeout);
  std::string host;
  {
    MonotonicMutexLock lock(&mu_);
    host = host_;
  }
  ASSIGN_OR_RETURN(std::optional<v1::JoinResponse> current, ReadCurrent(nullptr));
  const uint64_t g = generation == 0 ? (current ? current->generation() : 0) : generation;
  if (g == 0 || !current || g != current->generation()) {
    spdlog::info("event=leave node_rank={} generation={} reason={}", node_rank, g,
                 LogValue(std::string(reason)));
    return absl::OkStatus();
  }
  if (departing) {
    // Before the abort: a survivor that reads the abort finds it too.
    RETURN_IF_ERROR(
        client_->Put(GenKey(g, absl::StrCat("left/", node_rank)), std::string(reason)).status());
  }
  RETURN_IF_ERROR(AbortGeneration(g, absl::StrCat("node_rank=", node_rank, " (host=", host, ") ",
                                                  departing ? "left the job" : "left", ": ",
                                                  std::string(reason)))
                      .status());
  {
    MonotonicMutexLock lock(&mu_);
    if (!acked_.insert(g).second) return absl::OkStatus();
  }
  return client_->Put(GenKey(g, absl::StrCat("ack/", node_rank)), "").status();
}

}  // namespace gradsync
