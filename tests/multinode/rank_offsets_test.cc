// The rank-offset rule both rendezvous apply (daemon/cluster/rank_offsets.h).
#include "daemon/cluster/rank_offsets.h"

#include <gtest/gtest.h>

#include <vector>

namespace gradsync {
namespace {

TEST(RankOffsets, AFreshJobsNodesGetPrefixSumsInNodeRankOrder) {
  EXPECT_EQ(AssignRankOffsets({{2, 3, -1}, {0, 1, -1}, {1, 2, -1}}), (std::vector<int>{3, 0, 1}));
}

TEST(RankOffsets, AFreshJobStartedWithoutSomeRanksLeavesNoGap) {
  EXPECT_EQ(AssignRankOffsets({{0, 2, -1}, {2, 2, -1}}), (std::vector<int>{0, 2}));
}

// 3 nodes x 2, node 1 dead: survivors keep 0-1 and 4-5; a new node 3 takes
// 2-3, not 4-5 (the trainers of the members before it).
TEST(RankOffsets, ANodeJoiningAfterAHoleTakesTheFreeRangeNotAMembers) {
  EXPECT_EQ(AssignRankOffsets({{0, 2, 0}, {2, 2, 4}, {3, 2, -1}}), (std::vector<int>{0, 4, 2}));
}

TEST(RankOffsets, AJoinerLargerThanTheHoleGoesPastEveryHeldRange) {
  EXPECT_EQ(AssignRankOffsets({{0, 2, 0}, {2, 2, 4}, {3, 3, -1}}), (std::vector<int>{0, 4, 6}));
}

TEST(RankOffsets, JoinersFillTheHolesInNodeRankOrder) {
  EXPECT_EQ(AssignRankOffsets({{3, 1, -1}, {0, 1, 0}, {1, 1, -1}, {2, 1, 3}}),
            (std::vector<int>{2, 0, 1, 3}));
}

TEST(RankOffsets, AKeptRangeThatWouldOverlapIsReassignedNeverShared) {
  EXPECT_EQ(AssignRankOffsets({{0, 2, 0}, {1, 2, 1}}), (std::vector<int>{0, 2}));
}

}  // namespace
}  // namespace gradsync
