#include "daemon/cluster/rank_offsets.h"

#include <algorithm>
#include <numeric>

namespace gradsync {
namespace {

struct Range {
  int begin = 0;
  int end = 0;  // exclusive
};

// The end of a held range that [begin, begin + size) overlaps; -1: none.
int OverlapEnd(const std::vector<Range>& held, int begin, int size) {
  for (const Range& r : held) {
    if (begin < r.end && r.begin < begin + size) return r.end;
  }
  return -1;
}

}  // namespace

std::vector<int> AssignRankOffsets(const std::vector<RankClaim>& claims) {
  std::vector<size_t> order(claims.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return claims[a].node_rank < claims[b].node_rank; });
  std::vector<int> offsets(claims.size(), -1);
  std::vector<Range> held;
  for (size_t i : order) {
    const RankClaim& c = claims[i];
    if (c.kept_offset < 0 || OverlapEnd(held, c.kept_offset, c.local_size) >= 0) continue;
    offsets[i] = c.kept_offset;
    held.push_back({c.kept_offset, c.kept_offset + c.local_size});
  }
  for (size_t i : order) {
    if (offsets[i] >= 0) continue;
    int begin = 0;
    for (int end = OverlapEnd(held, begin, claims[i].local_size); end >= 0;
         end = OverlapEnd(held, begin, claims[i].local_size)) {
      begin = end;
    }
    offsets[i] = begin;
    held.push_back({begin, begin + claims[i].local_size});
  }
  return offsets;
}

}  // namespace gradsync
