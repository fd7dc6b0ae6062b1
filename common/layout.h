// Layout: the list of gradients a trainer registers, and how two trainers'
// layouts are compared. Every trainer of a job must register the same
// layout (names, dtypes, sizes, devices kinds, in the same order), or the
// collectives would not line up; a mismatch names the first difference.
#ifndef GRADSYNC_COMMON_LAYOUT_H_
#define GRADSYNC_COMMON_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "gradsync/v1/local.pb.h"

namespace gradsync {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  uint64_t numel = 0;
  int32_t device = -1;  // -1: CPU

  uint64_t bytes() const { return numel * DTypeSize(dtype); }
};

using Layout = std::vector<TensorInfo>;

// Limits that keep a malformed registration from exhausting the daemon.
inline constexpr size_t kMaxTensors = 1 << 20;
inline constexpr uint64_t kMaxLayoutBytes = uint64_t{64} << 30;  // 64 GiB per trainer
inline constexpr size_t kMaxTensorNameBytes = 1024;

// Validates the specs (dtype, numel >= 1, names unique and non-empty, total
// size) and converts them. Errors name the offending tensor.
absl::StatusOr<Layout> LayoutFromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& specs);

// A stable 64-bit hash of the layout (names, dtypes, sizes, CPU/GPU).
uint64_t LayoutHash(const Layout& layout);

// nullopt if equal; otherwise a description of the first difference, e.g.
// "tensor 3: 'fc2.weight' float32[1024] vs 'fc2.weight' float32[2048]".
std::optional<std::string> FirstDifference(const Layout& a, const Layout& b);

std::string Describe(const TensorInfo& t);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_LAYOUT_H_
