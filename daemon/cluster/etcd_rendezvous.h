// EtcdRendezvous: the job's rendezvous kept in etcd (--rendezvous
// etcd://HOST:PORT[,...]/PREFIX) instead of inside node 0's daemon, so that
// no node of the job is special. Every daemon talks to etcd through
// EtcdClient; the contract is JobRendezvous's (the embedded leader's).
//
// What lives where, under ROOT = PREFIX/job/<job id>/:
// - ROOT/token_proof: the job token's proof (etcd_token_proof.h), never the
//   token; a daemon whose token does not match is refused UNAUTHENTICATED.
// - ROOT/current: the newest formed generation (a gradsync.v1.JoinResponse:
//   its number, members and world size). Forming generation g is one etcd
//   transaction comparing ROOT/current's mod_revision with the one read:
//   of daemons racing to form, exactly one writes it and all read the same.
// - ROOT/gen/<g>/join/<rank>: node `rank`'s Join of round g (a
//   gradsync.v1.JoinRequest), put with the daemon's etcd lease. It is the
//   node's liveness for generation g too: its lease expires when the daemon
//   stops renewing it (dead, stopped, cut off) and the key goes with it.
// - ROOT/gen/<g>/abort: the first reason generation g ended (a node's
//   error, a Leave, a member whose lease expired), created if absent.
//   ROOT/gen/<g>/abort_error: when a node's reported error ended it, that
//   error (a gradsync.v1.Error), written with the abort in one transaction.
// - ROOT/gen/<g>/ack/<rank>: node `rank` heard of that abort. A member that
//   has not acknowledged it, the others have, and stays silent longer than
//   the embedded leader's kPresumedDeadAfter, is presumed dead (as there),
//   and ROOT/gen/<g>/dead/<rank> says so for every survivor.
// - ROOT/gen/<g>/left/<rank>: node `rank` left the job for good (Depart:
//   its daemon shut down), why; written before it aborts g, so every
//   survivor counts it out of the re-formation at once.
// - ROOT/gen/<g>/outcome: how round g ended (created if absent, so every
//   node of the round reads the same): generation g's record, or the error
//   every survivor of a failed re-formation gets.
// - ROOT/gen/<g>/config_head: generation g's config log's newest version
//   and the iteration it switches at ("<version> <iteration>"); the
//   versions themselves are records (ConfigKey, rendezvous_records.h).
// - ROOT/gen/<g>/joining/<rank>: a node that is no member of running
//   generation g waits to join it (its JoinRequest, put with its lease
//   together with its Join of round g+1). A member's heartbeat that finds
//   one appends the grow entry to g's config log.
// - ROOT/gen/<g>/grow: g's grow entry ("<version> <iteration>"), created
//   with it in one transaction, so g gets one however many members race.
//   Every member leaves g at that boundary and joins round g+1, which forms
//   with them and the joiners (JudgeGrow).
// - ROOT/config_held: a config change made while no generation runs (a
//   ConfigRecord with generation 0), the newest replacing older ones, put
//   with the lease of the daemon that took it (gone with that daemon). The
//   transaction that decides the next generation's outcome moves it into
//   that generation's log as version 1 and deletes it.
// - ROOT/kv/<key>: the key-value records (Gloo's store, layouts, plan
//   stamps, forming reports); "g<g>/" keys belong to generation g: a Wait on
//   them ends with PEER_FAILED once g aborts, and they are deleted with
//   generation g's keys when g+1 forms.
// Waits are woken by one etcd watch on ROOT (a poll every second is the
// fallback); heartbeats read etcd.
//
// Elastic jobs re-form here as on the leader (JudgeRoundLocked's rules),
// node 0 included: any node may die; nodes join the running job as on the
// leader too (JudgeGrowLocked's rules). --autotune runs on the generation's
// first member (daemon/autotune_driver.h) and appends through AppendConfig.
//
// Errors name etcd and its members (EtcdClient's messages). etcd
// unreachable: Join and Wait keep trying until their timeout, then
// UNAVAILABLE naming etcd; a Heartbeat fails once no read succeeded for a
// whole lease TTL (by then the other nodes count this one dead). Every
// etcd call of a Join or a Wait ends by that operation's deadline, those
// of a Heartbeat, a Leave or a Depart within one call budget in all
// (EtcdOperationDeadline), so an operation is never overrun by its last
// call's retries.
//
// Thread-safe.
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/monotonic_mutex.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_lease_keeper.h"
#include "daemon/cluster/etcd/etcd_watch.h"
#include "daemon/cluster/job_rendezvous.h"
#include "gradsync/v1/rendezvous.pb.h"

namespace gradsync {

struct EtcdRendezvousOptions {
  EtcdClientOptions etcd;  // endpoints, TLS, user, call timeouts
  std::string prefix;      // PREFIX of --rendezvous: the job's keys live under it
  std::string job_id;
  std::string job_token;  // only its proof goes to etcd
  // A daemon that renewed no lease for this long is dead to the others.
  absl::Duration lease_ttl = absl::Seconds(10);
  // --min-nodes: the fewest survivors a re-formation may leave (= num_nodes
  // or 0: a fixed job, whose survivors never resume).
  int min_nodes = 0;
  // --max-nodes: node ranks from num_nodes up to it join a running elastic
  // job (0: up to num_nodes).
  int max_nodes = 0;
};

// One version of a generation's job-wide config log.
struct EtcdConfigEntry {
  uint64_t generation = 0;
  uint64_t version = 0;       // 1, 2, ...
  uint64_t at_iteration = 0;  // every node switches at this iteration
};

class EtcdRendezvous final : public JobRendezvous {
 public:
  // Builds the client (no round trip without etcd auth); the lease, the
  // token check and the watch come with the first Join.
  static absl::StatusOr<std::shared_ptr<EtcdRendezvous>> Connect(EtcdRendezvousOptions options);
  // Stops the watch and the lease keeper and revokes the lease (this node's
  // join keys go with it).
  ~EtcdRendezvous() override;

  absl::StatusOr<JoinResult> Join(const JoinParams& params) override;
  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::optional<std::string>> Get(std::string_view key) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::map<std::string, std::string>> WaitForValues(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::map<std::string, std::string>> WaitForValues(
      const std::vector<std::string>& keys, const std::vector<std::string>& read_keys,
      absl::Duration timeout) override;
  absl::StatusOr<HeartbeatResult> Heartbeat(const HeartbeatParams& params) override;
  absl::Status Leave(int node_rank, uint64_t generation, std::string_view reason) override;
  absl::Status Depart(int node_rank, uint64_t generation, std::string_view reason) override;
  std::string Describe() const override;
  bool embedded() const override { return false; }
  // This node leaves its generation at a grow boundary through another
  // client: its lease is left to expire rather than revoked when this one
  // goes, so that the members still in the generation do not count it dead
  // before its Join of the next one is in etcd.
  void Retire() override ABSL_LOCKS_EXCLUDED(mu_);

  // Appends the next version of the active generation's config log (the
  // leader's AppendConfig on etcd, from any node): switching at iteration
  // max(min_at_iteration, the previous version's + 1), its record (`value`
  // of the entry) stored under ConfigKey(generation, version), heartbeats
  // then answering that version. One transaction, retried when another
  // node appended first. STATE when no generation is active (none formed
  // yet, or the last one aborted), or when `generation` (0: any) is not the
  // active one: --autotune's candidates belong to the generation it tunes.
  absl::StatusOr<EtcdConfigEntry> AppendConfig(
      uint64_t min_at_iteration, const std::function<std::string(const EtcdConfigEntry&)>& value,
      uint64_t generation = 0);
  // An operator's change of the bucket caps (config set on any node), as
  // the leader's RendezvousService::AppendOrHoldConfig: appended as
  // AppendConfig does while a generation is active. Otherwise it is held
  // (ROOT/config_held, replacing any change held before) and becomes
  // version 1 of the next generation, switching at kHeldConfigAfter past
  // the iteration that generation starts in, written by the transaction
  // that forms it, so every node reads it with the generation. The held
  // key is put with this object's lease (its session, made here if none
  // yet): it lives as long as the daemon that keeps this object, as the
  // leader's held change lives in node 0's daemon, so a later job under
  // the same job id never inherits it. Returns the entry, or nullopt when
  // held.
  absl::StatusOr<std::optional<EtcdConfigEntry>> AppendOrHoldConfig(uint64_t min_at_iteration,
                                                                    double bucket_cap_mb,
                                                                    double first_bucket_cap_mb);

  // Where the job's keys live: PREFIX/job/<job id>/.
  const std::string& root() const { return root_; }

 private:
  // One look at the round this node is in: the generation it formed, or
  // what it still waits for.
  struct JoinStep {
    std::optional<JoinResult> formed;
    uint64_t target = 0;     // the generation being formed
    std::set<int> joined;    // node ranks in that round
    std::string blocked_by;  // non-empty: why the round cannot start yet
  };
  // Rounds' Joins by node rank.
  using JoinsByRank = std::map<int, v1::JoinRequest>;
  // Where a config change goes: the current generation as read.
  struct ConfigTarget {
    int64_t current_revision = 0;  // ROOT/current's mod_revision (0: absent)
    uint64_t generation = 0;       // 0: none formed
    bool active = false;           // formed and not aborted
    uint64_t config_version = 0;
    uint64_t config_at = 0;
  };
  // The generation state a heartbeat reads.
  struct GenerationState {
    std::set<int> alive;  // members whose join key (lease) exists
    std::set<int> acked;
    std::map<int, std::string> dead;  // presumed dead by a survivor: why
    std::map<int, std::string> left;  // left the job for good (Depart): why
    std::optional<std::string> abort_reason;
    absl::Status abort_error;     // ROOT/gen/<g>/abort_error: the report that aborted it
    uint64_t config_version = 0;  // the config log's newest version
    uint64_t config_at = 0;       // and the iteration it switches at
    std::set<int> joining;        // nodes waiting to join it (ROOT/gen/<g>/joining/)
    bool grow = false;            // its log has the grow entry
    uint64_t grow_at = 0;         // at this iteration
  };

  EtcdRendezvous(EtcdRendezvousOptions options, std::unique_ptr<EtcdClient> client);

  // Whether node `node_rank` is a member of `generation` (with trainers).
  static bool IsMember(const v1::JoinResponse& generation, int node_rank);
  // `generation`'s members' node ranks, in order.
  static std::vector<int> MemberRanks(const v1::JoinResponse& generation);

  std::string Key(absl::string_view suffix) const;
  std::string StoreKey(absl::string_view key) const;
  std::string GenKey(uint64_t generation, absl::string_view suffix) const;
  // The lease (kept alive), the token check and the watch, once.
  absl::Status EnsureSession() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckTokenProof();
  absl::StatusOr<JoinStep> TryJoin(const JoinParams& params) ABSL_LOCKS_EXCLUDED(mu_);
  // The round after `current` (with `state`, its generation's): joins it,
  // and decides it once every node joined (a fresh job) or every member of
  // the aborted generation joined again or is dead (a re-formation).
  absl::StatusOr<JoinStep> JoinRound(const JoinParams& params,
                                     const std::optional<v1::JoinResponse>& current,
                                     const GenerationState& state) ABSL_LOCKS_EXCLUDED(mu_);
  // Puts this node's Join of round `target` (and, for a node joining the
  // running generation target-1, its ROOT/gen/<target-1>/joining key), once
  // per round; a Join of an earlier round is deleted first.
  absl::Status PutJoinOnce(const JoinParams& params, uint64_t target, bool joining = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes this node's Join of the round it is in (and its joining key).
  void DropJoin(int node_rank) ABSL_LOCKS_EXCLUDED(mu_);
  // Every Join of round `target` by node rank (ranks below --max-nodes);
  // INVALID_ARGUMENT naming a node started with another --num-nodes.
  absl::StatusOr<std::map<int, v1::JoinRequest>> ReadJoins(uint64_t target,
                                                           const JoinParams& params);
  // A node that is no member of running generation `running` (a joiner) or
  // a member leaving it at its grow boundary: round g+1 of the grow, decided
  // by JudgeGrow once every member switched or is gone.
  absl::StatusOr<JoinStep> JoinRunning(const JoinParams& params, const v1::JoinResponse& running,
                                       const GenerationState& state) ABSL_LOCKS_EXCLUDED(mu_);
  // The embedded leader's JudgeGrowLocked on etcd: nullopt while a member
  // of `running` neither switched nor is gone, else the grown generation
  // (starting at the boundary) or an error for every one of them.
  absl::StatusOr<std::optional<v1::JoinResponse>> JudgeGrow(
      const v1::JoinResponse& running, const GenerationState& state,
      const std::map<int, v1::JoinRequest>& joins) ABSL_LOCKS_EXCLUDED(mu_);
  // A fresh Join of an elastic job whose generation `aborted` may still
  // re-form among its survivors: held (a step that waits) until they
  // formed, then it joins what they formed; nullopt when no survivor is
  // left (a fresh job forms), or their round's error.
  absl::StatusOr<std::optional<JoinStep>> AwaitSurvivors(const JoinParams& params,
                                                         const v1::JoinResponse& aborted,
                                                         const GenerationState& state)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Appends running `current`'s grow entry at this member's iteration +
  // kGrowAfter (its first alive member calls it, finding a node waiting to
  // join); the entry, or nullopt when g has one or is no longer active.
  absl::StatusOr<std::optional<EtcdConfigEntry>> ScheduleGrow(const v1::JoinResponse& current,
                                                              const HeartbeatParams& params);
  // The lowest-ranked member of `current` whose lease is alive (-1: none):
  // the one that appends a joiner's grow entry.
  static int FirstAliveMember(const v1::JoinResponse& current, const GenerationState& state);
  // Leave and Depart: `departing` first records ROOT/gen/<g>/left/<rank>.
  absl::Status LeaveGeneration(int node_rank, uint64_t generation, std::string_view reason,
                               bool departing) ABSL_LOCKS_EXCLUDED(mu_);
  // STATE unless a resuming join may enter the round.
  absl::Status CheckResume(const JoinParams& params, const std::optional<v1::JoinResponse>& current,
                           const GenerationState& state) const;
  // The embedded leader's JudgeRoundLocked on etcd: nullopt while a member
  // of `aborted` is undecided, else the round's outcome (the survivors'
  // generation, or an error for every one of them).
  absl::StatusOr<std::optional<v1::JoinResponse>> JudgeResume(
      const v1::JoinResponse& aborted, const GenerationState& state,
      const std::map<int, v1::JoinRequest>& joins) ABSL_LOCKS_EXCLUDED(mu_);
  // The members of `aborted` JudgeResume has not decided yet whose daemon
  // refuses connections (probed now, liveness_probe.h), with the reason.
  std::map<int, std::string> ProbeUndecided(const v1::JoinResponse& aborted,
                                            const GenerationState& state,
                                            const std::map<int, v1::JoinRequest>& joins);
  // The silent members of `current` (not acknowledging its abort) whose
  // daemon refuses connections: recorded by another survivor, or probed
  // here (each at most every kReprobeEvery).
  std::set<int> ProbeSilent(const v1::JoinResponse& current, const GenerationState& state, int rank)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Logs `peer` dead by refusal and records it (ROOT/gen/<g>/dead/<rank>).
  void MarkRefused(uint64_t generation, const v1::Peer& peer);
  // `previous`: the generation this one follows (its members going on keep
  // their rank offsets, rank_offsets.h); nullptr for a fresh job.
  v1::JoinResponse MakeGeneration(const std::map<int, v1::JoinRequest>& joins, uint64_t target,
                                  uint64_t start_iteration,
                                  const v1::JoinResponse* previous = nullptr) const;
  // What a decided round means for this node: its generation, its error,
  // or STATE when the survivors re-formed without it.
  absl::StatusOr<JoinStep> FromOutcome(const v1::JoinResponse& outcome, const JoinParams& params);
  // Makes a decided round current (a failed one aborted first).
  absl::Status RecordOutcome(const v1::JoinResponse& outcome);
  // Writes round `outcome.generation()`'s outcome unless another node did
  // first; the outcome that stands. A generation that forms takes the held
  // config change (ROOT/config_held) as its version 1, at iteration
  // starts_at + kHeldConfigAfter, in the same transaction.
  absl::StatusOr<v1::JoinResponse> DecideRound(v1::JoinResponse outcome, uint64_t starts_at)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ConfigTarget> ReadConfigTarget();
  // One try at appending to `target`'s log; nullopt when another node
  // changed it first. `grow`: the grow entry, which also creates
  // ROOT/gen/<g>/grow (and fails once it exists).
  absl::StatusOr<std::optional<EtcdConfigEntry>> TryAppendConfig(
      const ConfigTarget& target, uint64_t min_at_iteration,
      const std::function<std::string(const EtcdConfigEntry&)>& value, bool grow = false);
  // One try at holding `record` while `target` is not active; false when
  // ROOT/current changed or the next round was decided first.
  absl::StatusOr<bool> TryHoldConfig(const ConfigTarget& target, const std::string& record);
  // Moves ROOT/current to `formed` unless it is there or past it.
  absl::Status AdvanceCurrent(const v1::JoinResponse& formed);
  // Join's rounds until one formed with this node (its result) or
  // `deadline` passed (nullopt, with the last step seen and the last etcd
  // error, OK when etcd answered); an error etcd answered ends it at once.
  absl::StatusOr<std::optional<JoinResult>> JoinUntil(const JoinParams& params, absl::Time deadline,
                                                      JoinStep* last, absl::Status* last_error);
  std::string JoinTimeoutMessage(const JoinStep& step, int num_nodes, absl::Duration timeout);
  // ROOT/current and its mod_revision (0 when absent).
  absl::StatusOr<std::optional<v1::JoinResponse>> ReadCurrent(int64_t* mod_revision);
  absl::StatusOr<GenerationState> ReadGeneration(uint64_t generation);
  // Ends `generation` with `reason` unless it ended already (one
  // transaction creating ROOT/gen/<g>/abort) and notes locally that it
  // ended; the reason that stands. A node's reported error `cause` (not OK)
  // goes into ROOT/gen/<g>/abort_error in that same transaction, so that
  // every node that reads the abort reads its code too.
  absl::StatusOr<std::string> AbortGeneration(uint64_t generation, const std::string& reason,
                                              const absl::Status& cause = absl::OkStatus())
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<HeartbeatResult> ReadHeartbeat(const HeartbeatParams& params)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ReadHeartbeat with its etcd calls ending within one call budget in all.
  absl::StatusOr<HeartbeatResult> ReadHeartbeatBounded(const HeartbeatParams& params)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The first member of `current` whose lease is gone, with the reason.
  std::optional<std::string> DeadMemberReason(const v1::JoinResponse& current,
                                              const std::set<int>& alive) const;
  // DeadMemberReason, where at a grow boundary a member whose Join of the
  // next round is in etcd is alive (its old lease may be gone).
  absl::StatusOr<std::optional<std::string>> DeadMember(const v1::JoinResponse& current,
                                                        const GenerationState& state);
  // Whether the job re-forms at a death (--min-nodes below --num-nodes).
  bool Elastic(int num_nodes) const;
  // The node ranks a Join may name: [0, --max-nodes).
  int MaxNodes(int num_nodes) const;
  // `message` (EtcdClient's) without its leading "etcd at ...: ": the
  // errors that quote it name etcd once, themselves.
  std::string WithoutEtcdPrefix(absl::string_view message) const;
  uint64_t Changes() ABSL_LOCKS_EXCLUDED(mu_);
  // Until the watch reports a change after `seen`, or `until` (monotonic).
  void AwaitChange(uint64_t seen, absl::Time until) ABSL_LOCKS_EXCLUDED(mu_);
  void OnWatchEvents() ABSL_LOCKS_EXCLUDED(mu_);

  const EtcdRendezvousOptions options_;
  const std::unique_ptr<EtcdClient> client_;
  const std::string root_;

  MonotonicMutex session_mu_;  // one EnsureSession at a time
  MonotonicMutex mu_;
  bool session_ ABSL_GUARDED_BY(mu_) = false;
  EtcdLease lease_ ABSL_GUARDED_BY(mu_);
  absl::Status lease_lost_ ABSL_GUARDED_BY(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t joined_target_ ABSL_GUARDED_BY(mu_) = 0;   // the round this node's join key is in
  bool joined_joining_ ABSL_GUARDED_BY(mu_) = false;  // with a joining key of target-1
  bool retired_ ABSL_GUARDED_BY(mu_) = false;         // Retire(): the lease outlives it
  std::map<uint64_t, absl::Time> round_started_ ABSL_GUARDED_BY(mu_);  // when it joined each
  std::string host_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> aborted_ ABSL_GUARDED_BY(mu_);                 // generations known to be over
  std::set<uint64_t> acked_ ABSL_GUARDED_BY(mu_);                   // aborts this node acknowledged
  std::map<uint64_t, absl::Time> abort_seen_ ABSL_GUARDED_BY(mu_);  // when first read here
  absl::Time last_ok_ ABSL_GUARDED_BY(mu_);  // last heartbeat read that succeeded
  // When this node last probed a member: (generation, node rank) -> time.
  std::map<std::pair<uint64_t, int>, absl::Time> probed_ ABSL_GUARDED_BY(mu_);
  HeartbeatResult last_result_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<EtcdLeaseKeeper> keeper_;  // set once under session_mu_
  std::unique_ptr<EtcdWatch> watch_;         // set once under session_mu_
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_RENDEZVOUS_H_
