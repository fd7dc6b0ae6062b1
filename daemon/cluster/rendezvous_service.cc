#include "daemon/cluster/rendezvous_service.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log_value.h"
#include "daemon/cluster/rank_offsets.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "daemon/cluster/rendezvous_records.h"
#include "daemon/cluster/resume_rule.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// Blocked Join/Wait calls wake at least this often to notice a cancelled
// call (the client went away) or a missed heartbeat deadline.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(100);

void SetError(v1::Error* error, v1::Code code, std::string message) {
  error->set_code(code);
  error->set_message(std::move(message));
}

int64_t Millis(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

void LogRefusal(const char* rpc, const grpc::ServerContext* context, int node_rank,
                const std::string& reason) {
  spdlog::warn("event=rendezvous_refused rpc={} node_rank={} peer={} reason={}", rpc, node_rank,
               context->peer(), LogValue(reason));
}

grpc::Status Cancelled() { return grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled"); }

// A fresh incarnation id: random so that two runs of a leader (even on the
// same host and port) never share one; never 0, which means "not joined".
uint64_t NewIncarnation() {
  uint64_t id = 0;
  while (id == 0) {
    const ssize_t n = getrandom(&id, sizeof(id), 0);
    if (n != static_cast<ssize_t>(sizeof(id)) && errno != EINTR) {
      // Only before the kernel's pool is initialised (early boot): say so.
      spdlog::error("event=getrandom_failed error={}", LogValue(std::strerror(errno)));
      id = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^ static_cast<uint64_t>(getpid());
    }
  }
  return id;
}

}  // namespace

RendezvousService::RendezvousService(std::string job_id, CallAuth auth, int num_nodes,
                                     absl::Duration default_timeout,
                                     absl::Duration heartbeat_timeout, MonotonicClock clock,
                                     RendezvousStoreLimits limits)
    : job_id_(std::move(job_id)),
      auth_(std::move(auth)),
      num_nodes_(std::max(num_nodes, 1)),
      limits_([&] {
        RendezvousStoreLimits l = limits;
        if (l.max_keys_per_generation == 0) {
          l.max_keys_per_generation = 64 + 16 * static_cast<size_t>(std::max(num_nodes, 1));
        }
        return l;
      }()),
      default_timeout_(default_timeout),
      heartbeat_timeout_(heartbeat_timeout),
      clock_(clock ? std::move(clock) : MonotonicClock(MonotonicNow)),
      incarnation_(NewIncarnation()),
      min_nodes_(std::max(num_nodes, 1)),
      max_nodes_(std::max(num_nodes, 1)),
      rank_limit_(std::max(num_nodes, 1)) {
  if (num_nodes < 1) spdlog::error("event=rendezvous_bad_config num_nodes={} using=1", num_nodes);
  spdlog::info(
      "event=rendezvous_started job_id={} incarnation={:016x} num_nodes={} default_timeout={} "
      "heartbeat_timeout={}",
      job_id_, incarnation_, num_nodes_, absl::FormatDuration(default_timeout_),
      absl::FormatDuration(heartbeat_timeout_));
}

RendezvousService::~RendezvousService() = default;

std::string RendezvousService::CheckCredentials(const v1::JobCredentials& job) const {
  if (job.job_id() != job_id_) {
    return absl::StrCat("job_id '", job.job_id(), "' does not match this job ('", job_id_, "')");
  }
  return "";
}

std::string RendezvousService::CheckIncarnation(uint64_t incarnation) const {
  if (incarnation == 0 || incarnation == incarnation_) return "";
  return absl::StrFormat(
      "the request names leader incarnation %016x, but this leader is incarnation %016x (the "
      "leader restarted): its generations are over",
      incarnation, incarnation_);
}

absl::Duration RendezvousService::RequestTimeout(int64_t timeout_ms) const {
  return timeout_ms > 0 ? absl::Milliseconds(timeout_ms) : default_timeout_;
}

void RendezvousService::AbortLocked(const std::string& reason, const v1::Error& cause) {
  if (!active()) return;
  aborted_ = true;
  abort_reason_ = reason;
  abort_error_ = cause;
  for (Member& m : members_) m.heard_since_abort = false;
  spdlog::warn("event=generation_aborted generation={} reason={}", generation_, LogValue(reason));
  // Whoever died, if one did, is among the members: a gone daemon is
  // proven so in milliseconds, sparing the survivors kPresumedDeadAfter.
  ProbeUndecidedMembersLocked(clock_());
  changed_.SignalAll();
}

void RendezvousService::ProbeUndecidedMembersLocked(absl::Time now) {
  if (generation_ == 0 || !aborted_) return;
  std::vector<int> ranks;
  std::vector<std::string> addresses;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    Member& m = members_[r];
    if (!m.member() || !m.departed.empty() || !m.refused.empty() || m.listen_address.empty() ||
        m.probing || pending_.count(r) != 0 ||
        (m.probed_at != absl::InfinitePast() && now - m.probed_at < kReprobeEvery)) {
      continue;
    }
    m.probing = true;
    m.probed_at = now;
    ranks.push_back(r);
    addresses.push_back(m.listen_address);
  }
  if (ranks.empty()) return;
  prober_.Probe(std::move(addresses),
                [this, generation = generation_, ranks](std::vector<ProbeOutcome> outcomes) {
                  MonotonicMutexLock lock(&mu_);
                  OnProbedLocked(generation, ranks, outcomes);
                });
}

void RendezvousService::OnProbedLocked(uint64_t generation, const std::vector<int>& ranks,
                                       const std::vector<ProbeOutcome>& outcomes) {
  // A newer generation's members are other objects, never probed by this.
  if (generation != generation_) return;
  for (size_t i = 0; i < ranks.size() && i < outcomes.size(); ++i) {
    Member& m = members_[ranks[i]];
    m.probing = false;
    if (outcomes[i].liveness != Liveness::kRefused || !m.member() || !m.departed.empty() ||
        pending_.count(ranks[i]) != 0) {
      continue;
    }
    m.refused = RefusesConnections(m.listen_address);
    spdlog::error(
        "event=node_presumed_dead generation={} node_rank={} host={} address={} "
        "reason=\"connection refused\"",
        generation_, ranks[i], m.host, m.listen_address);
  }
  changed_.SignalAll();  // an abort's answer or a re-formation round may wait on it
}

void RendezvousService::AwaitProbesLocked() {
  auto probing = [this] {
    mu_.AssertReaderHeld();
    for (const Member& m : members_) {
      if (m.probing) return true;
    }
    return false;
  };
  // On the real clock: the probe runs on the network, not the service's clock.
  const absl::Time until = MonotonicNow() + kLivenessProbeTimeout + absl::Milliseconds(50);
  for (absl::Time now = MonotonicNow(); probing() && now < until; now = MonotonicNow()) {
    changed_.WaitWithTimeout(&mu_, until - now);
  }
}

void RendezvousService::FillSilentMembersLocked(absl::Time now,
                                                v1::HeartbeatResponse* response) const {
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    const Member& m = members_[r];
    if (!m.member() || (m.heard_since_abort && m.departed.empty() && m.refused.empty())) continue;
    v1::SilentMember* silent = response->add_silent_members();
    silent->set_node_rank(r);
    silent->set_host(m.host);
    silent->set_silent_ms(Millis(now - m.last_seen));
    silent->set_departed(!m.departed.empty());
    silent->set_refuses_connections(!m.refused.empty());
    silent->set_listen_address(m.listen_address);
  }
}

void RendezvousService::CheckHeartbeatsLocked(absl::Time now) {
  if (!active() || heartbeat_timeout_ == absl::InfiniteDuration()) return;
  int stalest = -1;
  int late = 0;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (!members_[r].member() || now - members_[r].last_seen <= heartbeat_timeout_) continue;
    if (pending_.count(r) != 0) continue;  // left it at the grow boundary
    ++late;
    if (stalest < 0 || members_[r].last_seen < members_[stalest].last_seen) stalest = r;
  }
  if (stalest < 0) return;
  std::string reason =
      absl::StrCat("node_rank=", stalest, " (host=", members_[stalest].host,
                   ") sent no heartbeat for ", Millis(now - members_[stalest].last_seen),
                   " ms (heartbeat timeout ", Millis(heartbeat_timeout_), " ms)");
  if (late > 1) absl::StrAppend(&reason, "; ", late - 1, " other node(s) are late too");
  AbortLocked(reason);
}

void RendezvousService::FormGenerationLocked(absl::Time now, bool with_joiners) {
  ++generation_;
  aborted_ = false;
  abort_reason_.clear();
  abort_error_.Clear();
  // Members going on keep their trainers' ranks (rank_offsets.h).
  const std::vector<Member> previous = std::move(members_);
  std::vector<RankClaim> claims;
  members_.assign(rank_limit_.load(), Member{});
  size_t pending_count = 0;
  int world_size = 0;
  // Survivors re-forming an elastic job all resume one iteration; members
  // admitting joiners all enter one.
  uint64_t starts_at = 0;
  for (auto it = pending_.begin(); it != pending_.end();) {
    const PendingJoin& join = it->second;
    if (join.joins_running && !with_joiners) {
      ++it;  // waits for this generation's grow entry
      continue;
    }
    Member& m = members_[it->first];
    const bool goes_on = join.resume_generation != 0 && join.resume_generation == generation_ - 1 &&
                         it->first < static_cast<int>(previous.size()) &&
                         previous[it->first].member();
    claims.push_back({it->first, join.local_size, goes_on ? previous[it->first].rank_offset : -1});
    m.host = join.host;
    m.local_size = join.local_size;
    m.joins_running = join.joins_running;
    m.listen_address = join.listen_address;
    m.last_seen = now;
    world_size += join.local_size;
    starts_at = std::max(starts_at, join.resume_iteration);
    ++pending_count;
    it = pending_.erase(it);
  }
  const std::vector<int> offsets = AssignRankOffsets(claims);
  for (size_t i = 0; i < claims.size(); ++i) members_[claims[i].node_rank].rank_offset = offsets[i];
  started_at_ = starts_at;
  grow_scheduled_ = false;
  config_version_ = 0;  // each generation has its own config log
  config_last_at_ = 0;
  config_keys_.clear();
  // Keys of older generations can never be used again.
  size_t discarded = 0;
  for (auto it = kv_.begin(); it != kv_.end();) {
    const auto key_generation = KeyGeneration(it->first);
    if (key_generation && *key_generation < generation_) {
      it = EraseLocked(it);
      ++discarded;
    } else {
      ++it;
    }
  }
  spdlog::info(
      "event=generation_formed generation={} num_nodes={} members={} world_size={} "
      "discarded_keys={}",
      generation_, num_nodes_, pending_count, world_size, discarded);
  if (held_config_) {
    const ConfigEntry entry = AppendConfigLocked(starts_at + kHeldConfigAfter, held_config_);
    held_config_ = nullptr;
    spdlog::info(
        "event=job_config_published config_version={} generation={} at_iteration={} "
        "held=1",
        entry.version, entry.generation, entry.at_iteration);
  }
  // Joiners that came while the survivors re-formed join this generation
  // at its next grow boundary.
  if (!pending_.empty()) ScheduleGrowLocked();
  changed_.SignalAll();
}

void RendezvousService::FillJoinResponseLocked(v1::JoinResponse* response) const {
  response->set_generation(generation_);
  response->set_incarnation(incarnation_);
  int world_size = 0;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    v1::Peer* peer = response->add_peers();
    peer->set_node_rank(r);
    peer->set_host(members_[r].host);
    peer->set_local_size(members_[r].local_size);
    peer->set_listen_address(members_[r].listen_address);
    peer->set_rank_offset(members_[r].rank_offset);
    peer->set_joins_running(members_[r].joins_running);
    world_size += members_[r].local_size;
  }
  response->set_world_size(world_size);
  response->set_start_iteration(started_at_);
}

std::string RendezvousService::CheckRank(int rank) const {
  const int limit = rank_limit_.load();
  if (rank >= 0 && rank < limit) return "";
  return absl::StrCat("node_rank=", rank, " is out of range [0, ", limit, ")",
                      limit > num_nodes_ || rank >= num_nodes_
                          ? absl::StrCat(": the job takes at most --max-nodes=", limit, " nodes")
                          : "");
}

std::string RendezvousService::CheckJoinRequest(const v1::JoinRequest& request) const {
  if (std::string refusal = CheckCredentials(request.job()); !refusal.empty()) return refusal;
  const int rank = request.node_rank();
  if (request.num_nodes() != num_nodes_) {
    // A misconfigured node (a bad flag), not a layout disagreement.
    return absl::StrCat("node_rank=", rank, " was started with num_nodes=", request.num_nodes(),
                        " but the leader runs job '", job_id_, "' with num_nodes=", num_nodes_);
  }
  if (std::string refusal = CheckRank(rank); !refusal.empty()) return refusal;
  // Bounded: world sizes and rank offsets are sums of these, and no node
  // serves more trainers than this.
  if (request.local_size() < 1 || request.local_size() > kMaxJoinLocalSize) {
    return absl::StrCat("node_rank=", rank, " sent local_size=", request.local_size(),
                        "; it must be in [1, ", kMaxJoinLocalSize, "]");
  }
  if (request.host().empty()) {
    return absl::StrCat("node_rank=", rank, " sent no host for its Gloo device");
  }
  // Probed by the leader: bounded, and a port it can name.
  const std::string& listen = request.listen_address();
  if (listen.size() > kMaxJoinListenAddressBytes) {
    return absl::StrCat("node_rank=", rank, " sent listen_address of ", listen.size(),
                        " bytes; the bound is ", kMaxJoinListenAddressBytes);
  }
  if (!listen.empty() &&
      (listen.rfind(':') == std::string::npos ||
       listen.find_first_not_of("0123456789", listen.rfind(':') + 1) != std::string::npos ||
       listen.rfind(':') + 1 == listen.size())) {
    return absl::StrCat("node_rank=", rank, " sent listen_address '", listen,
                        "', which is not HOST:PORT");
  }
  return "";
}

grpc::Status RendezvousService::Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                                     v1::JoinResponse* response) {
  if (grpc::Status st = auth_.CheckChange(*context, "Rendezvous.Join"); !st.ok()) return st;
  const int rank = request->node_rank();
  auto refuse = [&](v1::Code code, std::string message) {
    LogRefusal("Join", context, rank, message);
    SetError(response->mutable_error(), code, std::move(message));
    return grpc::Status::OK;
  };
  if (std::string refusal = CheckJoinRequest(*request); !refusal.empty()) {
    return refuse(v1::INVALID_ARGUMENT, std::move(refusal));
  }

  MonotonicMutexLock lock(&mu_);
  const absl::Time now = clock_();
  CheckHeartbeatsLocked(now);
  if (active() && request->resume_generation() != 0 && !members_[rank].member()) {
    return refuse(v1::STATE,
                  absl::StrCat("generation ", generation_, " re-formed without node_rank=", rank,
                               ", which stayed silent past ", Millis(kPresumedDeadAfter),
                               " ms and was presumed dead"));
  }
  const bool joins_running = JoinsRunningLocked(rank, *request);
  // A member leaving the active generation at its grow boundary.
  const bool grows = active() && grow_scheduled_ && members_[rank].member() &&
                     request->resume_generation() == generation_;
  if (joins_running) {
    HoldJoinerLocked(rank);
  } else if (active() && !grows) {
    return refuse(v1::STATE,
                  absl::StrCat("node_rank=", rank, " is already a member of active generation ",
                               generation_, " (host=", members_[rank].host,
                               "); a node joins again once that generation aborts"));
  } else if (!grows) {
    if (std::string refusal = CheckRestartedMemberLocked(rank, *request); !refusal.empty()) {
      return refuse(v1::STATE, std::move(refusal));
    }
    if (std::string refusal = CheckResumeLocked(rank, *request); !refusal.empty()) {
      return refuse(v1::STATE, std::move(refusal));
    }
  }
  const uint64_t target = generation_ + 1;
  if (auto it = pending_.find(rank); it != pending_.end()) {
    return refuse(v1::INVALID_ARGUMENT,
                  absl::StrCat("node_rank=", rank, " joined twice for generation ", target,
                               " (first from host=", it->second.host,
                               ", again from host=", request->host(), ")"));
  }
  const uint64_t join_id = next_join_id_++;
  pending_[rank] = PendingJoin{join_id,
                               request->host(),
                               request->local_size(),
                               request->resume_generation(),
                               request->resume_iteration(),
                               request->listen_address(),
                               "",
                               joins_running};
  if (joins_running && active() && !grow_scheduled_) ScheduleGrowLocked();
  // Joined: what it reported while waiting for its trainers is over.
  if (auto report = kv_.find(FormingReportKey(rank)); report != kv_.end()) EraseLocked(report);
  spdlog::info(
      "event=join node_rank={} host={} local_size={} generation={} joined={}/{} "
      "resume_generation={} resume_iteration={}",
      rank, request->host(), request->local_size(), target, pending_.size(), num_nodes_,
      request->resume_generation(), request->resume_iteration());
  SettleRoundLocked(now);
  if (generation_ == target) {
    FillJoinResponseLocked(response);
    return grpc::Status::OK;
  }
  const absl::Duration timeout = RequestTimeout(request->timeout_ms());
  return AwaitGenerationLocked(context, rank, join_id, target, timeout, now + timeout, response);
}

grpc::Status RendezvousService::AwaitGenerationLocked(grpc::ServerContext* context, int rank,
                                                      uint64_t join_id, uint64_t target,
                                                      absl::Duration timeout, absl::Time deadline,
                                                      v1::JoinResponse* response) {
  while (true) {
    auto it = pending_.find(rank);
    if (it == pending_.end() || it->second.join_id != join_id) {
      if (generation_ >= target) break;  // formed with it (its entry went)
      SetError(response->mutable_error(), v1::STATE,
               absl::StrCat("node_rank=", rank, " left before generation ", target, " formed"));
      return grpc::Status::OK;
    }
    // A joiner left out of a re-formation joins the next generation.
    if (generation_ >= target) target = generation_ + 1;
    if (!it->second.error.empty()) {
      SetError(response->mutable_error(), v1::PEER_FAILED, it->second.error);
      pending_.erase(it);
      changed_.SignalAll();
      return grpc::Status::OK;
    }
    if (context->IsCancelled()) {
      pending_.erase(it);
      changed_.SignalAll();
      spdlog::info("event=join_cancelled node_rank={} generation={}", rank, target);
      return Cancelled();
    }
    const absl::Time t = clock_();
    if (t >= deadline) {
      std::string message =
          it->second.joins_running
              ? absl::StrCat("join timed out after ", Millis(timeout), " ms waiting to join ",
                             "running generation ", generation_,
                             ": its members did not reach the grow boundary (", MembersLocked(),
                             ")")
              : absl::StrCat("join timed out after ", Millis(timeout),
                             " ms waiting for generation ", target, ": ", pending_.size(), " of ",
                             num_nodes_,
                             " nodes joined; missing node ranks: ", MissingNodesLocked());
      pending_.erase(it);
      changed_.SignalAll();
      spdlog::warn("event=join_timeout node_rank={} generation={} reason={}", rank, target,
                   LogValue(message));
      SetError(response->mutable_error(), v1::TIMEOUT, std::move(message));
      return grpc::Status::OK;
    }
    changed_.WaitWithTimeout(&mu_, std::min(deadline - t, kWaitSlice));
    // A re-formation round decides on silence too, not only on Joins.
    if (generation_ < target) SettleRoundLocked(clock_());
  }
  if (generation_ != target) {
    SetError(response->mutable_error(), v1::STATE,
             absl::StrCat("generation ", target, " formed and was already replaced by generation ",
                          generation_));
    return grpc::Status::OK;
  }
  FillJoinResponseLocked(response);
  return grpc::Status::OK;
}

std::string RendezvousService::MissingNodesLocked() const {
  std::vector<std::string> missing;
  for (int r = 0; r < num_nodes_; ++r) {
    if (pending_.count(r) != 0) continue;
    const auto report = kv_.find(FormingReportKey(r));
    missing.push_back(absl::StrCat(
        "node_rank=", r, " (",
        report != kv_.end() && !report->second.empty()
            ? report->second
            : "no report from it: its daemon is down or stopped or unreachable or none of "
              "its trainers registered",
        ")"));
  }
  return absl::StrJoin(missing, ", ");
}

std::string RendezvousService::MembersLocked() const {
  std::vector<std::string> members;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (!members_[r].member()) continue;
    members.push_back(
        absl::StrCat("node_rank=", r, " at iteration ", members_[r].iteration,
                     pending_.count(r) != 0 ? " (left for the next generation)" : ""));
  }
  return members.empty() ? "none" : absl::StrJoin(members, ", ");
}

std::string RendezvousService::CheckKeyGenerationLocked(const std::string& key) const {
  const auto key_generation = KeyGeneration(key);
  if (!key_generation) return "";
  if (*key_generation < generation_) {
    return absl::StrCat("key '", key, "' belongs to generation ", *key_generation,
                        ", which is over (current generation ", generation_, ")");
  }
  if (*key_generation > generation_) {
    return absl::StrCat("key '", key, "' belongs to generation ", *key_generation,
                        ", which has not formed (current generation ", generation_, ")");
  }
  return "";
}

std::vector<std::string> RendezvousService::RecentStallReports() {
  MonotonicMutexLock lock(&mu_);
  return std::vector<std::string>(stall_reports_.begin(), stall_reports_.end());
}

std::string RendezvousService::CheckStoreBoundsLocked(const std::string& key,
                                                      size_t value_bytes) const {
  if (key.size() > limits_.max_key_bytes) {
    return absl::StrCat("key '", key.substr(0, 64), "...' is ", key.size(), " bytes; the bound is ",
                        limits_.max_key_bytes);
  }
  if (value_bytes > limits_.max_value_bytes) {
    return absl::StrCat("value of key '", key, "' is ", value_bytes,
                        " bytes; the bound is max_value_bytes=", limits_.max_value_bytes);
  }
  const auto existing = kv_.find(key);
  const size_t replaced = existing == kv_.end() ? 0 : key.size() + existing->second.size();
  if (kv_bytes_ - replaced + key.size() + value_bytes > limits_.max_total_bytes) {
    return absl::StrCat("key '", key, "' would grow the store to ",
                        kv_bytes_ - replaced + key.size() + value_bytes,
                        " bytes; the bound is max_total_bytes=", limits_.max_total_bytes);
  }
  if (existing != kv_.end()) return "";
  if (const auto generation = KeyGeneration(key)) {
    const auto it = keys_per_generation_.find(*generation);
    // The leader's own config log (bounded by kConfigLogKeep) does not use
    // up what the nodes may store.
    size_t count = it == keys_per_generation_.end() ? 0 : it->second;
    if (*generation == generation_) count -= std::min(count, config_keys_.size());
    if (count >= limits_.max_keys_per_generation) {
      return absl::StrCat(
          "key '", key, "' would be key ", count + 1, " of generation ", *generation,
          "; the bound is max_keys_per_generation=", limits_.max_keys_per_generation);
    }
  } else if (job_wide_keys_ >= limits_.max_job_wide_keys) {
    return absl::StrCat(
        "key '", key, "' would be job-wide key ", job_wide_keys_ + 1,
        " (outside any generation); the bound is max_job_wide_keys=", limits_.max_job_wide_keys);
  }
  return "";
}

void RendezvousService::StoreLocked(const std::string& key, const std::string& value) {
  auto [it, inserted] = kv_.try_emplace(key);
  if (inserted) {
    kv_bytes_ += key.size();
    if (const auto generation = KeyGeneration(key)) {
      ++keys_per_generation_[*generation];
    } else {
      ++job_wide_keys_;
    }
  } else {
    kv_bytes_ -= it->second.size();
  }
  it->second = value;
  kv_bytes_ += value.size();
}

std::map<std::string, std::string>::iterator RendezvousService::EraseLocked(
    std::map<std::string, std::string>::iterator it) {
  kv_bytes_ -= it->first.size() + it->second.size();
  if (const auto generation = KeyGeneration(it->first)) {
    if (auto count = keys_per_generation_.find(*generation);
        count != keys_per_generation_.end() && --count->second == 0) {
      keys_per_generation_.erase(count);
    }
  } else {
    --job_wide_keys_;
  }
  return kv_.erase(it);
}

void RendezvousService::SetKey(const std::string& key, const std::string& value) {
  MonotonicMutexLock lock(&mu_);
  // The hosting daemon's own keys are trusted: counted, never refused.
  StoreLocked(key, value);
  changed_.SignalAll();
}

grpc::Status RendezvousService::Set(grpc::ServerContext* context, const v1::SetRequest* request,
                                    v1::SetResponse* response) {
  if (grpc::Status st = auth_.CheckChange(*context, "Rendezvous.Set"); !st.ok()) return st;
  if (std::string refusal = CheckCredentials(request->job()); !refusal.empty()) {
    LogRefusal("Set", context, -1, refusal);
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, std::move(refusal));
    return grpc::Status::OK;
  }
  if (request->key().empty()) {
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, "Set: empty key");
    return grpc::Status::OK;
  }
  if (std::string refusal = CheckIncarnation(request->incarnation()); !refusal.empty()) {
    LogRefusal("Set", context, -1, refusal);
    SetError(response->mutable_error(), v1::STATE, std::move(refusal));
    return grpc::Status::OK;
  }
  MonotonicMutexLock lock(&mu_);
  CheckHeartbeatsLocked(clock_());
  if (std::string refusal = CheckKeyGenerationLocked(request->key()); !refusal.empty()) {
    LogRefusal("Set", context, -1, refusal);
    SetError(response->mutable_error(), v1::STATE, std::move(refusal));
    return grpc::Status::OK;
  }
  if (std::string refusal = CheckStoreBoundsLocked(request->key(), request->value().size());
      !refusal.empty()) {
    LogRefusal("Set", context, -1, refusal);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("Rendezvous.Set refused: ", refusal));
  }
  StoreLocked(request->key(), request->value());
  DiscardSettledPlanStampsLocked(request->key());
  changed_.SignalAll();
  return grpc::Status::OK;
}

void RendezvousService::DiscardSettledPlanStampsLocked(const std::string& key) {
  // A node publishes a plan stamp only after its check of the previous plan
  // it checked passed, which needed every node's stamp of that plan, each
  // published after its own check of the plan before was over. So when node
  // n publishes w after u (and t before u), every node is done reading
  // stamps of t and older: a node keeps its two newest stamps, and bursts of
  // config changes no longer leave one key per change per node.
  const std::optional<PlanKeyParts> published = ParsePlanKey(key);
  const std::optional<uint64_t> generation = KeyGeneration(key);
  if (!published || !generation) return;
  const std::string prefix = PlanKeyPrefix(*generation);
  std::vector<std::pair<uint64_t, std::map<std::string, std::string>::iterator>> mine;
  for (auto it = kv_.lower_bound(prefix);
       it != kv_.end() && absl::string_view(it->first).substr(0, prefix.size()) == prefix; ++it) {
    const std::optional<PlanKeyParts> parts = ParsePlanKey(it->first);
    if (parts && parts->node_rank == published->node_rank) mine.emplace_back(parts->version, it);
  }
  if (mine.size() <= 2) return;
  std::sort(mine.begin(), mine.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 2; i < mine.size(); ++i) EraseLocked(mine[i].second);
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context, const v1::GetRequest* request,
                                    v1::GetResponse* response) {
  if (grpc::Status st = auth_.CheckChange(*context, "Rendezvous.Get"); !st.ok()) return st;
  if (std::string refusal = CheckCredentials(request->job()); !refusal.empty()) {
    LogRefusal("Get", context, -1, refusal);
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, std::move(refusal));
    return grpc::Status::OK;
  }
  if (std::string refusal = CheckIncarnation(request->incarnation()); !refusal.empty()) {
    LogRefusal("Get", context, -1, refusal);
    SetError(response->mutable_error(), v1::STATE, std::move(refusal));
    return grpc::Status::OK;
  }
  MonotonicMutexLock lock(&mu_);
  CheckHeartbeatsLocked(clock_());
  if (std::string refusal = CheckKeyGenerationLocked(request->key()); !refusal.empty()) {
    SetError(response->mutable_error(), v1::STATE, std::move(refusal));
    return grpc::Status::OK;
  }
  if (auto it = kv_.find(request->key()); it != kv_.end()) {
    response->set_found(true);
    response->set_value(it->second);
  }
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                                     v1::WaitResponse* response) {
  if (grpc::Status st = auth_.CheckChange(*context, "Rendezvous.Wait"); !st.ok()) return st;
  if (std::string refusal = CheckCredentials(request->job()); !refusal.empty()) {
    LogRefusal("Wait", context, -1, refusal);
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, std::move(refusal));
    return grpc::Status::OK;
  }
  if (std::string refusal = CheckIncarnation(request->incarnation()); !refusal.empty()) {
    LogRefusal("Wait", context, -1, refusal);
    SetError(response->mutable_error(), v1::STATE, std::move(refusal));
    return grpc::Status::OK;
  }
  const absl::Duration timeout = RequestTimeout(request->timeout_ms());
  MonotonicMutexLock lock(&mu_);
  const absl::Time deadline = clock_() + timeout;
  std::vector<std::string> missing;
  for (;;) {
    const absl::Time now = clock_();
    CheckHeartbeatsLocked(now);
    missing.clear();
    bool in_aborted_generation = false;
    for (const std::string& key : request->keys()) {
      if (std::string refusal = CheckKeyGenerationLocked(key); !refusal.empty()) {
        SetError(response->mutable_error(), v1::STATE, std::move(refusal));
        return grpc::Status::OK;
      }
      if (kv_.count(key) != 0) continue;
      missing.push_back(key);
      if (aborted_ && KeyGeneration(key) == generation_) in_aborted_generation = true;
    }
    if (missing.empty()) {
      if (request->return_values()) FillWaitValuesLocked(*request, response);
      return grpc::Status::OK;
    }
    if (in_aborted_generation) {
      SetError(response->mutable_error(), v1::PEER_FAILED,
               absl::StrCat("generation ", generation_, " aborted while waiting for keys [",
                            absl::StrJoin(missing, ", "), "]: ", abort_reason_));
      return grpc::Status::OK;
    }
    if (context->IsCancelled()) return Cancelled();
    if (now >= deadline) {
      SetError(response->mutable_error(), v1::TIMEOUT,
               absl::StrCat("wait timed out after ", Millis(timeout),
                            " ms; missing keys: ", absl::StrJoin(missing, ", ")));
      return grpc::Status::OK;
    }
    ++blocked_waits_;
    changed_.WaitWithTimeout(&mu_, std::min(deadline - now, kWaitSlice));
    --blocked_waits_;
  }
}

void RendezvousService::FillWaitValuesLocked(const v1::WaitRequest& request,
                                             v1::WaitResponse* response) const {
  size_t bytes = 0;
  for (const auto* keys : {&request.keys(), &request.read_keys()}) {
    for (const std::string& key : *keys) {
      const auto it = kv_.find(key);
      if (it == kv_.end()) continue;  // a read key not set: the caller sees it missing
      const size_t size = key.size() + it->second.size();
      if (bytes + size > kMaxWaitValuesBytes) continue;  // left for the caller to get
      bytes += size;
      v1::KeyValue* kv = response->add_values();
      kv->set_key(key);
      kv->set_value(it->second);
    }
  }
}

grpc::Status RendezvousService::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  if (grpc::Status st = auth_.CheckChange(*context, "Rendezvous.Heartbeat"); !st.ok()) return st;
  const int rank = request->node_rank();
  if (std::string refusal = CheckCredentials(request->job()); !refusal.empty()) {
    LogRefusal("Heartbeat", context, rank, refusal);
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, std::move(refusal));
    return grpc::Status::OK;
  }
  if (std::string message = CheckRank(rank); !message.empty()) {
    LogRefusal("Heartbeat", context, rank, message);
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, std::move(message));
    return grpc::Status::OK;
  }
  if (std::string refusal = CheckIncarnation(request->incarnation()); !refusal.empty()) {
    LogRefusal("Heartbeat", context, rank, refusal);
    SetError(response->mutable_error(), v1::STATE, absl::StrCat("node_rank=", rank, ": ", refusal));
    return grpc::Status::OK;
  }
  MonotonicMutexLock lock(&mu_);
  const absl::Time now = clock_();
  CheckHeartbeatsLocked(now);
  response->set_generation(generation_);
  response->set_config_version(config_version_);
  const uint64_t generation = request->generation();
  if (generation > generation_) {
    SetError(response->mutable_error(), v1::STATE,
             absl::StrCat("node_rank=", rank, " heartbeats for generation ", generation,
                          ", which has not formed (current generation ", generation_, ")"));
    return grpc::Status::OK;
  }
  if (generation == 0) return grpc::Status::OK;  // not joined yet: liveness only
  if (generation < generation_) {
    response->set_abort(true);
    response->set_abort_reason(absl::StrCat("generation ", generation, " is over: generation ",
                                            generation_, " has formed"));
    return grpc::Status::OK;
  }
  Member& member = members_[rank];
  if (!member.member()) {
    // A node presumed dead that was only stopped: the others re-formed.
    response->set_abort(true);
    response->set_abort_reason(absl::StrCat("node_rank=", rank, " is not a member of generation ",
                                            generation_,
                                            ": the other nodes re-formed the job without it"));
    return grpc::Status::OK;
  }
  member.last_seen = now;
  member.iteration = request->iteration();
  member.last_launched_bucket = request->last_launched_bucket();
  ++member.heartbeats;
  if (!request->stall_report().empty()) {
    // Horovod's stall warning, job-wide: the leader names the node, and the
    // node's report names its trainers and their unmarked tensors.
    spdlog::warn("event=job_stall generation={} node_rank={} host={} iteration={} report={}",
                 generation, rank, member.host, request->iteration(),
                 LogValue(request->stall_report()));
    stall_reports_.push_back(absl::StrCat("node_rank=", rank, " (host=", member.host,
                                          ") iteration=", request->iteration(), ": ",
                                          request->stall_report()));
    if (stall_reports_.size() > 16) stall_reports_.pop_front();
  }
  if (request->node_error().code() != v1::OK) {
    AbortLocked(absl::StrCat("node_rank=", rank, " (host=", member.host, ") reported ",
                             v1::Code_Name(request->node_error().code()), ": ",
                             request->node_error().message()),
                request->node_error());
  }
  member.heard_since_abort = true;
  if (aborted_) {
    ProbeUndecidedMembersLocked(now);
    AwaitProbesLocked();  // releases the lock: the generation may have moved on
    if (generation != generation_) {
      response->set_generation(generation_);
      response->set_abort(true);
      response->set_abort_reason(absl::StrCat("generation ", generation, " is over: generation ",
                                              generation_, " has formed"));
      return grpc::Status::OK;
    }
    FillSilentMembersLocked(clock_(), response);
  }
  response->set_abort(aborted_);
  response->set_abort_reason(abort_reason_);
  if (aborted_ && abort_error_.code() != v1::OK) *response->mutable_abort_error() = abort_error_;
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                                      v1::LeaveResponse* response) {
  if (grpc::Status st = auth_.CheckChange(*context, "Rendezvous.Leave"); !st.ok()) return st;
  const int rank = request->node_rank();
  if (std::string refusal = CheckCredentials(request->job()); !refusal.empty()) {
    LogRefusal("Leave", context, rank, refusal);
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, std::move(refusal));
    return grpc::Status::OK;
  }
  if (std::string message = CheckRank(rank); !message.empty()) {
    LogRefusal("Leave", context, rank, message);
    SetError(response->mutable_error(), v1::INVALID_ARGUMENT, std::move(message));
    return grpc::Status::OK;
  }
  if (std::string refusal = CheckIncarnation(request->incarnation()); !refusal.empty()) {
    LogRefusal("Leave", context, rank, refusal);
    SetError(response->mutable_error(), v1::STATE, absl::StrCat("node_rank=", rank, ": ", refusal));
    return grpc::Status::OK;
  }
  MonotonicMutexLock lock(&mu_);
  CheckHeartbeatsLocked(clock_());
  if (pending_.erase(rank) != 0) {
    spdlog::info("event=join_withdrawn node_rank={} generation={}", rank, generation_ + 1);
    changed_.SignalAll();
  }
  // 0 names the current generation (a restarted node may not know it).
  const uint64_t generation = request->generation() == 0 ? generation_ : request->generation();
  if (generation > generation_) {
    SetError(response->mutable_error(), v1::STATE,
             absl::StrCat("node_rank=", rank, " leaves generation ", generation,
                          ", which has not formed (current generation ", generation_, ")"));
    return grpc::Status::OK;
  }
  LeaveGenerationLocked(rank, generation, request->reason(), request->departing());
  return grpc::Status::OK;
}

void RendezvousService::LeaveGenerationLocked(int rank, uint64_t generation,
                                              const std::string& reason, bool departing) {
  const bool current_member =
      generation == generation_ && !members_.empty() && members_[rank].member();
  if (current_member) members_[rank].left = true;
  if (departing && current_member) {
    // Gone for good: the survivors need not wait out its silence.
    members_[rank].departed = reason.empty() ? "no reason given" : reason;
    spdlog::warn("event=member_departed generation={} node_rank={} host={} reason={}", generation_,
                 rank, members_[rank].host, LogValue(reason));
  }
  if (generation == generation_ && active()) {
    AbortLocked(absl::StrCat("node_rank=", rank, " (host=", members_[rank].host, ") ",
                             departing ? "left the job" : "left", ": ", reason));
  } else {
    spdlog::info(
        "event=leave node_rank={} generation={} current_generation={} departing={} "
        "reason={}",
        rank, generation, generation_, departing, LogValue(reason));
  }
  // It answered: it is not among the silent (possibly dead) members.
  if (generation == generation_ && !members_.empty()) members_[rank].heard_since_abort = true;
  changed_.SignalAll();  // a re-formation round may now be complete
}

bool RendezvousService::AbortGeneration(uint64_t generation, const std::string& reason) {
  MonotonicMutexLock lock(&mu_);
  if (generation != generation_ || !active()) return false;
  AbortLocked(reason);
  return true;
}

absl::StatusOr<RendezvousService::ConfigEntry> RendezvousService::AppendConfig(
    uint64_t min_at_iteration, const ConfigWriter& write) {
  MonotonicMutexLock lock(&mu_);
  CheckHeartbeatsLocked(clock_());
  if (!active()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no active generation to change (generation ", generation_,
                     aborted_ ? " aborted" : " has not formed", ")"));
  }
  return AppendConfigLocked(min_at_iteration, write);
}

std::optional<RendezvousService::ConfigEntry> RendezvousService::AppendOrHoldConfig(
    uint64_t min_at_iteration, ConfigWriter write) {
  MonotonicMutexLock lock(&mu_);
  CheckHeartbeatsLocked(clock_());
  if (active()) return AppendConfigLocked(min_at_iteration, write);
  held_config_ = std::move(write);
  spdlog::info("event=job_config_held generation={} state={}", generation_ + 1,
               generation_ == 0 ? "forming" : "re-forming");
  return std::nullopt;
}

RendezvousService::ConfigEntry RendezvousService::AppendConfigLocked(uint64_t min_at_iteration,
                                                                     const ConfigWriter& write) {
  // Strictly increasing: two versions never switch at the same boundary,
  // and a later one never switches before an earlier one.
  ConfigEntry entry{generation_, config_version_ + 1,
                    std::max(min_at_iteration, config_last_at_ + 1)};
  std::pair<std::string, std::string> record = write(entry);
  StoreLocked(record.first, record.second);
  config_keys_.push_back(std::move(record.first));
  if (config_keys_.size() > kConfigLogKeep) {
    if (auto oldest = kv_.find(config_keys_.front()); oldest != kv_.end()) EraseLocked(oldest);
    config_keys_.pop_front();
  }
  config_version_ = entry.version;
  config_last_at_ = entry.at_iteration;
  changed_.SignalAll();
  return entry;
}

void RendezvousService::set_min_nodes(int min_nodes) {
  MonotonicMutexLock lock(&mu_);
  min_nodes_ = std::clamp(min_nodes, 1, num_nodes_);
}

std::string RendezvousService::CheckRestartedMemberLocked(int rank,
                                                          const v1::JoinRequest& request) const {
  if (request.resume_generation() != 0 || min_nodes_ >= num_nodes_ || generation_ == 0 ||
      !aborted_ || !members_[rank].member()) {
    return "";
  }
  // Another member that neither left (the job ended) nor went silent (it
  // died too) may be re-forming the generation.
  const absl::Time now = clock_();
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    const Member& m = members_[r];
    if (r == rank || !m.member() || m.left || !m.departed.empty()) continue;
    if (pending_.count(r) == 0 && now - m.last_seen >= kPresumedDeadAfter) continue;
    return absl::StrCat("node_rank=", rank, " joins afresh while generation ", generation_,
                        ", of which it is a member, may still re-form among its surviving "
                        "nodes; it joins the generation they form");
  }
  return "";
}

bool RendezvousService::JoinsRunningLocked(int rank, const v1::JoinRequest& request) const {
  if (request.resume_generation() != 0 || min_nodes_ >= num_nodes_ || generation_ == 0 ||
      members_[rank].member()) {
    return false;
  }
  if (active()) return true;
  // The survivors of an aborted generation re-form: it joins what they form.
  for (const auto& [r, join] : pending_) {
    if (join.resume_generation != 0) return true;
  }
  return false;
}

void RendezvousService::HoldJoinerLocked(int rank) {
  // Its rank is below --max-nodes (CheckRank) and no member's: the job
  // never holds more nodes than --max-nodes.
  spdlog::info("event=join_held node_rank={} generation={} members={}", rank, generation_,
               LogValue(MembersLocked()));
}

void RendezvousService::ScheduleGrowLocked() {
  uint64_t furthest = started_at_;
  for (const Member& m : members_) {
    if (m.member()) furthest = std::max(furthest, m.iteration);
  }
  const ConfigEntry entry = AppendConfigLocked(furthest + kGrowAfter, [](const ConfigEntry& e) {
    return std::make_pair(ConfigKey(e.generation, e.version),
                          EncodeGrowConfig(e.generation, e.at_iteration));
  });
  grow_scheduled_ = true;
  spdlog::info("event=job_grow_published config_version={} generation={} at_iteration={}",
               entry.version, entry.generation, entry.at_iteration);
}

void RendezvousService::set_max_nodes(int max_nodes) {
  MonotonicMutexLock lock(&mu_);
  // Members are indexed by rank: the range is fixed once a generation formed.
  if (generation_ != 0) return;
  max_nodes_ = std::clamp(max_nodes, num_nodes_, kMaxNodes);
  rank_limit_.store(max_nodes_);
}

std::string RendezvousService::CheckResumeLocked(int rank, const v1::JoinRequest& request) const {
  bool resuming_round = false, fresh_round = false;
  for (const auto& [r, join] : pending_) {
    if (join.joins_running) continue;  // waits for what the others form
    (join.resume_generation != 0 ? resuming_round : fresh_round) = true;
  }
  const uint64_t resume = request.resume_generation();
  if (resume == 0) {
    if (!resuming_round) return "";
    // A restarted member: it joins what the survivors form (its retry
    // finds it no member then).
    return absl::StrCat("node_rank=", rank, " joins afresh while generation ", generation_,
                        ", of which it is a member, re-forms among its surviving nodes; it can "
                        "join the generation they form");
  }
  if (min_nodes_ >= num_nodes_) {
    return absl::StrCat("node_rank=", rank, " resumes generation ", resume,
                        ", but this job is not elastic (--min-nodes = --num-nodes ", num_nodes_,
                        ")");
  }
  if (resume != generation_ || !aborted_) {
    return absl::StrCat("node_rank=", rank, " resumes generation ", resume,
                        ", but the current generation is ", generation_,
                        aborted_ ? " (aborted)" : "");
  }
  if (!members_[rank].member()) {
    return absl::StrCat("node_rank=", rank, " resumes generation ", resume,
                        ", of which it is not a member");
  }
  if (fresh_round) {
    return absl::StrCat("node_rank=", rank, " resumes generation ", resume,
                        " while other nodes join a fresh job");
  }
  return "";
}

RendezvousService::RoundVerdict RendezvousService::JudgeRoundLocked(absl::Time now) const {
  RoundVerdict verdict;
  bool resuming = false;
  int joiners = 0;
  for (const auto& [rank, join] : pending_) {
    resuming |= join.resume_generation != 0;
    joiners += join.joins_running ? 1 : 0;
  }
  if (!resuming) {
    verdict.form = joiners == 0 && static_cast<int>(pending_.size()) == num_nodes_;
    return verdict;
  }
  // Joiners wait for the generation the survivors form.
  const int survivors = static_cast<int>(pending_.size()) - joiners;
  // A member of the aborted generation is alive when it joined again,
  // dead when silent this long; the round waits for every other one.
  std::vector<std::string> dead;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (!members_[r].member() || pending_.count(r) != 0) continue;
    if (!members_[r].departed.empty()) {
      dead.push_back(absl::StrCat("node_rank=", r, " (host=", members_[r].host,
                                  ", left the job: ", members_[r].departed, ")"));
      continue;
    }
    if (!members_[r].refused.empty()) {
      dead.push_back(absl::StrCat("node_rank=", r, " (host=", members_[r].host, ", ",
                                  members_[r].refused, ")"));
      continue;
    }
    const absl::Duration silent = now - members_[r].last_seen;
    if (silent < kPresumedDeadAfter) return verdict;
    dead.push_back(absl::StrCat("node_rank=", r, " (host=", members_[r].host, ", silent ",
                                Millis(silent), " ms)"));
  }
  const std::string dead_list = dead.empty() ? "none" : absl::StrJoin(dead, ", ");
  if (survivors < min_nodes_) {
    // Joiners only join a running generation: nothing can make up the
    // number, so the survivors fail now instead of at their timeout.
    verdict.error = absl::StrCat("only ", survivors, " node(s) survive generation ", generation_,
                                 ", fewer than --min-nodes=", min_nodes_, "; dead: ", dead_list,
                                 "; the job ends");
    return verdict;
  }
  // Survivors one iteration apart commit the iteration a death split
  // (resume_rule.h); the generation starts at the highest.
  std::map<int, uint64_t> resumes;
  for (const auto& [rank, join] : pending_) {
    if (!join.joins_running) resumes[rank] = join.resume_iteration;
  }
  verdict.error = CheckResumeIterations(generation_, resumes, dead_list);
  if (!verdict.error.empty()) return verdict;
  verdict.form = true;
  return verdict;
}

void RendezvousService::SettleRoundLocked(absl::Time now) {
  if (pending_.empty() || (active() && !grow_scheduled_)) return;
  // A failed round stays failed until its waiters took the error (one that
  // left first must not turn the split into "too few").
  for (const auto& [rank, join] : pending_) {
    if (!join.error.empty()) return;
  }
  const bool growing = active();
  const RoundVerdict verdict = growing ? JudgeGrowLocked(now) : JudgeRoundLocked(now);
  if (verdict.form) {
    FormGenerationLocked(now, growing);
    return;
  }
  if (verdict.error.empty()) {
    // A re-formation waits on the members not in it: one may have died meanwhile.
    bool resuming = false;
    for (const auto& [rank, join] : pending_) resuming |= join.resume_generation != 0;
    if (resuming) ProbeUndecidedMembersLocked(now);
    return;
  }
  spdlog::error("event=reformation_failed generation={} reason={}", generation_,
                LogValue(verdict.error));
  // The members still in the generation must stop too.
  if (growing) AbortLocked(verdict.error);
  for (auto& [rank, join] : pending_) join.error = verdict.error;
  changed_.SignalAll();
}

RendezvousService::RoundVerdict RendezvousService::JudgeGrowLocked(absl::Time now) const {
  RoundVerdict verdict;
  // Every member of the running generation left it at the grow boundary,
  // or is gone (departed, or silent this long while the others switched:
  // the usual shrink rules).
  std::vector<std::string> dead;
  int switched = 0, joiners = 0, first_rank = -1;
  for (const auto& [rank, join] : pending_) {
    if (join.joins_running) {
      ++joiners;
      continue;
    }
    ++switched;
    if (first_rank < 0) first_rank = rank;
  }
  if (switched == 0) return verdict;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    if (!members_[r].member() || pending_.count(r) != 0) continue;
    const absl::Duration silent = now - members_[r].last_seen;
    if (members_[r].departed.empty() && silent < kPresumedDeadAfter) return verdict;
    dead.push_back(absl::StrCat("node_rank=", r, " (host=", members_[r].host, ", ",
                                members_[r].departed.empty()
                                    ? absl::StrCat("silent ", Millis(silent), " ms")
                                    : absl::StrCat("left the job: ", members_[r].departed),
                                ")"));
  }
  const std::string dead_list = dead.empty() ? "none" : absl::StrJoin(dead, ", ");
  if (switched + joiners < min_nodes_) {
    verdict.error =
        absl::StrCat("only ", switched, " member(s) of generation ", generation_, " and ", joiners,
                     " joiner(s) remain, fewer than --min-nodes=", min_nodes_,
                     "; dead: ", dead_list, "; the job ends");
    return verdict;
  }
  const PendingJoin& first = pending_.at(first_rank);
  for (const auto& [rank, join] : pending_) {
    if (join.joins_running || join.resume_iteration == first.resume_iteration) continue;
    verdict.error =
        absl::StrCat("the members of generation ", generation_,
                     " reached the grow boundary at different iterations (node_rank=", first_rank,
                     " at ", first.resume_iteration, ", node_rank=", rank, " at ",
                     join.resume_iteration, "); dead: ", dead_list);
    return verdict;
  }
  if (!dead.empty()) {
    spdlog::warn("event=grow_without_dead generation={} dead={}", generation_, LogValue(dead_list));
  }
  verdict.form = true;
  return verdict;
}

RendezvousStatus RendezvousService::GetStatus() {
  MonotonicMutexLock lock(&mu_);
  CheckHeartbeatsLocked(clock_());
  RendezvousStatus status;
  status.generation = generation_;
  status.aborted = aborted_;
  status.abort_reason = abort_reason_;
  status.num_nodes = num_nodes_;
  status.config_version = config_version_;
  status.incarnation = incarnation_;
  status.blocked_waits = blocked_waits_;
  for (int r = 0; r < static_cast<int>(members_.size()); ++r) {
    const Member& m = members_[r];
    if (!m.member()) continue;
    status.nodes.push_back(RendezvousStatus::Node{
        r, m.host, m.local_size, m.iteration, m.last_launched_bucket, m.heartbeats, m.last_seen});
    status.world_size += m.local_size;
  }
  for (const auto& [rank, join] : pending_) status.pending_node_ranks.push_back(rank);
  return status;
}

}  // namespace gradsync
