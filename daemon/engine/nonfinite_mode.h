// NonFiniteMode: what the daemon does when an iteration's gradients hold a
// NaN or an Inf (--nonfinite). See docs/DESIGN.md "Non-finite gradients".
#ifndef GRADSYNC_DAEMON_ENGINE_NONFINITE_MODE_H_
#define GRADSYNC_DAEMON_ENGINE_NONFINITE_MODE_H_

#include <string>

#include "absl/status/statusor.h"

namespace gradsync {

enum class NonFiniteMode {
  kError,  // the iteration fails on every trainer, naming the culprit
  kSkip,   // every trainer is told not to apply this iteration's gradients
  kOff,    // no check
};

// "error" | "skip" | "off"; the error names the flag.
absl::StatusOr<NonFiniteMode> ParseNonFiniteMode(const std::string& text);
const char* NonFiniteModeName(NonFiniteMode mode);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_ENGINE_NONFINITE_MODE_H_
