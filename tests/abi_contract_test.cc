// The C ABI (client/gradsync.h) and the wire protocol (local.proto) number
// their status codes and dtypes the same way; the daemon sends proto codes
// that the client returns unchanged as gs_status. This pins that contract.
#include <gtest/gtest.h>

#include <cstddef>

#include "client/gradsync.h"
#include "gradsync/v1/local.pb.h"

namespace {

TEST(AbiContract, StatusCodesMatchProto) {
  using gradsync::v1::Code;
  EXPECT_EQ(GS_OK, static_cast<int>(Code::OK));
  EXPECT_EQ(GS_ERR_INVALID_ARGUMENT, static_cast<int>(Code::INVALID_ARGUMENT));
  EXPECT_EQ(GS_ERR_UNAVAILABLE, static_cast<int>(Code::UNAVAILABLE));
  EXPECT_EQ(GS_ERR_MISMATCH, static_cast<int>(Code::MISMATCH));
  EXPECT_EQ(GS_ERR_PEER_FAILED, static_cast<int>(Code::PEER_FAILED));
  EXPECT_EQ(GS_ERR_TIMEOUT, static_cast<int>(Code::TIMEOUT));
  EXPECT_EQ(GS_ERR_STATE, static_cast<int>(Code::STATE));
  EXPECT_EQ(GS_ERR_INTERNAL, static_cast<int>(Code::INTERNAL));
  EXPECT_EQ(GS_ERR_RESOURCE_EXHAUSTED, static_cast<int>(Code::RESOURCE_EXHAUSTED));
  EXPECT_EQ(gradsync::v1::Code_MAX, GS_ERR_RESOURCE_EXHAUSTED);
}

TEST(AbiContract, DTypesMatchProto) {
  EXPECT_EQ(GS_FLOAT32, static_cast<int>(gradsync::v1::FLOAT32));
  EXPECT_EQ(GS_FLOAT64, static_cast<int>(gradsync::v1::FLOAT64));
  EXPECT_EQ(GS_FLOAT16, static_cast<int>(gradsync::v1::FLOAT16));
  EXPECT_EQ(GS_BFLOAT16, static_cast<int>(gradsync::v1::BFLOAT16));
  EXPECT_EQ(gradsync::v1::DType_MAX, GS_BFLOAT16);
}

// The options struct only grows at its end: the original fields keep their
// offsets (binaries built before size existed pass exactly those 16 bytes),
// and size follows them.
TEST(AbiContract, ConnectOptionsGrowAtTheEnd) {
  EXPECT_EQ(offsetof(gs_connect_options, socket_path), 0u);
  EXPECT_EQ(offsetof(gs_connect_options, local_rank), sizeof(void*));
  EXPECT_EQ(offsetof(gs_connect_options, timeout_ms), sizeof(void*) + sizeof(int));
  EXPECT_EQ(offsetof(gs_connect_options, size), sizeof(void*) + 2 * sizeof(int));
  const gs_connect_options init = GS_CONNECT_OPTIONS_INIT;
  EXPECT_EQ(init.size, sizeof(gs_connect_options));
  EXPECT_EQ(init.socket_path, nullptr);
  EXPECT_EQ(init.local_rank, -1);  // -1: $LOCAL_RANK
  EXPECT_EQ(init.timeout_ms, 0);
}

// gs_job_info is read back by size, so size comes first and the struct
// only grows at its end.
TEST(AbiContract, JobInfoGrowsAtTheEnd) {
  EXPECT_EQ(offsetof(gs_job_info, size), 0u);
  EXPECT_EQ(offsetof(gs_job_info, iteration), sizeof(size_t));
  EXPECT_EQ(offsetof(gs_job_info, world_size), sizeof(size_t) + sizeof(uint64_t));
  EXPECT_EQ(offsetof(gs_job_info, rank), sizeof(size_t) + sizeof(uint64_t) + sizeof(int));
  const gs_job_info init = GS_JOB_INFO_INIT;
  EXPECT_EQ(init.size, sizeof(gs_job_info));
  EXPECT_EQ(offsetof(gs_job_info, check_replicas_due),
            sizeof(size_t) + sizeof(uint64_t) + 2 * sizeof(int));
  EXPECT_EQ(init.rank, -1);
  EXPECT_EQ(init.check_replicas_due, 0);
  // Added after check_replicas_due, at the end (after its padding).
  EXPECT_GE(offsetof(gs_job_info, membership_changes),
            offsetof(gs_job_info, check_replicas_due) + sizeof(int));
  EXPECT_EQ(init.membership_changes, 0u);
  // Then nodes_joined and joined_running_job (joining a running job).
  EXPECT_EQ(offsetof(gs_job_info, nodes_joined),
            offsetof(gs_job_info, membership_changes) + sizeof(uint64_t));
  EXPECT_EQ(offsetof(gs_job_info, joined_running_job),
            offsetof(gs_job_info, nodes_joined) + sizeof(uint64_t));
  EXPECT_GE(sizeof(gs_job_info), offsetof(gs_job_info, joined_running_job) + sizeof(int));
  EXPECT_EQ(init.nodes_joined, 0u);
  EXPECT_EQ(init.joined_running_job, 0);
  // Then trainers_joined and catch_up_root (a trainer rejoining a running job).
  EXPECT_GE(offsetof(gs_job_info, trainers_joined),
            offsetof(gs_job_info, joined_running_job) + sizeof(int));
  EXPECT_EQ(offsetof(gs_job_info, catch_up_root),
            offsetof(gs_job_info, trainers_joined) + sizeof(uint64_t));
  EXPECT_GE(sizeof(gs_job_info), offsetof(gs_job_info, catch_up_root) + sizeof(int));
  EXPECT_EQ(init.trainers_joined, 0u);
  EXPECT_EQ(init.catch_up_root, 0);
}

TEST(AbiContract, VersionCodeOrdersReleases) {
  EXPECT_EQ(GS_VERSION, GS_VERSION_CODE(GS_VERSION_MAJOR, GS_VERSION_MINOR, GS_VERSION_PATCH));
  EXPECT_LT(GS_VERSION_CODE(0, 9, 99), GS_VERSION_CODE(1, 0, 0));
}

TEST(AbiContract, RegisterRequestRoundTrips) {
  gradsync::v1::RegisterRequest req;
  req.set_session_id(42);
  auto* t = req.add_tensors();
  t->set_name("fc1.weight");
  t->set_dtype(gradsync::v1::BFLOAT16);
  t->set_numel(1u << 20);
  t->set_device(-1);
  std::string wire;
  ASSERT_TRUE(req.SerializeToString(&wire));
  gradsync::v1::RegisterRequest back;
  ASSERT_TRUE(back.ParseFromString(wire));
  ASSERT_EQ(back.tensors_size(), 1);
  EXPECT_EQ(back.tensors(0).name(), "fc1.weight");
  EXPECT_EQ(back.tensors(0).numel(), 1u << 20);
  EXPECT_EQ(back.tensors(0).device(), -1);
}

}  // namespace
