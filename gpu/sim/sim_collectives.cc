#include "gpu/sim/sim_collectives.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/monotonic.h"
#include "common/status_macros.h"
#include "gpu/sim/sim_kernels.h"
#include "gpu/sim/sim_memory.h"
#include "ipc/shared_segment.h"

namespace gradsync::gpu::sim {
namespace {

constexpr uint64_t kGroupMagic = 0x3150524749534753ull;  // "SGSIGRP1"
constexpr uint64_t kCallMagic = 0x314c4c4143534753ull;   // "SGSCALL1"

// One rank's slot in the group segment. Zero-filled = not joined.
struct RankSlot {
  std::atomic<int32_t> pid;        // the process driving this rank
  std::atomic<uint64_t> instance;  // its group object (names its call segments)
  std::atomic<uint64_t> arrived;   // last collective whose input is published
  std::atomic<uint64_t> done;      // last collective whose inputs it has read
  // Where the rank runs, as NCCL identifies it (host, GPU): written before
  // its first `arrived`, read by peers after the warm-up.
  int32_t device_index;
  char host[64];
};

// The group segment: created by the node holding rank 0.
struct GroupHeader {
  uint64_t magic;
  uint64_t generation;
  int32_t nranks;
  // 0, or 1 + the first rank of a node whose group failed or was aborted:
  // peers stop waiting for it at once.
  std::atomic<int32_t> failed;
  RankSlot slots[1];  // [nranks]
};

size_t GroupBytes(int nranks) {
  return offsetof(GroupHeader, slots) + sizeof(RankSlot) * static_cast<size_t>(nranks);
}

// One node's inputs to one collective: its ranks' buffers, rank-major.
struct CallHeader {
  uint64_t magic;
  uint64_t seq;
  int32_t first_rank;
  int32_t nlocal;
  int32_t nbuffers;
  int32_t dtype;
  int32_t root;        // a broadcast from this rank; -1: a sum
  uint64_t counts[1];  // [nbuffers], in elements (a broadcast's: bytes)
};

size_t CallHeaderBytes(size_t nbuffers) {
  const size_t raw =
      offsetof(CallHeader, counts) + sizeof(uint64_t) * std::max<size_t>(nbuffers, 1);
  return (raw + 63) / 64 * 64;
}

std::string GroupKey(uint64_t generation) { return absl::StrCat("sim_collective/", generation); }

std::string CallSegmentName(const std::string& prefix, pid_t pid, uint64_t instance, uint64_t seq) {
  return ipc::SegmentName(prefix, pid, absl::StrCat("c", instance, "s", seq));
}

uint64_t NewInstance() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

class SimCollectiveGroup final : public CollectiveGroup {
 public:
  SimCollectiveGroup(const CollectiveOptions& options, std::vector<int> device_indices,
                     std::string prefix, std::string host, bool allreduce_ignores_timeout)
      : allreduce_ignores_timeout_(allreduce_ignores_timeout),
        nranks_(options.nranks),
        first_rank_(options.first_rank),
        nlocal_(static_cast<int>(device_indices.size())),
        generation_(options.generation),
        timeout_(options.timeout),
        device_indices_(std::move(device_indices)),
        prefix_(std::move(prefix)),
        host_(std::move(host)),
        instance_(NewInstance()) {}

  ~SimCollectiveGroup() override {
    if (created_group_ && !group_unlinked_) {
      ipc::SharedSegment::Remove(group_.name()).IgnoreError();
    }
  }

  // Joins the group (multi-node) and runs the warm-up collective.
  absl::Status Init(const CollectiveOptions& options) {
    const absl::Time deadline = MonotonicNow() + timeout_;
    // Polled by Await while joining and warming up, as NCCL's init polls it.
    init_cancelled_ = options.cancelled;
    if (nranks_ > nlocal_) {
      if (auto st = Join(options, deadline); !st.ok()) return Fail(st);
    }
    absl::Status warm = WarmUp(deadline);
    if (created_group_) {
      // Everyone mapped it before arriving: the name is no longer needed.
      ipc::SharedSegment::Remove(group_.name()).IgnoreError();
      group_unlinked_ = true;
    }
    if (warm.ok() && nranks_ > nlocal_) warm = CheckOneRankPerGpu();
    init_cancelled_ = nullptr;
    return warm;
  }

  absl::Status AllreduceSum(const std::vector<DeviceBuffer>& buffers, DType dtype) override {
    return Run(buffers, dtype,
               allreduce_ignores_timeout_ ? absl::InfiniteFuture() : MonotonicNow() + timeout_);
  }

  absl::Status Broadcast(const std::vector<DeviceBuffer>& buffers, int root) override {
    if (root < 0 || root >= nranks_) {
      RETURN_IF_ERROR(Unusable());
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("Broadcast: root ", root, " is not one of ", nranks_, " ranks")));
    }
    // Bytes: counted as one-byte elements; the dtype only names them.
    return Run(buffers, DType::kFloat32, MonotonicNow() + timeout_, root);
  }

  void Abort(const std::string& reason) override {
    {
      absl::MutexLock lock(&mu_);
      if (abort_reason_.empty()) abort_reason_ = reason.empty() ? "aborted" : reason;
    }
    aborted_.store(true, std::memory_order_release);
    TellPeers();
  }

 private:
  // OK, or why the group can no longer be used.
  absl::Status Unusable() {
    if (aborted_.load(std::memory_order_acquire)) {
      absl::MutexLock lock(&mu_);
      return absl::AbortedError(absl::StrCat("collective group aborted: ", abort_reason_));
    }
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) {
      return absl::AbortedError(
          absl::StrCat("collective group unusable after an earlier failure: ", failure_.message()));
    }
    return absl::OkStatus();
  }

  // Records the first failure, tells the peers, and returns `st`.
  absl::Status Fail(absl::Status st) {
    {
      absl::MutexLock lock(&mu_);
      if (failure_.ok()) failure_ = st;
    }
    TellPeers();
    return st;
  }

  void TellPeers() {
    GroupHeader* g = header();
    if (g == nullptr) return;
    int32_t none = 0;
    g->failed.compare_exchange_strong(none, first_rank_ + 1, std::memory_order_acq_rel);
  }

  GroupHeader* header() const {
    return group_.valid() ? static_cast<GroupHeader*>(group_.data()) : nullptr;
  }

  absl::Status Join(const CollectiveOptions& options, absl::Time deadline) {
    const std::string key = GroupKey(generation_);
    if (first_rank_ == 0) {
      if (!options.publish) return absl::InvalidArgumentError("multi-node group without publish");
      const std::string name = NewSegmentName(prefix_, "g");
      ASSIGN_OR_RETURN(ipc::SharedSegment seg,
                       ipc::SharedSegment::Create(name, GroupBytes(nranks_)));
      group_ = std::move(seg);
      created_group_ = true;
      GroupHeader* g = header();
      g->generation = generation_;
      g->nranks = nranks_;
      std::atomic_thread_fence(std::memory_order_release);
      g->magic = kGroupMagic;
      RETURN_IF_ERROR(options.publish(key, name));
    } else {
      if (!options.fetch) return absl::InvalidArgumentError("multi-node group without fetch");
      ASSIGN_OR_RETURN(std::string name, options.fetch(key, deadline));
      absl::StatusOr<ipc::SharedSegment> seg = ipc::SharedSegment::Open(name, 0600);
      if (!seg.ok()) {
        return absl::UnavailableError(absl::StrCat(
            "collective group ", name, " is gone (its rank 0 gave up?): ", seg.status().message()));
      }
      const auto* g = static_cast<const GroupHeader*>(seg->data());
      if (seg->size() < GroupBytes(nranks_) || g->magic != kGroupMagic ||
          g->generation != generation_ || g->nranks != nranks_) {
        return absl::InvalidArgumentError(absl::StrCat("collective group ", name,
                                                       " is not generation ", generation_, " with ",
                                                       nranks_, " ranks"));
      }
      group_ = *std::move(seg);
    }
    GroupHeader* g = header();
    for (int j = 0; j < nlocal_; ++j) {
      RankSlot& slot = g->slots[first_rank_ + j];
      int32_t expected = 0;
      if (!slot.pid.compare_exchange_strong(expected, getpid(), std::memory_order_acq_rel)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", first_rank_ + j, " was already joined by process ", expected));
      }
      // Read by peers only after this rank's first `arrived` (release).
      slot.instance.store(instance_, std::memory_order_relaxed);
      slot.device_index = device_indices_[j];
      std::snprintf(slot.host, sizeof(slot.host), "%s", host_.c_str());
    }
    return absl::OkStatus();
  }

  // NCCL refuses two ranks of one communicator on one GPU of one host
  // (ncclInvalidUsage, "Duplicate GPU detected") on every rank, telling
  // hosts apart by NCCL_HOSTID: so does the simulation, once every rank
  // has arrived (the warm-up) and published where it runs.
  absl::Status CheckOneRankPerGpu() {
    const GroupHeader* g = header();
    for (int a = 0; a < nranks_; ++a) {
      for (int b = a + 1; b < nranks_; ++b) {
        const RankSlot& x = g->slots[a];
        const RankSlot& y = g->slots[b];
        if (x.device_index == y.device_index && std::strncmp(x.host, y.host, sizeof(x.host)) == 0) {
          // Every rank reaches this verdict itself: telling the peers
          // would turn theirs into a peer failure.
          absl::Status st = absl::InvalidArgumentError(absl::StrCat(
              "ranks ", a, " and ", b, " of one communicator are both on SIM-GPU-", x.device_index,
              " of host '", std::string(x.host, strnlen(x.host, sizeof(x.host))),
              "': NCCL refuses two ranks on one GPU of one host (give each node its own "
              "NCCL_HOSTID)"));
          absl::MutexLock lock(&mu_);
          if (failure_.ok()) failure_ = st;
          return st;
        }
      }
    }
    return absl::OkStatus();
  }

  // root < 0: a sum of `dtype` elements; else a broadcast of bytes from
  // global rank `root`.
  absl::Status Run(const std::vector<DeviceBuffer>& buffers, DType dtype, absl::Time deadline,
                   int root = -1) {
    RETURN_IF_ERROR(Unusable());
    // Any failure, bad arguments included, ends the group: the peers may
    // already be waiting for a collective this node will never run.
    absl::StatusOr<std::vector<std::vector<DeviceBuffer>>> per_rank =
        Validate(buffers, dtype, root);
    if (!per_rank.ok()) return Fail(per_rank.status());
    if ((*per_rank)[0].empty()) return absl::OkStatus();
    const uint64_t seq = ++seq_;
    absl::Status st = nranks_ == nlocal_ ? LocalSum(*per_rank, dtype, root)
                                         : NodeSum(*per_rank, dtype, root, seq, deadline);
    return st.ok() ? st : Fail(st);
  }

  // Each k-th output: the sum of `srcs` (one per rank, in rank order), or
  // the root's bytes.
  static void Combine(char* out, const std::vector<const void*>& srcs, size_t count, DType dtype,
                      int root) {
    if (root >= 0) {
      std::memcpy(out, srcs[root], count);
    } else {
      SumKernel(out, srcs, count, dtype, 1.0f);
    }
  }
  static size_t ElementSize(DType dtype, int root) { return root >= 0 ? 1 : DTypeSize(dtype); }

  // One float on every local GPU: connection failures surface at creation.
  absl::Status WarmUp(absl::Time deadline) {
    std::vector<std::shared_ptr<Region>> scratch;
    std::vector<DeviceBuffer> buffers;
    for (int j = 0; j < nlocal_; ++j) {
      absl::StatusOr<std::shared_ptr<Region>> r =
          Registry::Get().Allocate(prefix_, device_indices_[j], sizeof(float));
      if (!r.ok()) return Fail(r.status());
      scratch.push_back(*r);
      buffers.push_back(DeviceBuffer{j, (*r)->base, 1});
    }
    absl::Status st = Run(buffers, DType::kFloat32, deadline);
    for (const auto& r : scratch) Registry::Get().Free(r->base).IgnoreError();
    return st;
  }

  // The buffers of each local rank, in order; every rank has the same
  // number, and the k-th ones agree in size (else NCCL would hang).
  absl::StatusOr<std::vector<std::vector<DeviceBuffer>>> Validate(
      const std::vector<DeviceBuffer>& buffers, DType dtype, int root) {
    if (!IsValidDType(static_cast<int32_t>(dtype))) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllreduceSum: bad dtype ", static_cast<int32_t>(dtype)));
    }
    std::vector<std::vector<DeviceBuffer>> per_rank(nlocal_);
    for (const DeviceBuffer& b : buffers) {
      if (b.device_index < 0 || b.device_index >= nlocal_) {
        return absl::InvalidArgumentError(
            absl::StrCat("AllreduceSum: device_index ", b.device_index, " of ", nlocal_));
      }
      absl::StatusOr<std::shared_ptr<Region>> r =
          Registry::Get().Find(b.data, b.count * ElementSize(dtype, root));
      if (!r.ok())
        return absl::InvalidArgumentError(absl::StrCat("AllreduceSum: ", r.status().message()));
      if ((*r)->device_index != device_indices_[b.device_index]) {
        return absl::InvalidArgumentError(
            absl::StrCat("AllreduceSum: buffer for local GPU ", b.device_index, " lies on SIM-GPU-",
                         (*r)->device_index, ", not SIM-GPU-", device_indices_[b.device_index]));
      }
      per_rank[b.device_index].push_back(b);
    }
    for (int j = 1; j < nlocal_; ++j) {
      if (per_rank[j].size() != per_rank[0].size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("AllreduceSum: local GPU ", j, " has ", per_rank[j].size(),
                         " buffers, local GPU 0 has ", per_rank[0].size()));
      }
      for (size_t k = 0; k < per_rank[0].size(); ++k) {
        if (per_rank[j][k].count != per_rank[0][k].count) {
          return absl::InvalidArgumentError(absl::StrCat(
              "AllreduceSum: buffer ", k, " has ", per_rank[j][k].count, " elements on local GPU ",
              j, ", ", per_rank[0][k].count, " on local GPU 0"));
        }
      }
    }
    return per_rank;
  }

  // All ranks are here: sum each k-th buffer over ranks in rank order.
  absl::Status LocalSum(const std::vector<std::vector<DeviceBuffer>>& per_rank, DType dtype,
                        int root) {
    for (size_t k = 0; k < per_rank[0].size(); ++k) {
      const size_t count = per_rank[0][k].count;
      std::vector<const void*> srcs;
      for (int j = 0; j < nlocal_; ++j) srcs.push_back(per_rank[j][k].data);
      std::string sum(count * ElementSize(dtype, root), '\0');
      Combine(sum.data(), srcs, count, dtype, root);
      for (int j = 0; j < nlocal_; ++j) std::memcpy(per_rank[j][k].data, sum.data(), sum.size());
    }
    return Unusable();  // an Abort during the sum still fails the call
  }

  // Ranks in other processes: publish this node's inputs, wait for every
  // rank, sum all inputs in rank order, wait until all have read.
  absl::Status NodeSum(const std::vector<std::vector<DeviceBuffer>>& per_rank, DType dtype,
                       int root, uint64_t seq, absl::Time deadline) {
    const size_t nbuffers = per_rank[0].size();
    const size_t esize = ElementSize(dtype, root);
    size_t per_rank_bytes = 0;
    for (const DeviceBuffer& b : per_rank[0]) per_rank_bytes += b.count * esize;
    const size_t head = CallHeaderBytes(nbuffers);

    const std::string mine = CallSegmentName(prefix_, getpid(), instance_, seq);
    absl::StatusOr<ipc::SharedSegment> created =
        ipc::SharedSegment::Create(mine, head + per_rank_bytes * nlocal_);
    if (!created.ok()) {
      // The name holds this live process's pid: a segment already there was
      // left by a dead process that had the same pid (killed inside a
      // collective), and pids are reused.
      ipc::SharedSegment::Remove(mine).IgnoreError();
      created = ipc::SharedSegment::Create(mine, head + per_rank_bytes * nlocal_);
    }
    ASSIGN_OR_RETURN(ipc::SharedSegment own, std::move(created));
    struct Unlink {
      std::string name;
      ~Unlink() { ipc::SharedSegment::Remove(name).IgnoreError(); }
    } unlink{mine};

    auto* call = static_cast<CallHeader*>(own.data());
    call->seq = seq;
    call->first_rank = first_rank_;
    call->nlocal = nlocal_;
    call->nbuffers = static_cast<int32_t>(nbuffers);
    call->dtype = static_cast<int32_t>(dtype);
    call->root = root;
    for (size_t k = 0; k < nbuffers; ++k) call->counts[k] = per_rank[0][k].count;
    char* out = static_cast<char*>(own.data()) + head;
    for (int j = 0; j < nlocal_; ++j) {
      for (const DeviceBuffer& b : per_rank[j]) {
        std::memcpy(out, b.data, b.count * esize);
        out += b.count * esize;
      }
    }
    call->magic = kCallMagic;

    GroupHeader* g = header();
    for (int j = 0; j < nlocal_; ++j) {
      g->slots[first_rank_ + j].arrived.store(seq, std::memory_order_release);
    }
    RETURN_IF_ERROR(Await(&RankSlot::arrived, seq, deadline, "arrive at"));

    // Every rank's input, from its node's segment (ours included: the same
    // bytes every node reads, so every rank sums bit-identical inputs).
    // By (pid, instance): one process may host several simulated nodes.
    std::map<std::pair<int32_t, uint64_t>, ipc::SharedSegment> nodes;
    std::vector<const char*> inputs(nranks_);
    for (int r = 0; r < nranks_; ++r) {
      const RankSlot& slot = g->slots[r];
      const int32_t pid = slot.pid.load(std::memory_order_acquire);
      const uint64_t instance = slot.instance.load(std::memory_order_acquire);
      auto it = nodes.find({pid, instance});
      if (it == nodes.end()) {
        const std::string name = CallSegmentName(prefix_, pid, instance, seq);
        absl::StatusOr<ipc::SharedSegment> seg = ipc::SharedSegment::Open(name, 0600);
        if (!seg.ok()) {
          return absl::UnavailableError(absl::StrCat("rank ", r, "'s input to collective ", seq,
                                                     " is gone: ", seg.status().message()));
        }
        it = nodes.emplace(std::make_pair(pid, instance), *std::move(seg)).first;
      }
      const auto* theirs = static_cast<const CallHeader*>(it->second.data());
      if (it->second.size() < head || theirs->magic != kCallMagic || theirs->seq != seq ||
          theirs->nbuffers != call->nbuffers || theirs->dtype != call->dtype ||
          theirs->root != call->root ||
          !std::equal(call->counts, call->counts + nbuffers, theirs->counts) ||
          r < theirs->first_rank || r >= theirs->first_rank + theirs->nlocal ||
          it->second.size() < head + per_rank_bytes * theirs->nlocal) {
        return absl::InvalidArgumentError(
            absl::StrCat("collective ", seq, ": rank ", r,
                         " launched a different collective (buffers, sizes or"
                         " dtype differ from rank ",
                         first_rank_, "'s)"));
      }
      inputs[r] = static_cast<const char*>(it->second.data()) + head +
                  per_rank_bytes * static_cast<size_t>(r - theirs->first_rank);
    }

    size_t offset = 0;
    for (size_t k = 0; k < nbuffers; ++k) {
      const size_t count = per_rank[0][k].count;
      std::vector<const void*> srcs;
      for (int r = 0; r < nranks_; ++r) srcs.push_back(inputs[r] + offset);
      std::string sum(count * esize, '\0');
      Combine(sum.data(), srcs, count, dtype, root);
      for (int j = 0; j < nlocal_; ++j) std::memcpy(per_rank[j][k].data, sum.data(), sum.size());
      offset += count * esize;
    }

    for (int j = 0; j < nlocal_; ++j) {
      g->slots[first_rank_ + j].done.store(seq, std::memory_order_release);
    }
    // Our segment must outlive every reader.
    return Await(&RankSlot::done, seq, deadline, "finish");
  }

  // Waits until every rank's `field` reaches `seq`.
  absl::Status Await(std::atomic<uint64_t> RankSlot::*field, uint64_t seq, absl::Time deadline,
                     const char* what) {
    GroupHeader* g = header();
    absl::Duration nap = absl::Microseconds(50);
    while (true) {
      RETURN_IF_ERROR(Unusable());
      if (init_cancelled_ && init_cancelled_()) {
        return Fail(absl::CancelledError(
            absl::StrCat("collective ", seq, " (generation ", generation_, "): init cancelled")));
      }
      const int32_t failed = g->failed.load(std::memory_order_acquire);
      if (failed != 0) {
        // This node's own Abort may have set `failed` since the check
        // above: its reason, not a peer failure, is then the answer.
        RETURN_IF_ERROR(Unusable());
        return absl::UnavailableError(absl::StrCat("collective ", seq, ": the node of rank ",
                                                   failed - 1, " failed or aborted the group"));
      }
      std::vector<int> missing;
      for (int r = 0; r < nranks_; ++r) {
        RankSlot& slot = g->slots[r];
        if ((slot.*field).load(std::memory_order_acquire) >= seq) continue;
        const int32_t pid = slot.pid.load(std::memory_order_acquire);
        // Read again once the process is gone: it may have reached `seq`
        // and exited between the first read and the liveness check.
        if (pid != 0 && !ProcessAlive(pid) && (slot.*field).load(std::memory_order_acquire) < seq) {
          return absl::UnavailableError(
              absl::StrCat("collective ", seq, ": rank ", r, " (process ", pid, ") died"));
        }
        missing.push_back(r);
      }
      if (missing.empty()) return absl::OkStatus();
      if (MonotonicNow() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("collective ", seq, " (generation ", generation_, "): rank",
                         missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "), " did not ",
                         what, " it within ", absl::FormatDuration(timeout_)));
      }
      absl::SleepFor(std::min(nap, deadline - MonotonicNow()));
      nap = std::min(nap * 2, absl::Milliseconds(1));
    }
  }

  const bool allreduce_ignores_timeout_;
  const int nranks_;
  const int first_rank_;
  const int nlocal_;
  const uint64_t generation_;
  const absl::Duration timeout_;
  const std::vector<int> device_indices_;
  const std::string prefix_;
  const std::string host_;
  const uint64_t instance_;
  std::function<bool()> init_cancelled_;  // during Init only (its thread)

  // Multi-node only. Written by Init before the group is shared.
  ipc::SharedSegment group_;
  bool created_group_ = false;
  bool group_unlinked_ = false;
  uint64_t seq_ = 0;  // the collective thread's

  std::atomic<bool> aborted_{false};
  absl::Mutex mu_;
  std::string abort_reason_ ABSL_GUARDED_BY(mu_);
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<CollectiveGroup>> CreateSimCollectives(
    const CollectiveOptions& options, const std::vector<int>& device_indices,
    const std::string& prefix, const std::string& host, bool allreduce_ignores_timeout) {
  const int nlocal = static_cast<int>(device_indices.size());
  if (nlocal == 0) return absl::InvalidArgumentError("a collective group needs local devices");
  if (options.nranks < nlocal || options.first_rank < 0 ||
      options.first_rank + nlocal > options.nranks) {
    return absl::InvalidArgumentError(absl::StrCat("ranks ", options.first_rank, "..",
                                                   options.first_rank + nlocal - 1,
                                                   " do not fit in ", options.nranks));
  }
  if (std::set<int>(device_indices.begin(), device_indices.end()).size() != device_indices.size()) {
    return absl::InvalidArgumentError("a GPU appears twice in the collective group's devices");
  }
  auto group = std::make_unique<SimCollectiveGroup>(options, device_indices, prefix, host,
                                                    allreduce_ignores_timeout);
  RETURN_IF_ERROR(group->Init(options));
  return std::unique_ptr<CollectiveGroup>(std::move(group));
}

}  // namespace gradsync::gpu::sim
