#include "daemon/engine/replica_exchange.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_code.h"

namespace gradsync {
namespace {

std::string Hex(uint64_t v) { return absl::StrFormat("0x%016x", v); }

// A 64-bit value as two 32-bit limbs, each exact in a double.
void PutLimbs(uint64_t v, double* out) {
  out[0] = static_cast<double>(v >> 32);
  out[1] = static_cast<double>(v & 0xffffffffu);
}
uint64_t GetLimbs(const double* in) {
  return (static_cast<uint64_t>(in[0]) << 32) | static_cast<uint64_t>(in[1]);
}

// FNV-1a over the hashes' bytes, low byte first: the same on every node.
uint64_t Digest(const std::vector<uint64_t>& hashes) {
  uint64_t d = 1469598103934665603ull;
  for (uint64_t h : hashes) {
    for (int byte = 0; byte < 8; ++byte) {
      d ^= (h >> (8 * byte)) & 0xffu;
      d *= 1099511628211ull;
    }
  }
  return d;
}

// Step 1: a head [nodes], then per node [present, iteration (2 limbs),
// every, trainers, digest (2 limbs), trainers equal]. Its length (2 + 8n)
// differs from the scheduler's agreement (3 + 2n) and gs_broadcast's
// (5 + 3n), so a node that is elsewhere fails the collective instead of
// reading another's counts as its own.
constexpr size_t kSummaryHead = 2;
constexpr size_t kSummaryPerNode = 9;
// Step 3: a head [nodes], then per rank [present, node, local rank, pid,
// the hash of the first differing tensor (2 limbs)].
constexpr size_t kTableHead = 1;
constexpr size_t kTablePerRank = 6;

absl::Status CollectiveError(const absl::Status& st, const char* step, bool* collective) {
  *collective = true;
  return MakeError(CodeOf(st),
                   absl::StrCat("gs_check_replicas' ", step, " across nodes: ", st.message()));
}

// The MISMATCH of CompareReplicas: `tensor` differs, `ref` has `ref_hash`.
absl::Status Difference(uint64_t iteration, const Layout& layout, size_t tensor,
                        const ReplicaFingerprint& ref, uint64_t ref_hash,
                        const ReplicaFingerprint& other, uint64_t other_hash) {
  return MakeError(
      v1::MISMATCH,
      absl::StrCat("replicas differ after iteration ", iteration, ": tensor '", layout[tensor].name,
                   "' (index ", tensor, ") has fingerprint ", Hex(ref_hash), " on ",
                   ReplicaName(ref), " but ", Hex(other_hash), " on ", ReplicaName(other),
                   "; the parameters of data-parallel replicas must stay equal (a "
                   "nondeterministic kernel, a skipped or extra step, or corrupted memory)"));
}

// Step 2, only after step 1 saw a difference: node 0 broadcasts rank 0's
// hashes; each node finds the first tensor where one of its trainers
// differs from them; the least of those is the job's first differing
// tensor. Step 3: every trainer's hash of that tensor, so every node names
// rank 0 and the lowest rank that differs there. What crosses grows with
// the tensors and the trainers, never with their product.
absl::Status NameFirstDifference(Backend& backend, const Layout& layout, const NodeRound& round,
                                 bool* collective) {
  const size_t tensors = layout.size();
  const int nodes = backend.num_nodes();
  std::vector<uint64_t> reference(tensors, 0);
  if (round.node_index == 0 && !round.local.empty()) reference = round.local[0].hashes;
  if (absl::Status st = backend.Broadcast(reference.data(), tensors * sizeof(uint64_t), 0);
      !st.ok()) {
    return CollectiveError(st, "broadcast of rank 0's fingerprints", collective);
  }
  size_t mine = tensors;
  for (const ReplicaFingerprint& r : round.local) {
    for (size_t t = 0; t < mine; ++t) {
      if (r.hashes[t] != reference[t]) mine = t;
    }
  }
  std::vector<double> first(1 + static_cast<size_t>(nodes), 0.0);
  first[0] = 1;
  first[1 + static_cast<size_t>(round.node_index)] = static_cast<double>(mine);
  if (absl::Status st = backend.AllreduceCounts(first.data(), first.size()); !st.ok()) {
    return CollectiveError(st, "search for the first differing tensor", collective);
  }
  const size_t tensor = static_cast<size_t>(*std::min_element(first.begin() + 1, first.end()));
  if (tensor >= tensors) return absl::OkStatus();  // no tensor differs after all

  std::vector<double> v(kTableHead + kTablePerRank * static_cast<size_t>(round.world_size), 0.0);
  v[0] = 1;
  for (const ReplicaFingerprint& r : round.local) {
    if (r.rank < 0 || r.rank >= round.world_size) {
      return MakeError(v1::INTERNAL, absl::StrCat("rank ", r.rank, " outside the job's world of ",
                                                  round.world_size));
    }
    double* slot = &v[kTableHead + kTablePerRank * static_cast<size_t>(r.rank)];
    slot[0] = 1;
    slot[1] = r.node_rank;
    slot[2] = r.local_rank;
    slot[3] = static_cast<double>(r.pid);
    PutLimbs(r.hashes[tensor], &slot[4]);
  }
  if (absl::Status st = backend.AllreduceCounts(v.data(), v.size()); !st.ok()) {
    return CollectiveError(st, "comparison of every trainer", collective);
  }
  std::vector<std::pair<ReplicaFingerprint, uint64_t>> everyone;  // by rank, with the hash
  for (int rank = 0; rank < round.world_size; ++rank) {
    const double* slot = &v[kTableHead + kTablePerRank * static_cast<size_t>(rank)];
    if (slot[0] != 1) continue;
    ReplicaFingerprint r;
    r.rank = rank;
    r.node_rank = static_cast<int>(slot[1]);
    r.local_rank = static_cast<int>(slot[2]);
    r.pid = static_cast<int64_t>(slot[3]);
    everyone.emplace_back(std::move(r), GetLimbs(&slot[4]));
  }
  for (const auto& [r, hash] : everyone) {
    if (hash == everyone.front().second) continue;
    return Difference(round.iteration, layout, tensor, everyone.front().first,
                      everyone.front().second, r, hash);
  }
  return absl::OkStatus();
}

}  // namespace

std::string ReplicaName(const ReplicaFingerprint& r) {
  return absl::StrCat("rank ", r.rank, " (local ", r.local_rank, ", pid ", r.pid, ") on node ",
                      r.node_rank);
}

absl::Status CompareReplicas(uint64_t iteration, const Layout& layout,
                             const std::vector<ReplicaFingerprint>& replicas) {
  if (replicas.empty()) return absl::OkStatus();
  const ReplicaFingerprint& ref = replicas.front();
  for (size_t tensor = 0; tensor < layout.size(); ++tensor) {
    for (const ReplicaFingerprint& r : replicas) {
      if (r.hashes[tensor] == ref.hashes[tensor]) continue;
      return Difference(iteration, layout, tensor, ref, ref.hashes[tensor], r, r.hashes[tensor]);
    }
  }
  return absl::OkStatus();
}

absl::Status CompareAcrossNodes(Backend& backend, const Layout& layout, const NodeRound& round,
                                bool* collective) {
  const int nodes = backend.num_nodes();
  if (round.node_index < 0 || round.node_index >= nodes) {
    return MakeError(v1::INTERNAL, absl::StrCat("gs_check_replicas: node_index ", round.node_index,
                                                " outside the backend's ", nodes, " nodes"));
  }
  std::vector<double> v(kSummaryHead + kSummaryPerNode * static_cast<size_t>(nodes), 0.0);
  v[0] = 1;
  double* mine = &v[kSummaryHead + kSummaryPerNode * static_cast<size_t>(round.node_index)];
  mine[0] = 1;
  PutLimbs(round.iteration, &mine[1]);
  mine[3] = static_cast<double>(round.every);
  mine[4] = static_cast<double>(round.local.size());
  const std::vector<uint64_t> none;
  const std::vector<uint64_t>& reference = round.local.empty() ? none : round.local[0].hashes;
  PutLimbs(Digest(reference), &mine[5]);
  mine[7] = CompareReplicas(round.iteration, layout, round.local).ok();
  // Slots are places among the members: each names its node for the errors.
  mine[8] = round.node_rank;
  if (absl::Status st = backend.AllreduceCounts(v.data(), v.size()); !st.ok()) {
    return CollectiveError(st, "summary", collective);
  }
  if (v[0] != nodes) {
    return MakeError(v1::STATE, absl::StrCat("gs_check_replicas' summary across nodes saw ", v[0],
                                             " of ", nodes, " nodes: the nodes are out of step"));
  }
  const double* first = &v[kSummaryHead];
  const int64_t first_rank = static_cast<int64_t>(first[8]);
  bool equal = true;
  for (int i = 0; i < nodes; ++i) {
    const double* node = &v[kSummaryHead + kSummaryPerNode * static_cast<size_t>(i)];
    const int64_t n = static_cast<int64_t>(node[8]);
    if (GetLimbs(&node[1]) != GetLimbs(&first[1])) {
      return MakeError(v1::MISMATCH,
                       absl::StrCat("nodes out of step in gs_check_replicas: node ", first_rank,
                                    " checks after iteration ", GetLimbs(&first[1]), " but node ",
                                    n, " after iteration ", GetLimbs(&node[1])));
    }
    if (node[3] != first[3]) {
      return MakeError(
          v1::MISMATCH,
          absl::StrCat("nodes run different --check-replicas-every: node ", first_rank, " runs ",
                       static_cast<int64_t>(first[3]), " but node ", n, " runs ",
                       static_cast<int64_t>(node[3]), "; every node of the job needs the same"));
    }
    equal = equal && node[7] == 1 && node[5] == first[5] && node[6] == first[6];
  }
  if (equal) return absl::OkStatus();
  return NameFirstDifference(backend, layout, round, collective);
}

}  // namespace gradsync
