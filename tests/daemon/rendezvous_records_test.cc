// The rendezvous records round-trip, and a garbage, missing or inconsistent
// record is refused with an error that names its key (never a crash).
#include "daemon/cluster/rendezvous_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "common/status_code.h"

namespace gradsync {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// What a record written by the old hand-made string format, or by anything
// else that is not the expected message, looks like.
const std::vector<std::string> kGarbage = {"25 1", "7 12 0.5 1", "1,2,3", "\xff\xff\xff"};

void ExpectRefused(const absl::Status& status, const std::string& key) {
  EXPECT_EQ(CodeOf(status), v1::INTERNAL) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(key));
}

TEST(RendezvousRecords, KeysAreScopedAsBefore) {
  EXPECT_EQ(LayoutKey(3, 1), "g3/layout/1");
  EXPECT_EQ(CapsKey(3), "g3/caps");
  EXPECT_EQ(OrderKey(3), "g3/order");
  EXPECT_EQ(ConfigKey(3, 9), "g3/config/9");
  EXPECT_EQ(PlanKey(3, 4, 1), "g3/plan/4/1");
  EXPECT_EQ(CheckReplicasEveryKey(3, 1), "g3/check_replicas_every/1");
}

TEST(RendezvousRecords, CapsRoundTrip) {
  absl::StatusOr<BucketCaps> caps = DecodeCaps(CapsKey(1), EncodeCaps(25, 0.5));
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_EQ(caps->cap_bytes, 25u << 20);
  EXPECT_EQ(caps->first_cap_bytes, 1u << 19);
}

TEST(RendezvousRecords, RefusesBadCapsNamingTheKey) {
  for (const std::string& garbage : kGarbage) {
    ExpectRefused(DecodeCaps(CapsKey(4), garbage).status(), "g4/caps");
  }
  ExpectRefused(DecodeCaps(CapsKey(4), std::nullopt).status(), "g4/caps");
  ExpectRefused(DecodeCaps(CapsKey(4), EncodeCaps(0, 1)).status(), "g4/caps");
}

// Caps whose bytes do not fit in 64 bits are refused, not converted.
TEST(RendezvousRecords, RefusesCapsTooLargeForBytesNamingTheKey) {
  ExpectRefused(DecodeCaps(CapsKey(4), EncodeCaps(1e30, 1)).status(), "g4/caps");
  ExpectRefused(DecodeCaps(CapsKey(4), EncodeCaps(1, 0x1p44)).status(), "g4/caps");
  ExpectRefused(DecodeCaps(CapsKey(4), EncodeCaps(HUGE_VAL, 1)).status(), "g4/caps");
  ExpectRefused(DecodeConfig(ConfigKey(7, 2), EncodeConfig(7, 12, 1e30, 1)).status(),
                "g7/config/2");
  absl::StatusOr<BucketCaps> largest = DecodeCaps(CapsKey(4), EncodeCaps(0x1p43, 1));
  ASSERT_TRUE(largest.ok()) << largest.status();
  EXPECT_EQ(largest->cap_bytes, uint64_t{1} << 63);
}

TEST(RendezvousRecords, ConfigRoundTrip) {
  absl::StatusOr<JobConfigChange> c = DecodeConfig(ConfigKey(7, 2), EncodeConfig(7, 12, 0.001, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->generation, 7u);
  EXPECT_EQ(c->at_iteration, 12u);
  EXPECT_EQ(c->bucket_cap_mb, 0.001);
  EXPECT_EQ(c->first_bucket_cap_mb, 2);
  EXPECT_EQ(c->caps.cap_bytes, static_cast<uint64_t>(0.001 * (1 << 20)));
  EXPECT_EQ(c->caps.first_cap_bytes, 2u << 20);
}

TEST(RendezvousRecords, RefusesBadConfigNamingTheKey) {
  for (const std::string& garbage : kGarbage) {
    ExpectRefused(DecodeConfig(ConfigKey(7, 2), garbage).status(), "g7/config/2");
  }
  // Parses (an empty message), but carries no caps.
  ExpectRefused(DecodeConfig(ConfigKey(7, 2), std::string()).status(), "g7/config/2");
}

TEST(RendezvousRecords, PlanStampRoundTrip) {
  const PlanStamp stamp{3, 0xfedcba9876543210ull, 25, 43};
  absl::StatusOr<PlanStamp> s = DecodePlanStamp(PlanKey(1, 3, 0), EncodePlanStamp(stamp));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->plan_version, 3u);
  EXPECT_EQ(s->fingerprint, 0xfedcba9876543210ull);
  EXPECT_EQ(s->iteration, 25u);
  EXPECT_EQ(s->config_version, 43u);
  ExpectRefused(DecodePlanStamp(PlanKey(1, 3, 2), std::nullopt).status(), "g1/plan/3/2");
}

// Node 0 applied config version 43 at iteration 25, node 1
// version 44 there: that is MISMATCH naming both, not a crash in Gloo.
TEST(RendezvousRecords, DivergedPlansAreAMismatchNamingBothVersions) {
  const PlanStamp zero{3, 0x1111, 25, 43};
  EXPECT_TRUE(ComparePlanStamps({zero, zero, zero}).ok());
  const absl::Status st = ComparePlanStamps({zero, zero, PlanStamp{3, 0x2222, 25, 44}});
  EXPECT_EQ(CodeOf(st), v1::MISMATCH) << st;
  EXPECT_THAT(std::string(st.message()),
              AllOf(HasSubstr("bucket plans diverged at plan version 3"),
                    HasSubstr("node 0 has config version 43 from iteration 25 (plan fingerprint "
                              "0000000000001111)"),
                    HasSubstr("node 2 has config version 44 from iteration 25 (plan fingerprint "
                              "0000000000002222)")));
  // Same buckets by chance, but switched at another iteration: still diverged.
  EXPECT_EQ(CodeOf(ComparePlanStamps({zero, PlanStamp{3, 0x1111, 40, 43}})), v1::MISMATCH);
}

TEST(RendezvousRecords, OrderRoundTrip) {
  absl::StatusOr<std::vector<uint32_t>> order = DecodeOrder(OrderKey(1), EncodeOrder({2, 0, 1}), 3);
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(*order, (std::vector<uint32_t>{2, 0, 1}));
}

// Node 0 observed no order (its local rank 0 joined at once): every node
// reads "no rebuild".
TEST(RendezvousRecords, EmptyOrderMeansNoRebuild) {
  absl::StatusOr<std::vector<uint32_t>> order = DecodeOrder(OrderKey(1), EncodeOrder({}), 3);
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_TRUE(order->empty());
}

TEST(RendezvousRecords, RefusesBadOrderNamingTheKey) {
  for (const std::string& garbage : kGarbage) {
    ExpectRefused(DecodeOrder(OrderKey(5), garbage, 3).status(), "g5/order");
  }
  ExpectRefused(DecodeOrder(OrderKey(5), std::nullopt, 3).status(), "g5/order");
  // Well-formed messages that are not a permutation of the 3 tensors.
  const absl::Status wrong_size = DecodeOrder(OrderKey(5), EncodeOrder({0, 1}), 3).status();
  ExpectRefused(wrong_size, "g5/order");
  EXPECT_THAT(std::string(wrong_size.message()), AllOf(HasSubstr("2 indices"), HasSubstr("3")));
  ExpectRefused(DecodeOrder(OrderKey(5), EncodeOrder({0, 1, 1}), 3).status(), "g5/order");
  ExpectRefused(DecodeOrder(OrderKey(5), EncodeOrder({0, 1, 3}), 3).status(), "g5/order");
}

TEST(RendezvousRecords, LayoutRoundTrip) {
  const Layout layout = {{"w", DType::kFloat32, 10, -1}, {"b", DType::kFloat64, 1, -1}};
  absl::StatusOr<Layout> decoded = DecodeLayout(LayoutKey(1, 0), EncodeLayout(layout));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_EQ(decoded->size(), 2u);
  EXPECT_EQ((*decoded)[0].name, "w");
  EXPECT_EQ((*decoded)[1].dtype, DType::kFloat64);
  EXPECT_EQ((*decoded)[1].numel, 1u);
}

TEST(RendezvousRecords, RefusesBadLayoutNamingTheKey) {
  for (const std::string& garbage : kGarbage) {
    ExpectRefused(DecodeLayout(LayoutKey(1, 2), garbage).status(), "g1/layout/2");
  }
  ExpectRefused(DecodeLayout(LayoutKey(1, 2), std::nullopt).status(), "g1/layout/2");
  // Parses, but is no valid registration (no tensors).
  ExpectRefused(DecodeLayout(LayoutKey(1, 2), std::string()).status(), "g1/layout/2");
}

}  // namespace
}  // namespace gradsync
