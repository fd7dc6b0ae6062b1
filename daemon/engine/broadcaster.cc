#include "daemon/engine/broadcaster.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "ipc/random_segment_name.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

// How often a waiting call looks at its deadline.
constexpr absl::Duration kPoll = absl::Milliseconds(100);

// The cross-node agreement before a broadcast's first piece: a fixed head,
// then per node [bytes + 1, root_rank + 1, holds the root, node rank + 1]
// (after an elastic re-formation slots are places among the members, so
// each names its node rank for the errors). Its length
// differs from the scheduler's per-iteration agreement, so a node that is
// mid-iteration while another broadcasts fails the collective instead of
// reading the other's counts as its own.
constexpr size_t kAgreementHead = 5;
constexpr size_t kAgreementPerNode = 4;

// Test-only (inert unless set): this node holds piece K of its next
// multi-piece host broadcast before the piece's collective, until the file
// named by the second variable exists (at most the timeout), so that a test
// can kill another node while the others wait in that collective. K =
// "agreement": step 0's agreement instead (a root's node that dies before
// its broadcast began).
constexpr char kHoldPiece[] = "GRADSYNC_TEST_HOLD_BROADCAST_PIECE";
constexpr char kHoldUntil[] = "GRADSYNC_TEST_HOLD_BROADCAST_UNTIL";

}  // namespace

Broadcaster::Broadcaster(std::vector<Trainer*> trainers, Backend* backend, FailFn fail,
                         Options options)
    : trainers_(std::move(trainers)), fail_(std::move(fail)), options_(std::move(options)) {
  // The first world: node ranks 0..n-1 in a job that started here; a
  // node that joined a running job starts at its place among the members.
  world_ = World{backend, options_.num_nodes, options_.node_index};
  call_.arrived.assign(trainers_.size(), 0);
  marked_in_.assign(trainers_.size(), 0);
  const char* hold = std::getenv(kHoldPiece);
  uint64_t piece = 0;
  if (hold != nullptr && std::string(hold) == "agreement") {
    piece = kHeldAgreement;
  } else if (hold == nullptr || !absl::SimpleAtoi(hold, &piece)) {
    return;
  }
  hold_piece_plus_one_ = piece + 1;
  const char* until = std::getenv(kHoldUntil);
  hold_until_file_ = until != nullptr ? until : "";
  spdlog::warn("event=test_hook_armed hook={} piece={} until_file={}", kHoldPiece, LogValue(hold),
               LogValue(hold_until_file_));
}

void Broadcaster::MaybeHoldPiece(uint64_t piece) {
  if (hold_piece_plus_one_ != piece + 1) return;
  hold_piece_plus_one_ = 0;  // once: a piece run again is not held
  spdlog::warn("event=test_broadcast_held piece={} until_file={}",
               piece == kHeldAgreement ? std::string("agreement") : std::to_string(piece),
               LogValue(hold_until_file_));
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  while (!hold_until_file_.empty() && access(hold_until_file_.c_str(), F_OK) != 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Broadcaster::~Broadcaster() {
  if (segment_.valid()) ipc::SharedSegment::Remove(segment_.name()).IgnoreError();
}

int Broadcaster::LocalTrainers() const { return static_cast<int>(trainers_.size()); }

int Broadcaster::LiveLocalTrainers() const {
  int live = 0;
  for (const Trainer* t : trainers_) live += t->gone.load() ? 0 : 1;
  return live;
}

std::string Broadcaster::Names(const std::vector<uint8_t>& which) const {
  std::string out;
  for (size_t i = 0; i < trainers_.size() && i < which.size(); ++i) {
    if (!which[i]) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", trainers_[i]->Name());
  }
  return out;
}

uint8_t* Broadcaster::Slot(uint64_t piece) const {
  return static_cast<uint8_t*>(segment_.data()) + (piece % 2) * kPieceBytes;
}

absl::Status Broadcaster::FailJob(const absl::Status& error, int culprit) {
  spdlog::warn("event=broadcast_failed code={} error={}", v1::Code_Name(CodeOf(error)),
               LogValue(error.message()));
  fail_(error, culprit);
  return error;
}

void Broadcaster::Abort(const absl::Status& error) {
  MonotonicMutexLock lock(&mu_);
  if (failed_.ok()) failed_ = error.ok() ? MakeError(v1::INTERNAL, "the job ended") : error;
  cv_.SignalAll();
}

void Broadcaster::ReplaceTrainer(Trainer* fresh) {
  MonotonicMutexLock lock(&mu_);
  const size_t local = static_cast<size_t>(fresh->local_rank);
  if (local < trainers_.size()) trainers_[local] = fresh;
}

void Broadcaster::SetWorld(Backend* backend, int num_nodes, int node_index, uint64_t epoch,
                           bool grown) {
  MonotonicMutexLock lock(&mu_);
  world_ = World{backend, num_nodes, node_index, epoch};
  // The joiners start counting at 0: so do the members (between iterations,
  // no broadcast runs while nodes join).
  if (grown && !busy_) began_ = 0;
  spdlog::info("event=broadcast_world nodes={} node_index={}", num_nodes, node_index);
}

void Broadcaster::StepDone(const Call& call, bool fused) {
  if (call.step == 0) {
    ++began_;
    done_fused_ = fused;
  }
  done_call_ = call;
  const bool last = call.step == Pieces(call.bytes) || (call.step == 0 && fused);
  steps_done_ = last ? 0 : call.step + 1;
}

absl::Status Broadcaster::AwaitResume(Call call, absl::Status failed, bool* collective) {
  while (true) {
    awaiting_ = true;
    failed_call_ = call;
    verdict_ = Verdict::kNone;
    cv_.SignalAll();
    mu_.Unlock();
    spdlog::warn("event=broadcast_interrupted step={} bytes={} root_rank={} error={}", call.step,
                 call.bytes, call.root_rank, LogValue(failed.message()));
    on_world_failure_(call.world.epoch, failed);
    mu_.Lock();
    // The re-formation's own bounds (the rendezvous, the Gloo worker) come
    // first; this only keeps a lost re-formation from hanging the call.
    const absl::Time until = MonotonicNow() + absl::Milliseconds(3 * options_.timeout_ms);
    while (verdict_ == Verdict::kNone && failed_.ok() && MonotonicNow() < until) {
      cv_.WaitWithTimeout(&mu_, kPoll);
    }
    awaiting_ = false;
    *collective = false;
    if (!failed_.ok()) return failed_;
    if (verdict_ == Verdict::kNone) {
      return MakeError(
          v1::TIMEOUT,
          absl::StrCat("gs_broadcast(bytes=", call.bytes, ", root_rank=", call.root_rank,
                       "), step ", call.step,
                       ": a node's failure interrupted it and the survivors did not "
                       "re-form within ",
                       3 * options_.timeout_ms / 1000.0, " s (", failed.message(), ")"));
    }
    if (verdict_ == Verdict::kCompleted) return absl::OkStatus();
    call.world = world_;
    mu_.Unlock();
    absl::Status st = Run(call, collective);
    mu_.Lock();
    if (st.ok()) {
      Settle(call);
      return st;
    }
    if (!*collective) return st;
    failed = st;
  }
}

void Broadcaster::StopAndWait(absl::Duration timeout) {
  MonotonicMutexLock lock(&mu_);
  if (failed_.ok()) failed_ = MakeError(v1::INTERNAL, "the job ended");
  cv_.SignalAll();
  const absl::Time deadline = MonotonicNow() + timeout;
  while (running_ && MonotonicNow() < deadline) cv_.WaitWithTimeout(&mu_, kPoll);
  if (running_) {
    spdlog::error("event=broadcast_still_running timeout_ms={}",
                  absl::ToInt64Milliseconds(timeout));
  }
}

bool Broadcaster::AllowMarks(const Trainer& t) {
  absl::Status refused;
  {
    MonotonicMutexLock lock(&mu_);
    const uint64_t it = scheduler_ != nullptr ? scheduler_->iteration() : 0;
    marked_in_[t.local_rank] = it + 1;
    if (!busy_ || !failed_.ok()) return true;
    const std::string waiting =
        call_.count > 0 ? Names(call_.arrived) : std::string("every other local trainer");
    refused = MakeError(
        v1::STATE,
        absl::StrCat(t.Name(), " marked a gradient of iteration ", it, " while ", waiting,
                     " waits in gs_broadcast: gs_broadcast runs between iterations (after "
                     "gs_wait, before any mark) on every trainer of the job"));
  }
  FailJob(refused).IgnoreError();
  return false;
}

absl::Status Broadcaster::Refusal(const Trainer& caller, uint64_t bytes, int root_rank,
                                  uint64_t step, bool device) {
  const std::string what = absl::StrCat("gs_broadcast(bytes=", bytes, ", root_rank=", root_rank,
                                        device ? ", device memory" : "",
                                        step == 0 ? "" : absl::StrCat(", piece ", step - 1), ")");
  if (root_rank < 0 || root_rank >= options_.world_size) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(), " called ", what, ": the job's ranks are 0..",
                                  options_.world_size - 1));
  }
  if (device && gpu_ == nullptr) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(), " called ", what,
                                  ": device buffers are broadcast only in a job whose gradients "
                                  "are CUDA tensors (this job's are host memory)"));
  }
  const int root_local = root_rank - options_.rank_offset;
  if (root_local >= 0 && root_local < LocalTrainers() && trainers_[root_local]->gone.load()) {
    return MakeError(
        v1::INVALID_ARGUMENT,
        absl::StrCat(caller.Name(), " called ", what, ": ", trainers_[root_local]->Name(),
                     " died, so it has nothing to send (after a trainer's death the "
                     "job's state comes from gs_job_info.catch_up_root)"));
  }
  if (call_.count > 0 && (call_.bytes != bytes || call_.root_rank != root_rank ||
                          call_.step != step || call_.device != device)) {
    return MakeError(
        v1::MISMATCH,
        absl::StrCat("trainers called gs_broadcast differently: ", trainers_[call_.first]->Name(),
                     " with bytes=", call_.bytes, ", root_rank=", call_.root_rank,
                     call_.device ? " (device memory)" : " (host memory)", ", ", caller.Name(),
                     " with bytes=", bytes, ", root_rank=", root_rank,
                     device ? " (device memory)" : " (host memory)"));
  }
  if (call_.arrived[caller.local_rank]) {
    return MakeError(v1::INVALID_ARGUMENT, absl::StrCat(caller.Name(), " called ", what, " twice"));
  }
  if (step == 0 && busy_ && call_.count == 0) {
    return MakeError(v1::INVALID_ARGUMENT, absl::StrCat(caller.Name(),
                                                        " began a gs_broadcast before the last one "
                                                        "ended"));
  }
  if (step > 0 && (!busy_ || step > Pieces(bytes))) {
    return MakeError(v1::INVALID_ARGUMENT,
                     absl::StrCat(caller.Name(), " sent ", what, " outside a broadcast"));
  }
  if (step == 0 && scheduler_ != nullptr && scheduler_->in_iteration()) {
    const uint64_t it = scheduler_->iteration();
    std::vector<uint8_t> marking(trainers_.size(), 0);
    for (size_t i = 0; i < trainers_.size(); ++i) marking[i] = marked_in_[i] == it + 1;
    const std::string who = Names(marking);
    return MakeError(
        v1::STATE,
        absl::StrCat(caller.Name(), " called gs_broadcast while ",
                     who.empty() ? std::string("another trainer") : who, " is in iteration ", it,
                     " (it marked gradients): gs_broadcast runs between iterations (after "
                     "gs_wait, before any mark) on every trainer of the job"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Broadcaster::StepResult> Broadcaster::Step(const Trainer& caller, uint64_t bytes,
                                                          int root_rank, uint64_t step, bool device,
                                                          int fused_slot, absl::Time deadline) {
  const int me = caller.local_rank;
  absl::Status refused;
  {
    MonotonicMutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (me < 0 || me >= LocalTrainers()) return MakeError(v1::INTERNAL, "unknown local rank");
    // The catch-up root's node died: this trainer calls it again from the new root.
    if (RestartRoot(root_rank) >= 0) return Answer(caller, root_rank, step, device);
    const std::string what = absl::StrCat("gs_broadcast(bytes=", bytes, ", root_rank=", root_rank,
                                          step == 0 ? "" : absl::StrCat(", piece ", step - 1), ")");
    refused = Refusal(caller, bytes, root_rank, step, device);
    if (refused.ok()) {
      if (call_.count == 0) {
        call_.bytes = bytes;
        call_.root_rank = root_rank;
        call_.step = step;
        call_.device = device;
        call_.first = me;
        call_.fused_slot = fused_slot;
      } else if (call_.fused_slot != fused_slot) {
        call_.fused_slot = -1;  // a plain step 0: everyone goes on with step 1
      }
      if (step == 0) busy_ = true;
      call_.arrived[me] = 1;
      ++call_.count;
      const uint64_t mine = calls_started_;
      // An elastic job goes on without a dead trainer: it is not waited for.
      if (call_.count >= LiveLocalTrainers()) {
        // Nodes join at this boundary: the call runs in the grown world
        // (the job installs it, SetWorld, before the scheduler says so).
        while (scheduler_ != nullptr && scheduler_->growing() && failed_.ok() &&
               MonotonicNow() < deadline + absl::Milliseconds(options_.timeout_ms)) {
          cv_.WaitWithTimeout(&mu_, kPoll);
        }
        if (!failed_.ok()) return failed_;
        // The last arrival runs the call; nobody can arrive meanwhile (every
        // local trainer is in it).
        Call call = call_;
        call.world = world_;
        call_ = Call{};
        call_.arrived.assign(trainers_.size(), 0);
        ++calls_started_;
        running_ = true;
        mu_.Unlock();
        bool collective = false;
        absl::Status st = Run(call, &collective);
        mu_.Lock();
        if (st.ok()) {
          Settle(call);
        } else if (collective && on_world_failure_) {
          // An elastic job: the survivors re-form and settle this step.
          st = AwaitResume(call, st, &collective);
        }
        running_ = false;
        calls_done_ = mine + 1;
        last_result_ = st;
        if (st.ok() && (call.step == Pieces(call.bytes) || (call.step == 0 && fused_))) {
          busy_ = false;
        }
        cv_.SignalAll();
        if (!st.ok()) {
          mu_.Unlock();
          // A collective's failure: the job asks the leader which node caused it.
          FailJob(st, collective ? Scheduler::kCollectiveFailed : -1).IgnoreError();
          mu_.Lock();
          return failed_.ok() ? st : failed_;
        } else if (!failed_.ok()) {
          return failed_;
        }
      } else {
        while (calls_done_ <= mine && failed_.ok() && RestartRoot(root_rank) < 0) {
          const absl::Time now = MonotonicNow();
          if (!running_ && calls_started_ == mine && now >= deadline) {
            std::vector<uint8_t> missing(trainers_.size(), 0);
            for (size_t i = 0; i < trainers_.size(); ++i) {
              missing[i] = !call_.arrived[i] && !trainers_[i]->gone.load();
            }
            refused = MakeError(v1::TIMEOUT, absl::StrCat(Names(missing), " did not call ", what,
                                                          " within the timeout; ",
                                                          Names(call_.arrived), " waited for it"));
            break;
          }
          cv_.WaitWithTimeout(
              &mu_, running_ ? kPoll : std::clamp(deadline - now, absl::Milliseconds(1), kPoll));
        }
        // The call's own outcome once it completed: one that succeeded
        // stands even if the job failed since (a peer that closes right
        // after it); one that failed is answered with the job's failure,
        // which its last arrival is recording now (a trainer told first
        // could close and fail the job in its own name instead).
        if (refused.ok() && RestartRoot(root_rank) >= 0) {
          return Answer(caller, root_rank, step, device);
        }
        if (refused.ok() && calls_done_ <= mine) return failed_;
        if (refused.ok() && !last_result_.ok()) {
          const absl::Time until = MonotonicNow() + absl::Milliseconds(options_.timeout_ms);
          while (failed_.ok() && MonotonicNow() < until) cv_.WaitWithTimeout(&mu_, kPoll);
          return failed_.ok() ? last_result_ : failed_;
        }
      }
    }
    if (refused.ok()) return Answer(caller, root_rank, step, device);
  }
  return FailJob(refused);
}

absl::Status Broadcaster::EnsureSegment() {
  if (segment_.valid()) return absl::OkStatus();
  auto seg = ipc::CreateUnderRandomName<ipc::SharedSegment>(
      options_.shm_prefix, getpid(), "bcast", [&](const std::string& name) {
        return ipc::SharedSegment::Create(name, 2 * kPieceBytes, options_.shm_mode,
                                          options_.shm_group);
      });
  if (!seg.ok()) {
    return MakeError(v1::INTERNAL,
                     absl::StrCat("gs_broadcast's staging segment: ", seg.status().message()));
  }
  segment_ = std::move(*seg);
  return absl::OkStatus();
}

absl::Status Broadcaster::Agree(const Call& call, bool* fused, bool* collective) {
  const int nodes = call.world.num_nodes;
  std::vector<double> v(kAgreementHead + kAgreementPerNode * static_cast<size_t>(nodes), 0.0);
  v[0] = 1;
  v[1] = *fused ? 1 : 0;  // fused only when every node can
  const size_t mine =
      kAgreementHead + kAgreementPerNode * static_cast<size_t>(call.world.node_index);
  v[mine] = static_cast<double>(call.bytes) + 1;
  // Whether the buffers are device memory rides with the root, so that a
  // node broadcasting host memory and one device memory disagree.
  v[mine + 1] = 2.0 * (call.root_rank + 1) + (call.device ? 1 : 0);
  // The node holding the root: 1, plus (device) the NCCL rank of its GPU.
  const bool holds_root = call.root_rank >= options_.rank_offset &&
                          call.root_rank < options_.rank_offset + LocalTrainers();
  if (holds_root) v[mine + 2] = 1 + (call.device ? LocalRootNcclRank(call.root_rank) : 0);
  v[mine + 3] = options_.node_rank + 1;
  MaybeHoldPiece(kHeldAgreement);
  if (absl::Status st = call.world.backend->AllreduceCounts(v.data(), v.size()); !st.ok()) {
    *collective = true;
    return MakeError(CodeOf(st),
                     absl::StrCat("gs_broadcast's agreement across nodes: ", st.message()));
  }
  if (v[0] != nodes) {
    return MakeError(v1::STATE, absl::StrCat("gs_broadcast's agreement across nodes saw ", v[0],
                                             " of ", nodes, " nodes: the nodes are out of step"));
  }
  int root_node = -1;
  for (int i = 0; i < nodes; ++i) {
    const size_t at = kAgreementHead + kAgreementPerNode * static_cast<size_t>(i);
    if (v[at] != v[mine] || v[at + 1] != v[mine + 1]) {
      return MakeError(
          v1::MISMATCH,
          absl::StrCat(
              "nodes called gs_broadcast differently: node_rank=", options_.node_rank,
              " with bytes=", call.bytes, ", root_rank=", call.root_rank,
              call.device ? " (device memory)" : " (host memory)", ", node_rank=",
              static_cast<int64_t>(v[at + 3]) - 1, " with bytes=", static_cast<int64_t>(v[at]) - 1,
              ", root_rank=", static_cast<int64_t>(v[at + 1]) / 2 - 1,
              static_cast<int64_t>(v[at + 1]) % 2 ? " (device memory)" : " (host memory)"));
    }
    if (v[at + 2] >= 1 && root_node < 0) {
      root_node = i;
      root_nccl_rank_ = static_cast<int>(v[at + 2]) - 1;
    }
  }
  if (root_node < 0) {
    // Its node is gone: the catch-up runs again from a live old member.
    *fused = false;
    return RerootOrRefuse(call, collective);
  }
  root_node_ = root_node;
  *fused = v[1] == nodes;
  return absl::OkStatus();
}

absl::Status Broadcaster::RootOnNoNode(int root_rank) {
  return MakeError(v1::INVALID_ARGUMENT,
                   absl::StrCat("gs_broadcast: root_rank ", root_rank,
                                " is on no node of the job (after an elastic re-formation: "
                                "its node is no longer a member)"));
}

int Broadcaster::LocalRootNcclRank(int root_rank) const {
  const int local = root_rank - options_.rank_offset;
  if (gpu_ == nullptr || local < 0 || static_cast<size_t>(local) >= gpu_->num_trainers()) return -1;
  return gpu_->nccl_rank(gpu_->device_index(static_cast<size_t>(local)));
}

absl::Status Broadcaster::RunDevicePiece(const Call& call, uint64_t piece, bool* collective) {
  // One GPU on one node: the trainers share the root's slots.
  if (gpu_->nccl_ranks() == 1) return absl::OkStatus();
  const uint64_t len = std::min(kPieceBytes, call.bytes - piece * kPieceBytes);
  std::vector<gpu::DeviceBuffer> buffers;
  for (size_t d = 0; d < gpu_->devices().size(); ++d) {
    buffers.push_back(gpu::DeviceBuffer{
        static_cast<int>(d), gpu_->broadcast_slots(static_cast<int>(d)) + (piece % 2) * kPieceBytes,
        static_cast<size_t>(len)});
  }
  // The root synchronized its copy into the slot before its call, and
  // every reader finished the piece that used this slot before: the
  // collective waits on no trainer.
  absl::Status st = gpu_->collectives().Broadcast(buffers, root_nccl_rank_);
  if (!st.ok()) {
    gpu_->ExitIfLost(st, "gs_broadcast's ncclBroadcast");
    *collective = true;
    return MakeError(
        CodeOf(st) == v1::OK ? v1::INTERNAL : CodeOf(st),
        absl::StrCat("gs_broadcast of device memory, piece ", piece, " of ", Pieces(call.bytes),
                     " (ncclBroadcast from NCCL rank ", root_nccl_rank_, "): ", st.message()));
  }
  return absl::OkStatus();
}

bool Broadcaster::CanFuse(const Call& call) const {
  // The segment exists: the callers mapped it in an earlier broadcast.
  return !call.device && call.fused_slot >= 0 && call.fused_slot <= 1 && call.bytes > 0 &&
         call.bytes <= kPieceBytes && segment_.valid();
}

absl::Status Broadcaster::Run(const Call& call, bool* collective) {
  if (call.step == 0) {
    fused_ = false;
    if (call.device) {
      RETURN_IF_ERROR(gpu_->EnsureBroadcastSlots(kPieceBytes));
      root_nccl_rank_ = LocalRootNcclRank(call.root_rank);
    } else {
      RETURN_IF_ERROR(EnsureSegment());
    }
    bool fused = CanFuse(call);
    if (call.world.num_nodes > 1) {
      RETURN_IF_ERROR(Agree(call, &fused, collective));
    } else if (call.root_rank < options_.rank_offset ||
               call.root_rank >= options_.rank_offset + LocalTrainers()) {
      // An elastic job re-formed down to this node, without the root's.
      return RerootOrRefuse(call, collective);
    }
    if (!fused) return absl::OkStatus();
    // The root filled the whole buffer into that slot before its call.
    RETURN_IF_ERROR(
        RunHostPiece(call, 0, Slot(static_cast<uint64_t>(call.fused_slot)), collective));
    fused_ = true;
    return absl::OkStatus();
  }
  if (call.device) return RunDevicePiece(call, call.step - 1, collective);
  return RunHostPiece(call, call.step - 1, Slot(call.step - 1), collective);
}

absl::Status Broadcaster::RunHostPiece(const Call& call, uint64_t piece, uint8_t* slot,
                                       bool* collective) {
  if (call.world.num_nodes == 1) return absl::OkStatus();
  const uint64_t len = std::min(kPieceBytes, call.bytes - piece * kPieceBytes);
  MaybeHoldPiece(piece);
  absl::Status st = call.world.backend->Broadcast(slot, len, root_node_);
  if (!st.ok()) {
    *collective = true;
    return MakeError(CodeOf(st), absl::StrCat("gs_broadcast, piece ", piece, " of ",
                                              Pieces(call.bytes), ": ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace gradsync
