// Client::CheckReplicas: gs_check_replicas's trainer side, one RPC every
// --check-replicas-every iterations (daemon/engine/replica_checker.h).
#include <chrono>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status_code.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// Beyond the daemon's wait for the other trainers, so that its error,
// which names them, arrives first.
constexpr int64_t kCheckGraceMs = 5000;

}  // namespace

absl::Status Client::CheckReplicas(const std::vector<uint64_t>& hashes) {
  RETURN_IF_ERROR(CheckUsable());
  RETURN_IF_ERROR(CheckNotJoined("gs_check_replicas"));
  if (!CheckReplicasDue()) {
    return MakeError(
        v1::STATE,
        absl::StrCat("rank ", rank_, " (local ", local_rank_,
                     "): no replica check is due after iteration ", iteration_,
                     check_replicas_every_ > 0
                         ? absl::StrCat(" (gradsyncd checks every ", check_replicas_every_,
                                        " iterations, once each)")
                         : std::string(" (gradsyncd runs without --check-replicas-every)"),
                     "; call it when gs_job_info.check_replicas_due is set"));
  }
  if (marked_count_ != 0) {
    return MakeError(v1::STATE, absl::StrCat("rank ", rank_, " (local ", local_rank_,
                                             "): gs_check_replicas must be called between "
                                             "iterations (",
                                             marked_count_, " tensors are marked)"));
  }
  if (hashes.size() != layout_.size()) {
    return MakeError(
        v1::INVALID_ARGUMENT,
        absl::StrCat("rank ", rank_, ": gs_check_replicas got ", hashes.size(), " hashes for ",
                     layout_.size(), " registered tensors (one each, in registration order)"));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(daemon_timeout_ms_ + kCheckGraceMs));
  v1::CheckReplicasRequest req;
  req.set_session_id(session_);
  req.set_iteration(iteration_);
  for (uint64_t h : hashes) req.add_hashes(h);
  v1::CheckReplicasResponse resp;
  const grpc::Status s = stub_->CheckReplicas(&ctx, req, &resp);
  checked_iteration_ = iteration_;  // once per due iteration, whatever the outcome
  if (s.ok()) return FromProto(resp.error());
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Failed(MakeError(v1::TIMEOUT, absl::StrCat("gs_check_replicas timed out waiting for "
                                                      "gradsyncd (pid ",
                                                      daemon_pid_, ") at ", socket_path_)));
  }
  return Failed(MakeError(
      v1::PEER_FAILED,
      absl::StrCat("gs_check_replicas failed: lost the connection to gradsyncd (pid ", daemon_pid_,
                   ") at ", socket_path_, ": the daemon died (", s.error_message(), ")")));
}

}  // namespace gradsync
