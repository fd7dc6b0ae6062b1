// Which NCCL library is accepted (gpu/nccl_version): no NCCL or GPU needed.
#include "gpu/nccl_version.h"

#include <string>

#include "gtest/gtest.h"

namespace gradsync::gpu {
namespace {

void ExpectRefusedNaming(const absl::Status& s, const std::string& runtime,
                         const std::string& header, const std::string& why) {
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  const std::string msg(s.message());
  EXPECT_NE(msg.find("NCCL " + runtime), std::string::npos) << msg;
  EXPECT_NE(msg.find("nccl.h " + header), std::string::npos) << msg;
  EXPECT_NE(msg.find(why), std::string::npos) << msg;
}

TEST(NcclVersionTest, TheSameMajorAtLeast219IsAccepted) {
  EXPECT_TRUE(CheckNcclVersion(22809, 22809).ok());
  EXPECT_TRUE(CheckNcclVersion(21900, 22809).ok());  // older minor than the header
  EXPECT_TRUE(CheckNcclVersion(23001, 22809).ok());  // newer minor
  EXPECT_TRUE(CheckNcclVersion(22809, 21900).ok());
}

TEST(NcclVersionTest, OlderThan219IsRefused) {
  ExpectRefusedNaming(CheckNcclVersion(21803, 22809), "2.18.3", "2.28.9", ">= 2.19.0");
  // The encoding before 2.9: 2.8.4.
  ExpectRefusedNaming(CheckNcclVersion(2804, 22809), "2.8.4", "2.28.9", ">= 2.19.0");
}

TEST(NcclVersionTest, AMajorMismatchIsRefused) {
  ExpectRefusedNaming(CheckNcclVersion(30002, 22809), "3.0.2", "2.28.9", "major versions");
  ExpectRefusedNaming(CheckNcclVersion(1000, 22809), "1.0.0", "2.28.9", "major versions");
}

TEST(NcclVersionTest, AHeaderOlderThan219IsRefused) {
  ExpectRefusedNaming(CheckNcclVersion(22809, 21803), "2.28.9", "2.18.3", "built with nccl.h >=");
}

TEST(NcclVersionTest, VersionStrings) {
  EXPECT_EQ(NcclVersionString(22809), "2.28.9");
  EXPECT_EQ(NcclVersionString(21900), "2.19.0");
  EXPECT_EQ(NcclVersionString(2708), "2.7.8");
}

}  // namespace
}  // namespace gradsync::gpu
