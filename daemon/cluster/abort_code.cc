#include "daemon/cluster/abort_code.h"

#include "common/status_code.h"

namespace gradsync {

v1::Code CodeAfterAbort(v1::Code own, const absl::Status& reported) {
  const v1::Code code = CodeOf(reported);
  return code == v1::INVALID_ARGUMENT || code == v1::MISMATCH ? code : own;
}

}  // namespace gradsync
