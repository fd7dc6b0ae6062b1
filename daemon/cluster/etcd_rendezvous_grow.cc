// EtcdRendezvous's part of joining a running elastic job (docs/DESIGN.md,
// "Joining a running job"): a joiner is held under ROOT/gen/<g>/joining/,
// the generation's first member appends the grow entry, and the members
// leaving g at its boundary form g+1 with the joiners, as the embedded
// leader's JoinsRunningLocked / ScheduleGrowLocked / JudgeGrowLocked do.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log_value.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/cluster/etcd_rendezvous.h"
#include "daemon/cluster/rendezvous_records.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// The embedded leader's (RendezvousService::kGrowAfter): a joiner's grow
// entry switches this many iterations past the appending member's.
constexpr uint64_t kGrowAfter = 2;

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

int EtcdRendezvous::FirstAliveMember(const v1::JoinResponse& current,
                                     const GenerationState& state) {
  for (const v1::Peer& p : current.peers()) {
    const int r = p.node_rank();
    if (p.local_size() > 0 && state.alive.count(r) != 0 && state.left.count(r) == 0) return r;
  }
  return -1;
}

absl::StatusOr<std::optional<std::string>> EtcdRendezvous::DeadMember(
    const v1::JoinResponse& current, const GenerationState& state) {
  std::optional<std::string> dead = DeadMemberReason(current, state.alive);
  if (!dead || !state.grow) return dead;
  // At the grow boundary a member's Join of the next round proves it alive:
  // its client for the old generation may be gone.
  const uint64_t g = current.generation();
  ASSIGN_OR_RETURN(EtcdRange range, client_->GetPrefix(GenKey(g + 1, "join/")));
  std::set<int> alive = state.alive;
  for (const EtcdKeyValue& kv : range.kvs) {
    v1::JoinRequest join;
    if (join.ParseFromString(kv.value) && join.resume_generation() == g) {
      alive.insert(join.node_rank());
    }
  }
  return DeadMemberReason(current, alive);
}

absl::StatusOr<std::optional<EtcdRendezvous::JoinStep>> EtcdRendezvous::AwaitSurvivors(
    const JoinParams& params, const v1::JoinResponse& aborted, const GenerationState& state) {
  const uint64_t g = aborted.generation();
  const int rank = params.node_rank;
  JoinStep step;
  step.target = g + 1;
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> decided, client_->Get(GenKey(g + 1, "outcome")));
  v1::JoinResponse outcome;
  if (decided && outcome.ParseFromString(decided->value)) {
    // A fresh round that took this node is JoinRound's to answer.
    if (IsMember(outcome, rank)) return std::optional<JoinStep>();
    // The survivors' failure is every waiter's, as on the leader; a
    // generation they formed is joined at its grow boundary.
    RETURN_IF_ERROR(RecordOutcome(outcome));
    if (outcome.has_error() && outcome.error().code() != v1::OK) {
      return MakeError(outcome.error().code(), outcome.error().message());
    }
    step.blocked_by = absl::StrCat("generation ", g + 1, " formed without node_rank=", rank,
                                   "; it joins it at its grow boundary");
    return std::optional<JoinStep>(std::move(step));
  }
  ASSIGN_OR_RETURN(JoinsByRank joins, ReadJoins(g + 1, params));
  bool reforming = false;
  for (const auto& [r, join] : joins) reforming |= join.resume_generation() == g;
  for (const v1::Peer& p : aborted.peers()) {
    const int r = p.node_rank();
    reforming |= r != rank && p.local_size() > 0 && state.alive.count(r) != 0 &&
                 state.left.count(r) == 0 && state.dead.count(r) == 0;
  }
  if (!reforming) return std::optional<JoinStep>();
  // A fresh Join put before the survivors came must not sit in their round.
  DropJoin(rank);
  step.blocked_by = absl::StrCat("node_rank=", rank, " waits for the survivors of generation ", g,
                                 " of elastic job '", options_.job_id,
                                 "' (members: node_rank=", absl::StrJoin(MemberRanks(aborted), ","),
                                 ") to re-form; it joins the generation they form");
  return std::optional<JoinStep>(std::move(step));
}

absl::StatusOr<EtcdRendezvous::JoinStep> EtcdRendezvous::JoinRunning(
    const JoinParams& params, const v1::JoinResponse& running, const GenerationState& state) {
  const uint64_t g = running.generation();
  const int rank = params.node_rank;
  const bool joining = params.resume_generation == 0;
  const int max_nodes = MaxNodes(params.num_nodes);
  if (joining && rank >= max_nodes) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat("node_rank=", rank, " is out of range [0, ", max_nodes,
                                  "): the job takes at most --max-nodes=", max_nodes, " nodes"));
  }
  // Node 0 need not be a member: the joiner's trainers catch up from the
  // lowest live rank of an old member (RunningPlanRecord.catch_up_root),
  // and the generation's first live member appends the grow entry.
  if (!joining && !state.grow) {
    return MakeError(v1::STATE, absl::StrCat("node_rank=", rank, " leaves generation ", g,
                                             " at a grow boundary, but its config log in ",
                                             Describe(), " has no grow entry"));
  }
  JoinStep step;
  step.target = g + 1;
  const std::string who =
      joining
          ? absl::StrCat("node_rank=", rank, " waits to join running generation ", g,
                         " of elastic job '", options_.job_id,
                         "' (members: node_rank=", absl::StrJoin(MemberRanks(running), ","), "): ")
          : absl::StrCat("node_rank=", rank, " leaves generation ", g, " at its grow boundary: ");
  // A joiner that came after the round was decided joins the next one.
  auto formed_without = [&](const v1::JoinResponse& outcome) -> absl::StatusOr<JoinStep> {
    RETURN_IF_ERROR(RecordOutcome(outcome));
    step.blocked_by =
        absl::StrCat(who, "generation ", g + 1, " formed without it; it joins that generation");
    return step;
  };
  auto failed = [&](const v1::JoinResponse& outcome) {
    return outcome.has_error() && outcome.error().code() != v1::OK;
  };
  ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> decided, client_->Get(GenKey(g + 1, "outcome")));
  v1::JoinResponse outcome;
  if (decided && outcome.ParseFromString(decided->value)) {
    if (joining && !failed(outcome) && !IsMember(outcome, rank)) return formed_without(outcome);
    return FromOutcome(outcome, params);
  }
  RETURN_IF_ERROR(PutJoinOnce(params, g + 1, joining));
  if (!state.grow) {
    step.blocked_by = absl::StrCat(who, "no member has appended the grow entry yet");
    return step;
  }
  ASSIGN_OR_RETURN(JoinsByRank joins, ReadJoins(g + 1, params));
  for (const auto& [r, join] : joins) step.joined.insert(r);
  ASSIGN_OR_RETURN(std::optional<v1::JoinResponse> judged, JudgeGrow(running, state, joins));
  if (!judged) {
    step.blocked_by = absl::StrCat(who, "its members did not all reach the grow boundary (at ",
                                   state.grow_at, " or later)");
    return step;
  }
  const uint64_t starts_at = judged->start_iteration();
  ASSIGN_OR_RETURN(outcome, DecideRound(*std::move(judged), starts_at));
  // A failed grow ends the generation its members may still be in.
  if (failed(outcome)) RETURN_IF_ERROR(AbortGeneration(g, outcome.error().message()).status());
  if (joining && !failed(outcome) && !IsMember(outcome, rank)) return formed_without(outcome);
  return FromOutcome(outcome, params);
}

absl::StatusOr<std::optional<v1::JoinResponse>> EtcdRendezvous::JudgeGrow(
    const v1::JoinResponse& running, const GenerationState& state,
    const std::map<int, v1::JoinRequest>& joins) {
  const uint64_t g = running.generation();
  // The members that left g at its boundary, and the nodes joining.
  std::map<int, v1::JoinRequest> next;
  int first_rank = -1, joiners = 0;
  for (const auto& [rank, join] : joins) {
    const bool member = IsMember(running, rank);
    if (member ? join.resume_generation() != g : join.resume_generation() != 0) continue;
    next.emplace(rank, join);
    if (!member) {
      ++joiners;
    } else if (first_rank < 0) {
      first_rank = rank;
    }
  }
  if (first_rank < 0) return std::optional<v1::JoinResponse>();
  // Every other member switched too or is gone (the shrink rules); one
  // alive that has not switched yet is waited for, up to the timeout.
  const std::map<int, std::string> refused = ProbeUndecided(running, state, next);
  std::vector<std::string> dead;
  for (const v1::Peer& p : running.peers()) {
    const int r = p.node_rank();
    if (p.local_size() == 0 || next.count(r) != 0) continue;
    std::string gone;
    if (auto it = state.left.find(r); it != state.left.end()) {
      gone = absl::StrCat("left the job: ", it->second);
    } else if (auto it = state.dead.find(r); it != state.dead.end()) {
      gone = it->second;
    } else if (auto it = refused.find(r); it != refused.end()) {
      gone = it->second;
    } else if (state.alive.count(r) == 0) {
      gone = absl::StrCat("its lease expired, TTL ", Millis(options_.lease_ttl), " ms");
    } else {
      return std::optional<v1::JoinResponse>();
    }
    dead.push_back(absl::StrCat("node_rank=", r, " (host=", p.host(), ", ", gone, ")"));
  }
  const std::string dead_list = dead.empty() ? "none" : absl::StrJoin(dead, ", ");
  const int switched = static_cast<int>(next.size()) - joiners;
  v1::JoinResponse outcome;
  outcome.set_generation(g + 1);
  if (static_cast<int>(next.size()) < options_.min_nodes) {
    outcome.mutable_error()->set_code(v1::PEER_FAILED);
    outcome.mutable_error()->set_message(
        absl::StrCat("only ", switched, " member(s) of generation ", g, " and ", joiners,
                     " joiner(s) remain, fewer than --min-nodes=", options_.min_nodes,
                     "; dead: ", dead_list, "; the job ends"));
    return std::optional<v1::JoinResponse>(std::move(outcome));
  }
  const v1::JoinRequest& first = next.at(first_rank);
  for (const auto& [rank, join] : next) {
    if (!IsMember(running, rank) || join.resume_iteration() == first.resume_iteration()) continue;
    outcome.mutable_error()->set_code(v1::PEER_FAILED);
    outcome.mutable_error()->set_message(
        absl::StrCat("the members of generation ", g,
                     " reached the grow boundary at different iterations "
                     "(node_rank=",
                     first_rank, " at ", first.resume_iteration(), ", node_rank=", rank, " at ",
                     join.resume_iteration(), "); dead: ", dead_list));
    return std::optional<v1::JoinResponse>(std::move(outcome));
  }
  if (!dead.empty()) {
    spdlog::warn("event=grow_without_dead generation={} dead={}", g, LogValue(dead_list));
  }
  spdlog::info("event=growing generation={} members={} joiners={} start_iteration={} etcd={}",
               g + 1, switched, joiners, first.resume_iteration(), LogValue(Describe()));
  return std::optional<v1::JoinResponse>(
      MakeGeneration(next, g + 1, first.resume_iteration(), &running));
}

absl::StatusOr<std::optional<EtcdConfigEntry>> EtcdRendezvous::ScheduleGrow(
    const v1::JoinResponse& current, const HeartbeatParams& params) {
  const uint64_t g = current.generation();
  // As the leader's: past this member's iteration (the members run in
  // lockstep), so that no member has started it; the members still switch
  // together, at the first boundary every one of them holds the entry.
  const uint64_t at = std::max<uint64_t>(params.iteration, current.start_iteration()) + kGrowAfter;
  auto value = [](const EtcdConfigEntry& e) {
    return EncodeGrowConfig(e.generation, e.at_iteration);
  };
  for (int attempt = 0; attempt < 16; ++attempt) {
    ASSIGN_OR_RETURN(const ConfigTarget target, ReadConfigTarget());
    if (!target.active || target.generation != g) return std::optional<EtcdConfigEntry>();
    ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> grow, client_->Get(GenKey(g, "grow")));
    if (grow) return std::optional<EtcdConfigEntry>();
    ASSIGN_OR_RETURN(std::optional<EtcdConfigEntry> entry,
                     TryAppendConfig(target, at, value, /*grow=*/true));
    if (!entry) continue;
    spdlog::info(
        "event=job_grow_published config_version={} generation={} at_iteration={} "
        "rendezvous=etcd",
        entry->version, g, entry->at_iteration);
    return entry;
  }
  return MakeError(v1::STATE, absl::StrCat("the config log in ", Describe(),
                                           " kept changing while the grow entry was appended"));
}

}  // namespace gradsync
