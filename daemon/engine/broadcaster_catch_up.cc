// Broadcaster: the catch-up broadcast of an elastic job (docs/DESIGN.md,
// "Elastic jobs"). A join (nodes, or restarted trainers) announces it:
// before the join iteration's first mark every trainer broadcasts its
// state from the catch-up root. Every old member's buffer holds a replica
// of that state, and replicas are equal, so when the root's node dies the
// broadcast is run again from the lowest live rank that was a member
// before the join: it sends the bytes the dead root would have, and the
// joiners' buffers are overwritten in full by the re-run. Any other
// broadcast's bytes cannot be re-sourced: it fails naming the dead root.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_code.h"
#include "daemon/engine/broadcaster.h"
#include "spdlog/spdlog.h"

namespace gradsync {

void Broadcaster::ExpectCatchUp(int root, uint64_t iteration, std::vector<uint8_t> old_members) {
  MonotonicMutexLock lock(&mu_);
  old_members.resize(trainers_.size(), 0);
  catch_up_ = CatchUpWindow{true, iteration, root, {}, std::move(old_members)};
  spdlog::info("event=catch_up_expected iteration={} root={}", iteration, root);
}

bool Broadcaster::InCatchUp() const {
  if (!catch_up_.armed || scheduler_ == nullptr) return false;
  if (scheduler_->iteration() != catch_up_.iteration) return false;
  // A local trainer's first mark of the join iteration ends the window.
  return std::find(marked_in_.begin(), marked_in_.end(), catch_up_.iteration + 1) ==
         marked_in_.end();
}

int Broadcaster::RestartRoot(int root_rank) const {
  const std::vector<int>& dead = catch_up_.dead_roots;
  if (std::find(dead.begin(), dead.end(), root_rank) == dead.end() || !InCatchUp()) return -1;
  return catch_up_.root;
}

absl::StatusOr<int> Broadcaster::NextCatchUpRoot(const World& world, int dead_root,
                                                 bool* collective) {
  // [nodes that take it for the catch-up, per node: its lowest live old
  // member's rank + 1]: every node decides from the same sums.
  std::vector<double> v(1 + static_cast<size_t>(world.num_nodes), 0.0);
  v[0] = InCatchUp() && dead_root == catch_up_.root ? 1 : 0;
  int lowest = -1;
  for (size_t i = 0; i < trainers_.size() && i < catch_up_.old_members.size(); ++i) {
    if (!catch_up_.old_members[i] || trainers_[i]->gone.load()) continue;
    if (lowest < 0 || trainers_[i]->rank < lowest) lowest = trainers_[i]->rank;
  }
  v[1 + static_cast<size_t>(world.node_index)] = lowest + 1.0;
  if (world.num_nodes > 1) {
    mu_.Unlock();
    absl::Status st = world.backend->AllreduceCounts(v.data(), v.size());
    mu_.Lock();
    if (!st.ok()) {
      *collective = true;
      return MakeError(CodeOf(st) == v1::OK ? v1::PEER_FAILED : CodeOf(st),
                       absl::StrCat("gs_broadcast: choosing a new catch-up root after root_rank ",
                                    dead_root, "'s node died: ", st.message()));
    }
  }
  if (v[0] != world.num_nodes) return -1;
  int root = -1;
  for (size_t i = 1; i < v.size(); ++i) {
    const int r = static_cast<int>(v[i]) - 1;
    if (r >= 0 && (root < 0 || r < root)) root = r;
  }
  if (root >= 0) return root;
  return MakeError(v1::INVALID_ARGUMENT,
                   absl::StrCat("gs_broadcast of the job's state from catch-up root ", dead_root,
                                ": its node died and no trainer that was a member before the "
                                "join is left alive to send the state"));
}

void Broadcaster::ReplaceCatchUpRoot(uint64_t serial, int dead_root, int root) {
  catch_up_.dead_roots.push_back(dead_root);
  catch_up_.root = root;
  // The re-run takes the abandoned broadcast's number on every node.
  began_ = serial - 1;
  steps_done_ = 0;
  busy_ = false;
  // Local trainers already waiting for the abandoned call's next step.
  if (call_.count > 0 && RestartRoot(call_.root_rank) >= 0) {
    call_ = Call{};
    call_.arrived.assign(trainers_.size(), 0);
  }
  spdlog::warn("event=catch_up_root_replaced old={} new={} broadcast={}", dead_root, root, serial);
  cv_.SignalAll();
}

void Broadcaster::Settle(const Call& call) {
  if (reroot_to_ < 0) {
    StepDone(call, fused_);
    return;
  }
  const int root = reroot_to_;
  reroot_to_ = -1;
  // Step 0's agreement found it: the broadcast is the one after the last begun.
  ReplaceCatchUpRoot(began_ + 1, call.root_rank, root);
}

absl::Status Broadcaster::RerootOrRefuse(const Call& call, bool* collective) {
  MonotonicMutexLock lock(&mu_);
  absl::StatusOr<int> root = NextCatchUpRoot(call.world, call.root_rank, collective);
  if (!root.ok()) return root.status();
  if (*root < 0) return RootOnNoNode(call.root_rank);
  reroot_to_ = *root;
  return absl::OkStatus();
}

absl::Status Broadcaster::RerootInterrupted(uint64_t serial, int dead_root, bool completed,
                                            const World& world, const absl::Status& gone,
                                            bool* collective_failed) {
  // A node that completed it went on: it cannot run again there.
  if (completed) return gone;
  absl::StatusOr<int> root = NextCatchUpRoot(world, dead_root, collective_failed);
  if (!root.ok()) return root.status();
  if (*root < 0) return gone;
  ReplaceCatchUpRoot(serial, dead_root, *root);
  if (awaiting_) verdict_ = Verdict::kCompleted;
  cv_.SignalAll();
  return absl::OkStatus();
}

Broadcaster::StepResult Broadcaster::Answer(const Trainer& caller, int root_rank, uint64_t step,
                                            bool device) const {
  StepResult result;
  result.segment_name = segment_.name();
  result.segment_bytes = segment_.size();
  result.piece_bytes = kPieceBytes;
  result.restart_from_root = RestartRoot(root_rank);
  result.fused = step == 0 && fused_ && result.restart_from_root < 0;
  const int me = caller.local_rank;
  if (device && step == 0 && gpu_ != nullptr && static_cast<size_t>(me) < gpu_->num_trainers()) {
    result.device_handle = gpu_->broadcast_handle(gpu_->device_index(me)).ToBytes();
  }
  return result;
}

}  // namespace gradsync
