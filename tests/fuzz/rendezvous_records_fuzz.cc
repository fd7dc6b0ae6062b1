// Fuzzes the rendezvous records as a daemon reads them from the leader's
// key-value store (daemon/cluster/rendezvous_records.h): the input is a
// record's value, given to every decoder. A refusal names the record's key;
// what is accepted re-encodes to a value that decodes the same.
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "daemon/cluster/rendezvous_records.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_check.h"

namespace gradsync {
namespace {

template <typename T>
void ExpectRefusalNamesKey(const absl::StatusOr<T>& decoded, const std::string& key) {
  if (decoded.ok()) return;
  FUZZ_CHECK(absl::StrContains(decoded.status().message(), key), decoded.status().ToString());
}

}  // namespace
}  // namespace gradsync

// Protobuf logs every string field that is not UTF-8: at fuzzing speed,
// only noise.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradsync;
  const std::optional<std::string> value(std::string(reinterpret_cast<const char*>(data), size));

  const std::string layout_key = LayoutKey(3, 1);
  ExpectRefusalNamesKey(DecodeLayout(layout_key, value), layout_key);

  const std::string caps_key = CapsKey(3);
  ExpectRefusalNamesKey(DecodeCaps(caps_key, value), caps_key);

  const std::string config_key = ConfigKey(3, 2);
  ExpectRefusalNamesKey(DecodeConfig(config_key, value), config_key);

  const std::string plan_key = PlanKey(3, 1, 0);
  absl::StatusOr<PlanStamp> stamp = DecodePlanStamp(plan_key, value);
  ExpectRefusalNamesKey(stamp, plan_key);
  if (stamp.ok()) {
    FUZZ_CHECK(ComparePlanStamps({*stamp, *stamp}).ok(), "a stamp differs from itself");
  }

  // The order must be a permutation of [0, n): try the n it would need.
  const std::string order_key = OrderKey(3);
  for (size_t n : {size_t{0}, size_t{1}, size_t{4}, size % 64}) {
    absl::StatusOr<std::vector<uint32_t>> order = DecodeOrder(order_key, value, n);
    ExpectRefusalNamesKey(order, order_key);
    if (!order.ok()) continue;
    // Empty is node 0's "no order recorded: nobody rebuilds".
    FUZZ_CHECK(order->empty() || order->size() == n, "accepted an order of the wrong length");
    std::vector<bool> seen(n, false);
    for (uint32_t i : *order) {
      FUZZ_CHECK(i < n && !seen[i], "accepted an order that is not a permutation");
      seen[i] = true;
    }
    absl::StatusOr<std::vector<uint32_t>> again = DecodeOrder(order_key, EncodeOrder(*order), n);
    FUZZ_CHECK(again.ok() && *again == *order, "the order changed in the round trip");
  }
  return 0;
}
