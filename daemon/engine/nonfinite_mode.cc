#include "daemon/engine/nonfinite_mode.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradsync {

absl::StatusOr<NonFiniteMode> ParseNonFiniteMode(const std::string& text) {
  if (text == "error") return NonFiniteMode::kError;
  if (text == "skip") return NonFiniteMode::kSkip;
  if (text == "off") return NonFiniteMode::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("--nonfinite ", text, " must be error, skip or off"));
}

const char* NonFiniteModeName(NonFiniteMode mode) {
  switch (mode) {
    case NonFiniteMode::kError:
      return "error";
    case NonFiniteMode::kSkip:
      return "skip";
    case NonFiniteMode::kOff:
      return "off";
  }
  return "?";
}

}  // namespace gradsync
