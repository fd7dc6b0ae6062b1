// WireDType: the element type of the cross-node hop (--wire-dtype). fp32
// buckets are summed locally in fp32, cast once to the wire type for the
// cross-node allreduce and cast back (like DDP's bf16 compression hook):
// half the bytes on the wire for about 3 (bf16) or 4 (fp16) fewer decimal
// digits. Every node of a job must use the same one (checked at join).
#ifndef GRADSYNC_DAEMON_BACKENDS_WIRE_DTYPE_H_
#define GRADSYNC_DAEMON_BACKENDS_WIRE_DTYPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradsync {

enum class WireDType {
  kOff = 0,       // the bucket's own dtype crosses the wire
  kBFloat16 = 1,  // fp32 range, 8 significant bits
  kFloat16 = 2,   // 11 significant bits, finite up to 65504 (saturates)
};

// "off", "bf16", "fp16" (the flag's spellings).
const char* WireDTypeName(WireDType wire);
// INVALID_ARGUMENT naming the value and the accepted ones.
absl::StatusOr<WireDType> ParseWireDType(absl::string_view name);

}  // namespace gradsync

#endif  // GRADSYNC_DAEMON_BACKENDS_WIRE_DTYPE_H_
