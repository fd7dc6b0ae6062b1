// Client::Broadcast: gs_broadcast's trainer side. The bytes travel through
// the daemon's staging segment in pieces (daemon/engine/broadcaster.h,
// local.proto's BroadcastRequest): the root copies each piece in, the
// others copy it out; one Broadcast RPC per piece orders the two.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status_code.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// Beyond the daemon's own bounds (the wait for the other trainers, a
// cross-node piece's collective), so that the daemon's error, which names
// the culprit, arrives first.
constexpr int64_t kBroadcastGraceMs = 5000;

}  // namespace

absl::Status Client::Broadcast(void* buffer, size_t bytes, int root_rank, int64_t timeout_ms) {
  RETURN_IF_ERROR(CheckUsable());
  RETURN_IF_ERROR(CheckNotJoined("gs_broadcast"));
  if (marked_count_ != 0) {
    return MakeError(v1::STATE,
                     absl::StrCat("rank ", rank_, " (local ", local_rank_,
                                  "): gs_broadcast must be called between iterations (",
                                  marked_count_, " tensors are marked; call gs_wait first)"));
  }
  if (bytes != 0 && buffer == nullptr) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat("rank ", rank_, ": gs_broadcast of ", bytes, " bytes from NULL"));
  }
  const int64_t wait_ms = timeout_ms > 0 ? timeout_ms : daemon_timeout_ms_;
  auto step = [&](uint64_t k, v1::BroadcastResponse* resp) -> absl::Status {
    grpc::ClientContext ctx;
    ctx.set_deadline(
        std::chrono::system_clock::now() +
        std::chrono::milliseconds(wait_ms + 2 * daemon_timeout_ms_ + kBroadcastGraceMs));
    v1::BroadcastRequest req;
    req.set_session_id(session_);
    req.set_bytes(bytes);
    req.set_root_rank(root_rank);
    req.set_step(k);
    req.set_timeout_ms(wait_ms);
    const grpc::Status s = stub_->Broadcast(&ctx, req, resp);
    if (s.ok()) return FromProto(resp->error());
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return Failed(MakeError(v1::TIMEOUT, absl::StrCat("gs_broadcast timed out waiting for "
                                                        "gradsyncd (pid ",
                                                        daemon_pid_, ") at ", socket_path_)));
    }
    return Failed(MakeError(
        v1::PEER_FAILED,
        absl::StrCat("gs_broadcast failed: lost the connection to gradsyncd (pid ", daemon_pid_,
                     ") at ", socket_path_, ": the daemon died (", s.error_message(), ")")));
  };
  // An error the daemon answers has failed the job (or concerned this call
  // alone): the job's error reaches gs_wait through the rings as well.
  v1::BroadcastResponse begin;
  RETURN_IF_ERROR(step(0, &begin));
  const uint64_t piece = begin.piece_bytes();
  if (bytes == 0) return absl::OkStatus();
  if (piece == 0 || begin.segment_bytes() < 2 * piece) {
    return Failed(MakeError(v1::INTERNAL, "gs_broadcast: the daemon answered no staging segment"));
  }
  if (!broadcast_segment_.valid() || broadcast_segment_.name() != begin.segment_name()) {
    // Owned by the daemon we verified, like every segment we map.
    auto seg = ipc::SharedSegment::Open(begin.segment_name(), 0660, daemon_uid_);
    if (!seg.ok()) return Failed(MakeError(v1::INTERNAL, seg.status().ToString()));
    if (seg->size() < 2 * piece) {
      return Failed(MakeError(v1::INTERNAL, "gs_broadcast: the staging segment is too small"));
    }
    broadcast_segment_ = std::move(*seg);
  }
  uint8_t* const slots = static_cast<uint8_t*>(broadcast_segment_.data());
  uint8_t* const data = static_cast<uint8_t*>(buffer);
  const bool root = root_rank == rank_;
  const uint64_t pieces = (bytes + piece - 1) / piece;
  for (uint64_t k = 0; k < pieces; ++k) {
    const uint64_t offset = k * piece;
    const uint64_t len = std::min<uint64_t>(piece, bytes - offset);
    uint8_t* slot = slots + (k % 2) * piece;
    if (root) std::memcpy(slot, data + offset, len);
    v1::BroadcastResponse resp;
    RETURN_IF_ERROR(step(k + 1, &resp));
    if (!root) std::memcpy(data + offset, slot, len);
  }
  return absl::OkStatus();
}

}  // namespace gradsync
