// Broadcaster::Resume: a gs_broadcast that a node's death interrupted in an
// elastic job (docs/DESIGN.md, "Elastic jobs"). Every survivor, right after
// the re-formation, says where it stopped in one float64 sum (exact for
// these values): the broadcast it is in and the steps of it completed.
// A collective can complete on some nodes and not on others (Gloo's
// broadcast sends to one peer, then the next), so the survivors may be one
// step apart, never more (the next step needs every node). The ones behind
// get the step they missed from the root's node, which still holds it in
// its slot (the root fills the other slot only after the next step), and
// their call completes; everyone else's failed call runs again on the new
// world, paired with the others' next calls. A root whose node died
// leaves nothing to send: INVALID_ARGUMENT naming it, unless the broadcast
// is the catch-up of a join, which runs again from a live old member.
#include <algorithm>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log_value.h"
#include "common/monotonic.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/engine/broadcaster.h"
#include "spdlog/spdlog.h"

namespace gradsync {
namespace {

constexpr absl::Duration kPoll = absl::Milliseconds(100);

// Per survivor: present, broadcast serial, steps completed, awaiting a
// verdict, then the failed call's and the last completed step's
// [bytes + 1, 2 * (root + 1) + device, holds the root (1 + NCCL rank),
// fused slot + 1 / fused], and the node rank + 1.
constexpr size_t kHead = 3;
constexpr size_t kPerNode = 13;

struct Stopped {
  uint64_t serial, step;
  bool awaiting;
  uint64_t bytes;
  int root_rank;
  bool device;
  int holds;  // 1 + NCCL rank of the root's GPU; 0: holds no root
  int extra;  // the failed call's fused slot + 1, or whether the done step 0 fused
  int node_rank;
};

// Which of the two detail sets place i describes broadcast `b` with:
// the failed call's for a survivor behind, else its last completed step's.
Stopped Read(const std::vector<double>& v, int i, bool failed_call) {
  const size_t at = kHead + kPerNode * static_cast<size_t>(i);
  const size_t d = at + (failed_call ? 4 : 8);
  Stopped s;
  s.serial = static_cast<uint64_t>(v[at]);
  s.step = static_cast<uint64_t>(v[at + 1]);
  s.awaiting = v[at + 2] != 0;
  s.bytes = static_cast<uint64_t>(v[d]) - 1;
  s.root_rank = static_cast<int>(v[d + 1]) / 2 - 1;
  s.device = static_cast<int>(v[d + 1]) % 2 == 1;
  s.holds = static_cast<int>(v[d + 2]);
  s.extra = static_cast<int>(v[d + 3]);
  s.node_rank = static_cast<int>(v[at + 12]) - 1;
  return s;
}

std::string Describe(const Stopped& s) {
  return absl::StrCat("node_rank=", s.node_rank, " at broadcast ", s.serial, " step ", s.step);
}

}  // namespace

struct Broadcaster::Position {
  uint64_t serial = 0;
  uint64_t step = 0;
};

Broadcaster::Position Broadcaster::Where() const {
  // Between broadcasts (or before step 0 completed): at the next one's step 0.
  if (steps_done_ == 0) return Position{began_ + 1, 0};
  return Position{began_, steps_done_};
}

absl::Status Broadcaster::CatchUp(const Call& call, uint64_t step, int root_place,
                                  int root_nccl_rank, bool fused, bool* collective) {
  root_node_ = root_place;
  root_nccl_rank_ = root_nccl_rank;
  spdlog::warn("event=broadcast_catch_up step={} bytes={} root_rank={} root_place={} fused={}",
               step, call.bytes, call.root_rank, root_place, fused);
  if (step == 0) {
    // The agreement's outcome is known; only a fused step moved bytes.
    if (!fused || call.bytes == 0) return absl::OkStatus();
    return RunHostPiece(call, 0, Slot(static_cast<uint64_t>(call.fused_slot)), collective);
  }
  if (call.device) return RunDevicePiece(call, step - 1, collective);
  return RunHostPiece(call, step - 1, Slot(step - 1), collective);
}

absl::Status Broadcaster::Resume(bool* collective_failed) {
  *collective_failed = false;
  MonotonicMutexLock lock(&mu_);
  // A call still inside the old world's collective returns once it was
  // aborted (the re-formation did that): its outcome decides where we are.
  const absl::Time until = MonotonicNow() + absl::Milliseconds(options_.timeout_ms);
  while (running_ && !awaiting_ && failed_.ok() && MonotonicNow() < until) {
    cv_.WaitWithTimeout(&mu_, kPoll);
  }
  if (!failed_.ok()) return failed_;
  if (running_ && !awaiting_) {
    return MakeError(v1::STATE,
                     "gs_broadcast: a call on the old world did not return within the "
                     "timeout after the re-formation");
  }
  const World world = world_;
  const Position me = Where();
  std::vector<double> v(kHead + kPerNode * static_cast<size_t>(world.num_nodes), 0.0);
  const size_t at = kHead + kPerNode * static_cast<size_t>(world.node_index);
  v[0] = 1;
  v[at] = static_cast<double>(me.serial);
  v[at + 1] = static_cast<double>(me.step);
  v[at + 2] = awaiting_ ? 1 : 0;
  const auto fill = [&](size_t d, const Call& c, int extra) {
    v[d] = static_cast<double>(c.bytes) + 1;
    v[d + 1] = 2.0 * (c.root_rank + 1) + (c.device ? 1 : 0);
    const bool holds =
        c.root_rank >= options_.rank_offset && c.root_rank < options_.rank_offset + LocalTrainers();
    if (holds) v[d + 2] = 1 + (c.device ? LocalRootNcclRank(c.root_rank) : 0);
    v[d + 3] = extra;
  };
  fill(at + 4, awaiting_ ? failed_call_ : done_call_, failed_call_.fused_slot + 1);
  fill(at + 8, done_call_, done_fused_ ? 1 : 0);
  v[at + 12] = options_.node_rank + 1;
  if (world.num_nodes > 1) {
    mu_.Unlock();
    absl::Status st = world.backend->AllreduceCounts(v.data(), v.size());
    mu_.Lock();
    if (!st.ok()) {
      *collective_failed = true;
      return MakeError(CodeOf(st) == v1::OK ? v1::PEER_FAILED : CodeOf(st),
                       absl::StrCat("gs_broadcast: comparing where the survivors stopped after "
                                    "the re-formation: ",
                                    st.message()));
    }
  }
  return SettleInterrupted(v, world, collective_failed);
}

absl::Status Broadcaster::SettleInterrupted(const std::vector<double>& v, const World& world,
                                            bool* collective_failed) {
  const int nodes = world.num_nodes;
  // The survivors furthest behind and ahead.
  int trail = 0, lead = 0;
  bool any_inside = false;
  for (int i = 0; i < nodes; ++i) {
    const Stopped s = Read(v, i, false), t = Read(v, trail, false), l = Read(v, lead, false);
    if (std::tie(s.serial, s.step) < std::tie(t.serial, t.step)) trail = i;
    if (std::tie(s.serial, s.step) > std::tie(l.serial, l.step)) lead = i;
    any_inside = any_inside || s.step > 0 || s.awaiting;
  }
  if (!any_inside) return absl::OkStatus();  // no broadcast was under way
  const Stopped behind = Read(v, trail, Read(v, trail, false).awaiting);
  const Stopped ahead = Read(v, lead, false);
  const bool level = behind.serial == ahead.serial && behind.step == ahead.step;
  const bool next_step = behind.serial == ahead.serial && ahead.step == behind.step + 1;
  const bool next_call = ahead.serial == behind.serial + 1 && ahead.step == 0 &&
                         (behind.step == 0 || behind.step == Pieces(behind.bytes));
  if (!level && !next_step && !next_call) {
    return MakeError(v1::STATE,
                     absl::StrCat("gs_broadcast: the survivors stopped more than one step apart (",
                                  Describe(behind), ", ", Describe(ahead), ")"));
  }
  // The root's place among the survivors, for the broadcast the ones
  // behind are in (every survivor's details describe it alike).
  int root_place = -1, root_nccl = 0;
  for (int i = 0; i < nodes && root_place < 0; ++i) {
    const Stopped a = Read(v, i, false);
    const bool behind_here = a.serial == behind.serial && a.step == behind.step;
    const Stopped s = Read(v, i, a.awaiting && behind_here);
    if (s.holds > 0) {
      root_place = i;
      root_nccl = s.holds - 1;
    }
  }
  const bool needs_root = !level || behind.step > 0;
  if (needs_root && root_place < 0) {
    const absl::Status gone = MakeError(
        v1::INVALID_ARGUMENT,
        absl::StrCat("gs_broadcast(bytes=", behind.bytes, ", root_rank=", behind.root_rank,
                     "): root_rank ", behind.root_rank,
                     " is on no node of the job: its node died during the broadcast, so the "
                     "survivors cannot receive its bytes (",
                     Describe(behind), ")"));
    // A catch-up runs again from a live old member (broadcaster_catch_up.cc).
    return RerootInterrupted(behind.serial, behind.root_rank, next_call, world, gone,
                             collective_failed);
  }
  if (needs_root) {
    root_node_ = root_place;
    root_nccl_rank_ = root_nccl;
  }
  const Position me = Where();
  const bool me_behind = me.serial == behind.serial && me.step == behind.step;
  spdlog::warn("event=broadcast_resumed behind={} ahead={} root_place={} caught_up={}",
               LogValue(Describe(behind)), LogValue(Describe(ahead)), root_place, !level);
  if (!level) {
    // The step the ones behind missed, from the root's slot.
    Call call = awaiting_ && me_behind ? failed_call_ : done_call_;
    call.world = world;
    bool fused = false;
    for (int i = 0; i < nodes; ++i) {
      const Stopped a = Read(v, i, false);
      if (a.serial != behind.serial || a.step != behind.step) fused = fused || a.extra == 1;
    }
    mu_.Unlock();
    absl::Status st = CatchUp(call, behind.step, root_place, root_nccl, fused, collective_failed);
    mu_.Lock();
    if (!st.ok()) return st;
    if (awaiting_ && me_behind) {
      fused_ = behind.step == 0 && fused;
      StepDone(failed_call_, fused_);
      verdict_ = Verdict::kCompleted;
      cv_.SignalAll();
      return absl::OkStatus();
    }
  }
  if (awaiting_) verdict_ = Verdict::kRunAgain;
  cv_.SignalAll();
  return absl::OkStatus();
}

}  // namespace gradsync
