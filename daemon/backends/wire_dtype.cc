#include "daemon/backends/wire_dtype.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace gradsync {

const char* WireDTypeName(WireDType wire) {
  switch (wire) {
    case WireDType::kOff:
      return "off";
    case WireDType::kBFloat16:
      return "bf16";
    case WireDType::kFloat16:
      return "fp16";
  }
  return "?";
}

absl::StatusOr<WireDType> ParseWireDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (WireDType w : {WireDType::kOff, WireDType::kBFloat16, WireDType::kFloat16}) {
    if (lower == WireDTypeName(w)) return w;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--wire-dtype '", name, "' is not one of off, bf16, fp16"));
}

}  // namespace gradsync
