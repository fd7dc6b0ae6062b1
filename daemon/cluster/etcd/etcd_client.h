// EtcdClient: a small synchronous client of etcd's v3 gRPC API (the protos
// beside this file), the foundation of a rendezvous that lives in etcd
// instead of inside node 0's daemon (EtcdRendezvous, etcd_rendezvous.h).
//
// Endpoints: a list of HOST:PORT members of one etcd cluster. A call goes to
// the member that answered last; when that member is unreachable (or answers
// "no leader" while the cluster elects one) the call moves on to the next
// member, round after round, until its deadline. Each call has a deadline
// (`call_timeout`, or the caller's, whichever comes first), each attempt on
// one member at most `attempt_timeout` of it, so a blackholed member cannot
// eat the whole call. A member that failed an attempt is no longer the one
// calls start at: a dead or blackholed member costs one attempt, not one
// per call. A call that succeeded on another member than the one it started
// at logs one line, `event=etcd_failover from=A to=B op=...`.
//
// Bounds: a call made inside an operation (EtcdOperationDeadline on the
// calling thread: a rendezvous Join, a Wait) ends by that operation's
// deadline too; once the daemon shuts down (EtcdShutdownBudget) by the
// shutdown's one short budget. Which member calls start at lives in an
// EtcdMemberOrder, shared by a daemon's clients so that a client built for
// a re-formation starts where the previous one left off.
//
// Errors: absl::Status whose message starts "etcd " and names the member
// (or, when every member failed, each of them with its last error, and the
// operation or the shutdown whose deadline cut the call):
// kUnavailable when no member answered within the deadline, etcd's own
// gRPC code otherwise (kInvalidArgument for a wrong password, ...).
//
// Security: TLS with an optional client certificate (common/tls_credentials
// files), and etcd's auth: with a user, Connect calls Auth.Authenticate and
// sends the token as the `token` metadata of every call, authenticating
// again once when etcd says the token is no longer valid.
//
// Retries: a call that failed on one member is sent again to the next. A
// write whose first attempt reached etcd but whose answer was lost can thus
// be applied twice; Put is idempotent, and the transaction helpers return
// the key's current record on failure so that a caller can recognise its
// own earlier write (same value).
//
// Thread-safe. Leases are kept alive by EtcdLeaseKeeper (etcd_lease_keeper.h)
// and prefixes watched by EtcdWatch (etcd_watch.h).
#ifndef GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_H_
#define GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls_credentials.h"
#include "daemon/cluster/etcd/etcd_member_order.h"
#include "daemon/cluster/etcd/etcd_shutdown_budget.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace gradsync {

struct EtcdClientOptions {
  std::vector<std::string> endpoints;  // HOST:PORT of etcd's client URLs
  // TLS to etcd (https client URLs): `ca` verifies etcd, `cert`/`key` is
  // this client's certificate for --client-cert-auth. None: plaintext.
  TlsFiles tls;
  // etcd auth; empty user: none.
  std::string user;
  std::string password;
  absl::Duration call_timeout = absl::Seconds(5);     // a whole call, failover included
  absl::Duration attempt_timeout = absl::Seconds(2);  // one member's share of it
  // Where calls start, shared with the daemon's other clients (one per
  // endpoint list); none: the client keeps its own.
  std::shared_ptr<EtcdMemberOrder> member_order;
  // The daemon's shutdown budget; none: calls keep their own bounds.
  std::shared_ptr<EtcdShutdownBudget> shutdown;
};

// One key's record (mvccpb.KeyValue).
struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;  // 0: none
};

// The record of a reply (a read's, a transaction's or a watch event's).
EtcdKeyValue EtcdKeyValueFromProto(const mvccpb::KeyValue& kv);

struct EtcdRange {
  std::vector<EtcdKeyValue> kvs;  // by key
  int64_t revision = 0;           // the store's revision the read saw
};

// A transaction's outcome: whether its compares held, the revision after
// it, and for the helpers below the key's current record when they did not.
struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::optional<EtcdKeyValue> current;
};

// One compare of a transaction: `target` of `key` <op> the number or value.
struct EtcdCompare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue };
  enum class Op { kEqual, kNotEqual, kGreater, kLess };
  std::string key;
  Target target = Target::kVersion;
  Op op = Op::kEqual;
  int64_t number = 0;  // version or revision targets
  std::string value;   // kValue
};

// One operation of a transaction's branch.
struct EtcdTxnOp {
  enum class Kind { kGet, kPut, kDelete };
  Kind kind = Kind::kGet;
  std::string key;
  std::string value;  // kPut
  int64_t lease = 0;  // kPut
};

struct EtcdLease {
  int64_t id = 0;
  absl::Duration ttl;  // as etcd granted it
};

class EtcdClient {
 public:
  // Builds the channels and, with a user, authenticates (within
  // call_timeout). InvalidArgument for options that cannot work (no
  // endpoint, an unreadable TLS file, a password without a user).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(EtcdClientOptions options);

  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // The key's record; nullopt when it does not exist.
  absl::StatusOr<std::optional<EtcdKeyValue>> Get(const std::string& key);
  // Every key that starts with `prefix` (non-empty), by key.
  absl::StatusOr<EtcdRange> GetPrefix(const std::string& prefix);
  // Several keys read at one revision (one transaction of Gets; etcd's
  // --max-txn-ops, 128 by default, bounds how many): each key's record in
  // the order asked, nullopt where it does not exist.
  absl::StatusOr<std::vector<std::optional<EtcdKeyValue>>> GetMany(
      const std::vector<std::string>& keys);
  // Sets the key (attached to `lease` when non-zero); the new revision.
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Removes the key; whether it existed.
  absl::StatusOr<bool> Delete(const std::string& key);
  // Removes every key under `prefix` (non-empty); how many.
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix);

  // A transaction: when every compare holds, `success` runs, else
  // `failure`. When the failure branch ran and is a single Get that found
  // a record, `current` is that record (the helpers below rely on it);
  // otherwise `current` is empty.
  absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                    const std::vector<EtcdTxnOp>& success,
                                    const std::vector<EtcdTxnOp>& failure);
  // Creates the key only if it does not exist; on failure `current` is the
  // record that was there. Of several clients racing, exactly one succeeds.
  absl::StatusOr<EtcdTxnResult> CreateIfAbsent(const std::string& key, const std::string& value,
                                               int64_t lease = 0);
  // Sets the key only if its mod_revision is still `mod_revision` (the one
  // the caller read); on failure `current` is the record now there (absent
  // if the key was deleted).
  absl::StatusOr<EtcdTxnResult> UpdateIfModRevision(const std::string& key,
                                                    const std::string& value, int64_t mod_revision,
                                                    int64_t lease = 0);

  // A lease of (at least, etcd may raise it) `ttl`, rounded up to seconds.
  absl::StatusOr<EtcdLease> GrantLease(absl::Duration ttl);
  // Ends the lease now; its keys are deleted. Tried until `deadline` at
  // most (monotonic; call_timeout bounds it too).
  absl::Status RevokeLease(int64_t id, absl::Time deadline = absl::InfiniteFuture());
  // One keepalive round trip: the lease's renewed TTL. NotFound naming the
  // lease when etcd no longer has it (it expired or was revoked): an answer,
  // never retried. Tried until `deadline` at most, as RevokeLease.
  absl::StatusOr<absl::Duration> KeepAliveOnce(int64_t id,
                                               absl::Time deadline = absl::InfiniteFuture());

  const EtcdClientOptions& options() const { return options_; }
  // "etcd at A,B,C": how errors name the cluster.
  std::string Describe() const;

  // For EtcdWatch: the member to open a stream to next (the last one that
  // answered, then the others in turn), a context carrying the auth token.
  struct Member {
    size_t index = 0;
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
  };
  Member MemberAt(size_t offset) const;
  void PrepareStreamContext(grpc::ClientContext* context) const;
  // A member answered: calls start there from now on.
  void MarkHealthy(size_t index);
  // The member the next call tries first.
  std::string preferred_endpoint() const;

 private:
  explicit EtcdClient(EtcdClientOptions options);

  using Attempt = std::function<grpc::Status(const Member&, grpc::ClientContext*)>;
  // Runs `attempt` on one member after another until it succeeds, fails
  // with an error that another member would give too, or the call's
  // deadline (call_timeout from now, or `deadline` if sooner) passes.
  // `what` names the call in errors and logs ("Range", "Put").
  absl::Status WithFailover(const char* what, const Attempt& attempt,
                            absl::Time deadline = absl::InfiniteFuture());
  // A member failed an attempt: if calls started there, they start at the
  // next member from now on.
  void MarkFailed(size_t index);
  // A call's deadline, and what set it when not the call's own budget (the
  // operation's or the shutdown's words for errors; empty: its own).
  struct CallBound {
    absl::Time deadline;
    std::string cut_by;
    bool shutdown = false;
  };
  // `deadline` (the caller's), call_timeout from `started`, the calling
  // thread's operation's deadline and the shutdown budget: the earliest.
  CallBound BoundOf(absl::Time started, absl::Time deadline) const;
  // The error of a call that no member answered within its `budget`.
  absl::Status AllMembersFailed(const char* what, absl::Duration budget, const CallBound& bound,
                                const std::vector<std::string>& last_error) const;
  absl::Status Authenticate(absl::Time deadline);
  std::string Token() const;

  const EtcdClientOptions options_;
  std::vector<Member> members_;
  std::shared_ptr<EtcdMemberOrder> order_;
  mutable absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

// The end of the range of every key with `prefix`: the prefix with its
// last byte below 0xff incremented ("\0" for all keys when there is none).
std::string EtcdPrefixEnd(const std::string& prefix);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_H_
