// ParseLogFields: the inverse of gradsync's key=value log lines — splits a
// message such as `event=attach job=default name="a \"b\""` into its
// fields, unquoting values written by LogValue (log_value.h). Used by the
// structured log outputs (JSON lines, the systemd journal), which carry the
// same fields as keys.
#ifndef GRADSYNC_COMMON_LOG_FIELDS_H_
#define GRADSYNC_COMMON_LOG_FIELDS_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace gradsync {

using LogFields = std::vector<std::pair<std::string, std::string>>;

// Fields in order. Text that is not `key=value` (a key is [A-Za-z0-9_.-]+)
// is kept whole under "message", so nothing logged is ever dropped.
LogFields ParseLogFields(absl::string_view message);

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_LOG_FIELDS_H_
