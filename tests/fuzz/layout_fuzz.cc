// Fuzzes Register layouts as the daemon reads them: the input is a
// serialized gradsync.v1.RegisterRequest (what a trainer sends over the
// Local socket) and LayoutFromProto validates its tensors. A refusal is
// INVALID_ARGUMENT; an accepted layout stays within the limits, equals
// itself, and survives the rendezvous record round trip unchanged.
#include <cstdint>
#include <string>

#include "common/layout.h"
#include "daemon/cluster/rendezvous_records.h"
#include "google/protobuf/stubs/logging.h"
#include "gradsync/v1/local.pb.h"
#include "tests/fuzz/fuzz_check.h"

// Protobuf logs every string field that is not UTF-8: at fuzzing speed,
// only noise.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  v1::RegisterRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<Layout> layout = LayoutFromProto(request.tensors());
  if (!layout.ok()) {
    FUZZ_CHECK(layout.status().code() == absl::StatusCode::kInvalidArgument,
               layout.status().ToString());
    FUZZ_CHECK(!layout.status().message().empty(), "a refusal must say why");
    return 0;
  }
  FUZZ_CHECK(!layout->empty() && layout->size() <= kMaxTensors, "tensor count out of bounds");
  uint64_t total = 0;
  for (const TensorInfo& t : *layout) {
    FUZZ_CHECK(t.numel >= 1 && !t.name.empty() && t.name.size() <= kMaxTensorNameBytes,
               Describe(t));
    total += t.bytes();
  }
  FUZZ_CHECK(total <= kMaxLayoutBytes, "accepted a layout over the size limit");
  FUZZ_CHECK(!FirstDifference(*layout, *layout).has_value(), "a layout differs from itself");

  const std::string key = LayoutKey(1, 0);
  absl::StatusOr<Layout> decoded = DecodeLayout(key, EncodeLayout(*layout));
  FUZZ_CHECK(decoded.ok(), decoded.status().ToString());
  const auto difference = FirstDifference(*layout, *decoded);
  FUZZ_CHECK(!difference.has_value(), *difference);
  FUZZ_CHECK(LayoutHash(*layout) == LayoutHash(*decoded), "the hash changed in the round trip");
  return 0;
}
