// RendezvousClient: a thin synchronous client of the leader's
// gradsync.v1.Rendezvous service (rendezvous_service.h).
//
// Every call has a deadline: the RPC timeout, or for the blocking calls
// (Join, Wait) their own timeout plus a margin so that the leader's TIMEOUT
// answer, which names what was missing, arrives before the transport gives
// up. A response's Error becomes an absl::Status with its message and its
// exact gradsync code (proto/status_code.h); a transport failure becomes
// kUnavailable (kDeadlineExceeded past the deadline) naming the leader;
// the leader's refusals keep their gRPC code: kUnauthenticated (no or a
// wrong token) and kResourceExhausted (a store bound), with its message.
// The job token travels as call metadata (common/call_token.h), in clear
// unless `credentials` are TLS.
// Every request after a successful Join carries the leader incarnation that
// Join returned: a leader that restarted since refuses it (STATE) instead of
// reading it as a request for its own generation of the same number.
// Thread-safe: a heartbeat thread and Gloo's store may share one client.
#ifndef GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_CLIENT_H_
#define GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/job_rendezvous.h"
#include "gradsync/v1/rendezvous.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"

namespace gradsync {

struct RendezvousClientOptions {
  std::string leader;  // HOST:PORT of the leader's listen port
  std::string job_id;
  std::string job_token;  // sent as call metadata; empty: none
  // How to reach the leader (common/tls_credentials.h); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  absl::Duration rpc_timeout = absl::Seconds(10);  // non-blocking calls
};

class RendezvousClient final : public JobRendezvous {
 public:
  // Over a channel to options.leader with options.credentials (created
  // lazily by gRPC, so this cannot fail; an unreachable leader, or a failed
  // TLS handshake, shows up in the first call).
  static std::unique_ptr<RendezvousClient> Connect(RendezvousClientOptions options);

  RendezvousClient(std::shared_ptr<grpc::Channel> channel, RendezvousClientOptions options);

  // Blocks until every node has joined (or params.timeout, which must be
  // positive, passes: TIMEOUT naming the missing node ranks).
  absl::StatusOr<JoinResult> Join(const JoinParams& params) override;
  absl::Status Set(std::string_view key, std::string_view value) override;
  // nullopt when the key is not set.
  absl::StatusOr<std::optional<std::string>> Get(std::string_view key) override;
  // Blocks until every key is set; TIMEOUT (after `timeout`, which must be
  // positive) names the missing keys.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  // One Wait answered with the values (a Get each for any the leader left
  // out: over its size bound, or a leader that does not send them).
  absl::StatusOr<std::map<std::string, std::string>> WaitForValues(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  // The same, plus the values of `read_keys` that are set (not waited for;
  // one that is not set is absent from the answer).
  absl::StatusOr<std::map<std::string, std::string>> WaitForValues(
      const std::vector<std::string>& keys, const std::vector<std::string>& read_keys,
      absl::Duration timeout) override;
  absl::StatusOr<HeartbeatResult> Heartbeat(const HeartbeatParams& params) override;
  // generation 0: the current one.
  absl::Status Leave(int node_rank, uint64_t generation, std::string_view reason) override;
  absl::Status Depart(int node_rank, uint64_t generation, std::string_view reason) override;

  const std::string& leader() const { return options_.leader; }
  std::string Describe() const override;
  bool embedded() const override { return true; }
  // The channel's connectivity: true once it is not READY (the leader's
  // daemon closed the connection, or it is being re-established).
  bool AwaitLeaderConnectionDown(absl::Duration limit) override;
  // The leader incarnation of the last successful Join; 0 before one.
  uint64_t incarnation() const { return incarnation_.load(std::memory_order_acquire); }

 private:
  void PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const;
  absl::Status TransportError(const char* rpc, const grpc::Status& status) const;
  absl::Status CallWait(const std::vector<std::string>& keys,
                        const std::vector<std::string>& read_keys, absl::Duration timeout,
                        bool return_values, v1::WaitResponse* response);
  // Leave and Depart: one RPC, `departing` telling them apart.
  absl::Status SendLeave(int node_rank, uint64_t generation, std::string_view reason,
                         bool departing);

  const RendezvousClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Rendezvous::Stub> stub_;
  std::atomic<uint64_t> incarnation_{0};
};

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_CLUSTER_RENDEZVOUS_CLIENT_H_
