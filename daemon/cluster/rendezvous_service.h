// RendezvousService: the leader-hosted gradsync.v1.Rendezvous service.
//
// It owns the job's membership and its life cycle:
// - Join: a round collects one Join per node rank; when all num_nodes have
//   joined, the round forms the next generation (1, 2, ...) and every Join
//   returns it with the peers ordered by node rank. A Join that waits past
//   its timeout gets TIMEOUT naming the missing node ranks and leaves the
//   round. While a generation is active (formed, not aborted) its members
//   cannot join again: a restarted node re-joins once the generation aborts.
// - Abort: a node that reports an error in Heartbeat, calls Leave, or stops
//   heart-beating for longer than the heartbeat timeout aborts the current
//   generation (a Leave with `departing`, a daemon shutting down, also
//   marks the node departed: Heartbeat answers name it so, and an elastic
//   re-formation counts it out at once); every Heartbeat then answers abort=true with the reason
//   and the members not heard from since (a dead node stays among them), and the nodes Join again
//   to form generation+1 (warm restart).
// - Liveness probes: while a generation is aborted, the listen address each
//   member sent in its Join (JoinRequest.listen_address) is probed off the
//   lock (liveness_probe.h); one that refuses connections is dead at once:
//   Heartbeat answers mark it so and a re-formation counts it out without
//   waiting out its silence. A probe that times out proves nothing.
// - Incarnation: a random id drawn (getrandom) when the service starts and
//   returned by Join. Generations restart at 1 with a new leader, so every
//   later request names (incarnation, generation); one naming another
//   incarnation is refused with STATE and touches nothing (a stale Leave of
//   the previous leader's generation 1 cannot abort this leader's).
// - A key-value store (Set/Get/Wait) backing Gloo's rendezvous. Keys under
//   GenerationKeyPrefix(g) (rendezvous_keys.h) are scoped to generation g:
//   refused once g is over, discarded when a newer generation forms, and a
//   Wait on them ends with PEER_FAILED when g aborts. What a client may
//   store is bounded (RendezvousStoreLimits).
//
// Every call needs the job token in its metadata or a verified TLS client
// certificate (daemon/auth/call_auth.h): without, gRPC status
// UNAUTHENTICATED naming the RPC. A Set over a store bound gets gRPC status
// RESOURCE_EXHAUSTED naming the key and the bound. Every other failure is
// returned in the response's Error (gradsync.v1.Code); the gRPC status is
// otherwise only non-OK when the call was cancelled. Refusals are logged
// (spdlog, key=value); the job token never is. Heartbeat deadlines are
// checked on every RPC and by GetStatus(), so no thread is needed. Every
// timeout and the heartbeat staleness are measured on the service's clock,
// monotonic by default: a step of the wall clock neither ages nor rejuvenates
// a member.
//
// Threads: every method is thread-safe (gRPC handler threads, the hosting
// daemon). mu_ guards all state; blocked Join and Wait calls sleep on
// `changed_`.
#ifndef GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_SERVICE_H_
#define GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/monotonic.h"
#include "common/monotonic_mutex.h"
#include "daemon/auth/call_auth.h"
#include "daemon/cluster/liveness_probe.h"
#include "daemon/cluster/rendezvous_keys.h"
#include "gradsync/v1/rendezvous.grpc.pb.h"

namespace gradsync {

// A point-in-time view for the daemon's stats.
struct RendezvousStatus {
  struct Node {
    int node_rank = 0;
    std::string host;
    int local_size = 0;
    uint64_t iteration = 0;             // last iteration the node reported
    int64_t last_launched_bucket = -1;  // -1: none in flight
    uint64_t heartbeats = 0;            // heartbeats received this generation
    absl::Time last_seen;  // last Heartbeat or the formation time, on the service's clock
  };
  uint64_t generation = 0;  // last formed generation; 0: none yet
  bool aborted = false;     // the current generation was aborted
  std::string abort_reason;
  int num_nodes = 0;
  int world_size = 0;                   // trainers of the current generation
  std::vector<Node> nodes;              // members of the current generation
  std::vector<int> pending_node_ranks;  // nodes waiting in Join for the next one
  uint64_t config_version = 0;
  uint64_t incarnation = 0;
  int blocked_waits = 0;  // Wait calls blocked on missing keys right now
};

// The most trainers one node may announce in Join; a larger local_size is
// refused (INVALID_ARGUMENT naming the node) rather than trusted.
inline constexpr int kMaxJoinLocalSize = 1024;
// The longest JoinRequest.listen_address accepted (a DNS name and a port).
inline constexpr size_t kMaxJoinListenAddressBytes = 300;

// What clients may store in the leader's memory. Over a bound, Set fails
// RESOURCE_EXHAUSTED naming the key and the bound; nothing is allocated.
struct RendezvousStoreLimits {
  // The largest real value is a node's layout (a RegisterRequest). Trainers
  // send it over the Local socket, whose gRPC message limit is 4 MiB, so
  // every layout a node can hold fits.
  size_t max_value_bytes = size_t{4} << 20;
  size_t max_key_bytes = 512;
  // Keys of one generation: a handful per node (layout, Gloo addresses, GPU
  // counts) plus a few for the job. 0: 64 + 16 per node.
  size_t max_keys_per_generation = 0;
  // Keys outside any generation (config/<version>); they live for the job.
  size_t max_job_wide_keys = 1024;
  // Keys plus values, everything the store holds.
  size_t max_total_bytes = size_t{256} << 20;
};

// The --listen server's receive limit: a Set of the largest value plus its
// key and framing, so the store's bound, not gRPC's, answers an oversized Set.
inline constexpr int kMaxRendezvousMessageBytes = (4 << 20) + (64 << 10);

// The most key and value bytes a Wait answers with (WaitRequest.return_values):
// well inside a client's default 4 MiB receive limit; the caller gets the rest.
inline constexpr size_t kMaxWaitValuesBytes = size_t{1} << 20;

class RendezvousService final : public v1::Rendezvous::Service {
 public:
  // `auth`: who may call (the job token, TLS client certificates).
  // `default_timeout`: how long Join and Wait block when the request gives no
  // timeout. `heartbeat_timeout`: silence after which a member is declared
  // dead (absl::InfiniteDuration() disables the check). `clock`: what "now"
  // is for every timeout and staleness check; tests inject one to move time
  // without waiting. `limits`: what clients may store.
  RendezvousService(std::string job_id, CallAuth auth, int num_nodes,
                    absl::Duration default_timeout,
                    absl::Duration heartbeat_timeout = absl::Seconds(30),
                    MonotonicClock clock = MonotonicNow, RendezvousStoreLimits limits = {});
  ~RendezvousService() override;

  RendezvousService(const RendezvousService&) = delete;
  RendezvousService& operator=(const RendezvousService&) = delete;

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Set(grpc::ServerContext* context, const v1::SetRequest* request,
                   v1::SetResponse* response) override ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Get(grpc::ServerContext* context, const v1::GetRequest* request,
                   v1::GetResponse* response) override ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::WaitResponse* response) override ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                     v1::LeaveResponse* response) override ABSL_LOCKS_EXCLUDED(mu_);

  // Aborts `generation` if it is the current, active one (the hosting daemon
  // saw a failure itself). Returns whether it did.
  bool AbortGeneration(uint64_t generation, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);

  // The active generation's job-wide config log. Appends the next version
  // (1, 2, ...; heartbeat answers carry the newest, and nodes fetch every
  // version they have not applied, in order), switching at iteration
  // max(min_at_iteration, the previous version's + 1). `write` makes the
  // entry's key and value from the three numbers; only the last
  // kConfigLogKeep (rendezvous_keys.h) entries are kept (a node further behind fails on the
  // gap). STATE when no generation is active.
  struct ConfigEntry {
    uint64_t generation = 0;
    uint64_t version = 0;
    uint64_t at_iteration = 0;
  };
  using ConfigWriter = std::function<std::pair<std::string, std::string>(const ConfigEntry& entry)>;
  absl::StatusOr<ConfigEntry> AppendConfig(uint64_t min_at_iteration, const ConfigWriter& write)
      ABSL_LOCKS_EXCLUDED(mu_);
  // An operator's change (Control.SetConfig on the leader): appended as
  // AppendConfig does while a generation is active. Otherwise (none formed
  // yet, or the last one aborted) `write` is held, replacing any change held
  // before, and becomes version 1 of the next generation as it forms, at
  // iteration kHeldConfigAfter past the one that generation starts in (0,
  // or the iteration survivors resume): a node may have read the old caps
  // for its Join already, so the change must come through the log to reach
  // every node at one boundary. Returns the entry, or nullopt when held.
  std::optional<ConfigEntry> AppendOrHoldConfig(uint64_t min_at_iteration, ConfigWriter write)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same on the leader and on etcd (rendezvous_keys.h).
  static constexpr uint64_t kHeldConfigAfter = ::gradsync::kHeldConfigAfter;

  // Stall reports nodes sent with their heartbeats, newest last:
  // "node_rank=N (host=H) iteration=I: <report>".
  std::vector<std::string> RecentStallReports() ABSL_LOCKS_EXCLUDED(mu_);

  // Stores a job-wide key from the hosting daemon itself (no RPC).
  void SetKey(const std::string& key, const std::string& value) ABSL_LOCKS_EXCLUDED(mu_);

  RendezvousStatus GetStatus() ABSL_LOCKS_EXCLUDED(mu_);

  // This run's id (never 0), as Join returns it.
  uint64_t incarnation() const { return incarnation_; }

  // Elastic jobs (--min-nodes < --num-nodes): an aborted generation whose
  // survivors join again with its number (JoinRequest.resume_generation)
  // re-forms among them once every member of it has joined or stayed
  // silent past kPresumedDeadAfter (or departed: at once), if at least `min_nodes` joined and all
  // redo the same iteration; otherwise every waiting survivor gets
  // PEER_FAILED naming --min-nodes and the dead node ranks (or the split).
  // Default: num_nodes (a fixed job: every node, every time).
  void set_min_nodes(int min_nodes) ABSL_LOCKS_EXCLUDED(mu_);
  // Elastic jobs: a node that is no member of the running generation (a
  // replacement for a dead node, a restarted one) and joins afresh is held,
  // not refused: the generation's config log gets a grow entry (at an
  // iteration kGrowAfter past the furthest member's), every member leaves
  // the generation at that boundary and joins the next one with it
  // (JoinRequest.resume_generation = the running one), which forms once
  // every member did or is gone (departed, or silent kPresumedDeadAfter);
  // JoinResponse.start_iteration tells everyone the iteration it starts
  // at. A joiner while the survivors of a death re-form waits for the
  // generation they form and joins it at its first grow boundary. Node
  // ranks are below max_nodes (a rank outside is refused naming
  // --max-nodes, so the job never holds more nodes; clamped to
  // [num_nodes, kMaxNodes]): a fresh job forms with any num_nodes of them,
  // and ranks above num_nodes - 1 join it running. Call before the first
  // generation forms (members are indexed by rank). Default: num_nodes.
  void set_max_nodes(int max_nodes) ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kPresumedDeadAfter = absl::Milliseconds(2000);
  // A joiner's grow entry switches this many iterations past the furthest
  // member's last heartbeat (a lower bound: every member switches at the
  // first boundary at or after it where all hold the entry).
  static constexpr uint64_t kGrowAfter = 2;
  static constexpr int kMaxNodes = 4096;  // as --max-nodes
  // A silent member whose probe proved nothing is probed again this often
  // (service clock) while the generation stays aborted.
  static constexpr absl::Duration kReprobeEvery = absl::Milliseconds(250);

 private:
  struct Member {
    std::string host;
    int local_size = 0;
    uint64_t iteration = 0;
    int64_t last_launched_bucket = -1;
    uint64_t heartbeats = 0;
    absl::Time last_seen;
    bool heard_since_abort = false;  // a Heartbeat or Leave after the abort
    // Non-empty: it left the job for good (LeaveRequest.departing), why.
    // Counted out of a re-formation at once, never presumed dead.
    std::string departed;
    bool left = false;           // a Leave of this generation (the job ended here)
    std::string listen_address;  // from its Join; "": never probed
    // Non-empty: a probe after the abort found nothing listening there
    // ("its daemon at HOST:PORT refuses connections"): dead at once.
    std::string refused;
    int rank_offset = 0;         // the global rank of its local rank 0 (rank_offsets.h)
    bool joins_running = false;  // it joined the running job in this generation
    bool probing = false;        // a probe of it is in flight
    absl::Time probed_at = absl::InfinitePast();  // when the last one started
    // Every Join carries local_size >= 1: 0 marks a rank that is not a
    // member of the generation (an elastic job re-formed without it).
    bool member() const { return local_size > 0; }
  };
  struct PendingJoin {
    uint64_t join_id = 0;  // tells a waiter whether its entry is still its own
    std::string host;
    int local_size = 0;
    uint64_t resume_generation = 0;  // elastic re-formation (see set_min_nodes)
    uint64_t resume_iteration = 0;
    std::string listen_address;
    std::string error;  // non-empty: the round failed; the waiter returns it
    // A node joining the running elastic job (not a member of it): held
    // until the members reach the grow entry's boundary (AdmitJoinerLocked).
    bool joins_running = false;
  };
  // What a round of pending Joins does now: wait, form, or fail with `error`.
  struct RoundVerdict {
    bool form = false;
    std::string error;
  };

  bool active() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return generation_ > 0 && !aborted_; }
  // Empty when the job id matches, else the refusal message.
  std::string CheckCredentials(const v1::JobCredentials& job) const;
  // Empty when `incarnation` is this run's or 0 (the sender has not joined
  // yet), else the refusal message naming both.
  std::string CheckIncarnation(uint64_t incarnation) const;
  // Empty when `value` may be stored under `key` now, else the
  // RESOURCE_EXHAUSTED message naming the key and the bound.
  std::string CheckStoreBoundsLocked(const std::string& key, size_t value_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every change to kv_ goes through these two: they keep the counts.
  void StoreLocked(const std::string& key, const std::string& value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops plan stamps no node can still be reading once `key` (a node's
  // plan stamp) is stored: all but that node's two newest.
  void DiscardSettledPlanStampsLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, std::string>::iterator EraseLocked(
      std::map<std::string, std::string>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `cause`: the node error whose report aborts it (none: a death, a Leave).
  void AbortLocked(const std::string& reason, const v1::Error& cause = v1::Error())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // While the generation is aborted: probes (off the lock) the listen
  // address of every member not yet in the re-formation round nor counted
  // out, unless one is in flight or started less than kReprobeEvery ago.
  void ProbeUndecidedMembersLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A probe's outcomes for `ranks` of `generation`: a refusal marks the
  // member refused (dead).
  void OnProbedLocked(uint64_t generation, const std::vector<int>& ranks,
                      const std::vector<ProbeOutcome>& outcomes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (releasing the lock) until no member's probe is in flight, at
  // most a probe's bound: an abort's answer then names what they proved.
  void AwaitProbesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Heartbeat's answer about an aborted generation: the members not heard
  // from since the abort, departed or refusing connections.
  void FillSilentMembersLocked(absl::Time now, v1::HeartbeatResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckHeartbeatsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `with_joiners`: the nodes joining the running job are members too;
  // otherwise they stay pending for the next generation's grow entry.
  void FormGenerationLocked(absl::Time now, bool with_joiners) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the next version of the active generation's log.
  ConfigEntry AppendConfigLocked(uint64_t min_at_iteration, const ConfigWriter& write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillJoinResponseLocked(v1::JoinResponse* response) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Wait asking for values, every key set: their values, then those of
  // the read keys that are set, in the order asked, each that still fits
  // kMaxWaitValuesBytes.
  void FillWaitValuesLocked(const v1::WaitRequest& request, v1::WaitResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh round forms with every node; a re-formation round (some Join
  // resumes the aborted generation) as set_min_nodes says.
  RoundVerdict JudgeRoundLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Leave's work on the generation it names (`departing`: for good).
  void LeaveGenerationLocked(int rank, uint64_t generation, const std::string& reason,
                             bool departing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forms the generation, or hands the round's error to every waiter.
  void SettleRoundLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Nodes wait to join the active generation: it forms the next one once
  // every member left it at the grow entry's boundary (or is dead).
  RoundVerdict JudgeGrowLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Join of a node that is no member of the running elastic job: held
  // until the members reach the grow entry's boundary.
  void HoldJoinerLocked(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends the grow entry to the active generation's log, at an
  // iteration no member has started.
  void ScheduleGrowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh Join of `rank`, a member of the aborted elastic generation
  // (its daemon restarted), while the others may still re-form it: the
  // STATE refusal its daemon retries until they formed (it then joins what
  // they form), else empty.
  std::string CheckRestartedMemberLocked(int rank, const v1::JoinRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A Join joins the running job rather than forming or re-forming it.
  bool JoinsRunningLocked(int rank, const v1::JoinRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty when a resuming Join of `rank` may enter the round, else the
  // STATE refusal message.
  std::string CheckResumeLocked(int rank, const v1::JoinRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty when a Join request is well formed for this job, else the
  // INVALID_ARGUMENT refusal message naming the node and the field.
  std::string CheckJoinRequest(const v1::JoinRequest& request) const;
  // Empty when `rank` may name a node of this job, else the refusal
  // naming the range (and --max-nodes).
  std::string CheckRank(int rank) const;
  // A Join whose node is pending for generation `target` (as `join_id`):
  // waits until the generation forms, the node's entry goes, the call is
  // cancelled or `deadline` passes (TIMEOUT naming the missing nodes).
  grpc::Status AwaitGenerationLocked(grpc::ServerContext* context, int rank, uint64_t join_id,
                                     uint64_t target, absl::Duration timeout, absl::Time deadline,
                                     v1::JoinResponse* response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The nodes that have not joined the pending generation, each with what
  // it reported while forming: "node_rank=N (report), ...".
  std::string MissingNodesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The members of the current generation and the iteration each last
  // reported: "node_rank=N at iteration I, ...".
  std::string MembersLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empty when `key` may be used now, else the STATE refusal message.
  std::string CheckKeyGenerationLocked(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration RequestTimeout(int64_t timeout_ms) const;

  const std::string job_id_;
  const CallAuth auth_;
  const int num_nodes_;
  const RendezvousStoreLimits limits_;
  const absl::Duration default_timeout_;
  const absl::Duration heartbeat_timeout_;
  const MonotonicClock clock_;
  const uint64_t incarnation_;

  MonotonicMutex mu_;
  // Signalled on every change a blocked Join or Wait may be waiting for.
  MonotonicCondVar changed_;
  int min_nodes_ ABSL_GUARDED_BY(mu_);
  int max_nodes_ ABSL_GUARDED_BY(mu_);
  // Node ranks are below it (--max-nodes); read without mu_ by the checks
  // every RPC makes first.
  std::atomic<int> rank_limit_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  v1::Error abort_error_ ABSL_GUARDED_BY(mu_);        // HeartbeatResponse.abort_error
  std::vector<Member> members_ ABSL_GUARDED_BY(mu_);  // by node rank
  std::map<int, PendingJoin> pending_ ABSL_GUARDED_BY(mu_);
  // The active generation's log has a grow entry: its members join the
  // next generation with the held joiners at its boundary.
  bool grow_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t started_at_ ABSL_GUARDED_BY(mu_) = 0;  // the generation's first iteration
  uint64_t next_join_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  size_t kv_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // keys + values
  size_t job_wide_keys_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, size_t> keys_per_generation_ ABSL_GUARDED_BY(mu_);
  // The current generation's config log (reset when one forms).
  uint64_t config_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t config_last_at_ ABSL_GUARDED_BY(mu_) = 0;
  // An operator's change made while no generation was active (empty: none).
  ConfigWriter held_config_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> config_keys_ ABSL_GUARDED_BY(mu_);    // oldest first
  std::deque<std::string> stall_reports_ ABSL_GUARDED_BY(mu_);  // bounded
  int blocked_waits_ ABSL_GUARDED_BY(mu_) = 0;                  // observable (GetStatus)
  // Last: destroyed first, so no probe's outcome arrives at a half-gone
  // service (its callback locks mu_).
  BackgroundProber prober_;
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_SERVICE_H_
