// Client::Broadcast: gs_broadcast's trainer side. The bytes travel through
// the daemon's staging in pieces (daemon/engine/broadcaster.h,
// local.proto's BroadcastRequest): the root copies each piece in, the
// others copy it out; one Broadcast RPC per piece orders the two. Host
// buffers go through the job's staging segment (memcpy); device buffers
// (a job with CUDA gradients) through device staging on the trainer's GPU
// (device-to-device copies on its stream, synchronized before each call).
#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/cuda_tensors.h"
#include "common/status_code.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// Beyond the daemon's own bounds (the wait for the other trainers, a
// cross-node piece's collective), so that the daemon's error, which names
// the culprit, arrives first.
constexpr int64_t kBroadcastGraceMs = 5000;

}  // namespace

absl::StatusOr<bool> Client::BroadcastOnDevice(const void* buffer, size_t bytes) const {
  // A host-only job cannot hold device buffers we could tell apart without
  // loading CUDA: its buffers are host memory.
  if (!cuda_ || bytes == 0) return false;
  absl::StatusOr<gpu::DeviceId> where = cuda_->device().DeviceOfPointer(buffer);
  if (absl::IsNotFound(where.status())) return false;
  if (!where.ok()) {
    return MakeError(v1::INTERNAL, absl::StrCat("rank ", rank_,
                                                ": gs_broadcast could not tell "
                                                "whether its buffer is device memory: ",
                                                where.status().message()));
  }
  if (*where != cuda_->device_id()) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat("rank ", rank_, ": gs_broadcast of device memory on GPU ", *where,
                                  ", but this trainer's gradients are on GPU ", cuda_->device_id(),
                                  ": broadcast a buffer on that GPU"));
  }
  return true;
}

absl::Status Client::BroadcastStep(const BroadcastCall& call, uint64_t k,
                                   v1::BroadcastResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(call.wait_ms + 2 * daemon_timeout_ms_ + kBroadcastGraceMs));
  v1::BroadcastRequest req;
  req.set_session_id(session_);
  req.set_bytes(call.bytes);
  req.set_root_rank(call.root_rank);
  req.set_step(k);
  req.set_timeout_ms(call.wait_ms);
  req.set_device(call.device);
  if (k == 0 && call.fused_slot >= 0)
    req.set_fused_slot(static_cast<uint32_t>(call.fused_slot) + 1);
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
}

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
  BroadcastCall call;
  call.bytes = bytes;
  call.root_rank = root_rank;
  call.wait_ms = timeout_ms > 0 ? timeout_ms : daemon_timeout_ms_;
  ASSIGN_OR_RETURN(call.device, BroadcastOnDevice(buffer, bytes));
  // Each restart follows a death of the catch-up root's node: at most one
  // per node of the job, bounded here by the ranks.
  for (int runs = 0; runs <= std::max(world_size_, 1); ++runs) {
    int restart_from = -1;
    RETURN_IF_ERROR(BroadcastFrom(call, static_cast<uint8_t*>(buffer), &restart_from));
    if (restart_from < 0) return absl::OkStatus();
    // Later readers of gs_job_info.catch_up_root get the live root.
    if (call.root_rank == catch_up_root_) catch_up_root_ = restart_from;
    call.root_rank = restart_from;
    broadcast_free_slot_ = -1;  // which slot the abandoned run left busy is unknown
  }
  return Failed(MakeError(v1::INTERNAL, absl::StrCat("rank ", rank_,
                                                     ": gs_broadcast was restarted from a new "
                                                     "catch-up root more times than the job has "
                                                     "ranks")));
}

absl::Status Client::BroadcastFrom(BroadcastCall call, uint8_t* data, int* restart_from) {
  const uint64_t bytes = call.bytes;
  const bool root = call.root_rank == rank_;
  call.fused_slot = FusedSlot(call);
  if (call.fused_slot >= 0 && root) {
    std::memcpy(static_cast<uint8_t*>(broadcast_segment_.data()) +
                    static_cast<uint64_t>(call.fused_slot) * broadcast_piece_bytes_,
                data, bytes);
  }
  // An error the daemon answers has failed the job (or concerned this call
  // alone): the job's error reaches gs_wait through the rings as well.
  v1::BroadcastResponse begin;
  RETURN_IF_ERROR(BroadcastStep(call, 0, &begin));
  *restart_from = begin.restart_from_root() - 1;
  if (*restart_from >= 0) return absl::OkStatus();
  if (begin.fused()) return FinishFused(call, begin, data, root);
  const uint64_t piece = begin.piece_bytes();
  if (bytes == 0) return absl::OkStatus();
  if (piece == 0) {
    return Failed(MakeError(v1::INTERNAL, "gs_broadcast: the daemon answered no piece size"));
  }
  uint8_t* slots = nullptr;
  if (call.device) {
    ASSIGN_OR_RETURN(slots, MapDeviceSlots(begin));
  } else {
    ASSIGN_OR_RETURN(slots, MapHostSlots(begin));
  }
  const uint64_t pieces = (bytes + piece - 1) / piece;
  for (uint64_t k = 0; k < pieces; ++k) {
    const uint64_t offset = k * piece;
    const uint64_t len = std::min<uint64_t>(piece, bytes - offset);
    uint8_t* slot = slots + (k % 2) * piece;
    if (root) RETURN_IF_ERROR(CopyPiece(call, slot, data + offset, len));
    v1::BroadcastResponse resp;
    RETURN_IF_ERROR(BroadcastStep(call, k + 1, &resp));
    *restart_from = resp.restart_from_root() - 1;
    if (*restart_from >= 0) return absl::OkStatus();
    if (!root) RETURN_IF_ERROR(CopyPiece(call, data + offset, slot, len));
  }
  if (!call.device) {
    broadcast_piece_bytes_ = piece;
    broadcast_free_slot_ = static_cast<int>(pieces % 2);  // the last piece went through the other
  }
  return absl::OkStatus();
}

int Client::FusedSlot(const BroadcastCall& call) const {
  if (call.device || call.bytes == 0 || call.bytes > broadcast_piece_bytes_ ||
      !broadcast_segment_.valid() || broadcast_free_slot_ < 0) {
    return -1;
  }
  return broadcast_free_slot_;
}

absl::Status Client::FinishFused(const BroadcastCall& call, const v1::BroadcastResponse& begin,
                                 uint8_t* data, bool root) {
  // The daemon moved the slot this trainer asked for, in the segment it mapped.
  if (call.fused_slot < 0 || begin.segment_name() != broadcast_segment_.name()) {
    return Failed(MakeError(v1::INTERNAL,
                            "gs_broadcast: the daemon answered a fused broadcast this trainer "
                            "did not ask for"));
  }
  const uint8_t* slot = static_cast<const uint8_t*>(broadcast_segment_.data()) +
                        static_cast<uint64_t>(call.fused_slot) * broadcast_piece_bytes_;
  if (!root) std::memcpy(data, slot, call.bytes);
  broadcast_free_slot_ = 1 - call.fused_slot;
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> Client::MapHostSlots(const v1::BroadcastResponse& begin) {
  const uint64_t piece = begin.piece_bytes();
  if (begin.segment_bytes() < 2 * piece) {
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
  return static_cast<uint8_t*>(broadcast_segment_.data());
}

absl::StatusOr<uint8_t*> Client::MapDeviceSlots(const v1::BroadcastResponse& begin) {
  absl::StatusOr<uint8_t*> slots = cuda_->BroadcastSlots(begin.device_handle());
  if (!slots.ok()) {
    return Failed(
        MakeError(CodeOf(slots.status()) == v1::OK ? v1::INTERNAL : CodeOf(slots.status()),
                  absl::StrCat("rank ", rank_, ": gs_broadcast: ", slots.status().message())));
  }
  return *slots;
}

absl::Status Client::CopyPiece(const BroadcastCall& call, uint8_t* to, const uint8_t* from,
                               uint64_t len) {
  if (!call.device) {
    std::memcpy(to, from, len);
    return absl::OkStatus();
  }
  // On the trainer's stream, after its earlier work on the buffer; done
  // before the next call, so the daemon and the other trainers never wait
  // on this trainer's device work.
  gpu::TrainerDevice& device = cuda_->device();
  absl::Status st = device.CopyAsync(to, from, len, cuda_->stream());
  if (st.ok()) {
    st = device.SynchronizeStream(cuda_->device_id(), cuda_->stream(),
                                  absl::Milliseconds(call.wait_ms));
  }
  if (st.ok()) return st;
  return Failed(MakeError(CodeOf(st) == v1::OK ? v1::INTERNAL : CodeOf(st),
                          absl::StrCat("rank ", rank_, ": gs_broadcast's device copy on ",
                                       cuda_->device_id(), ": ", st.message())));
}

}  // namespace gradsync
