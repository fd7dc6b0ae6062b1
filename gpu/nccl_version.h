// Which NCCL library gradsyncd accepts, given the nccl.h it was built with.
//
// The ABI of ncclConfig_t and the enums is compiled in from the header, so
// the library's major version must equal the header's. And the library must
// be at least 2.19: non-blocking init, ncclCommFinalize and the abort fixes
// the collectives rely on. A newer or older minor of the same major is
// accepted (ncclConfig_t carries its size and version).
#ifndef GRADSYNC_GPU_NCCL_VERSION_H_
#define GRADSYNC_GPU_NCCL_VERSION_H_

#include <string>

#include "absl/status/status.h"

namespace gradsync::gpu {

// The oldest NCCL accepted.
inline constexpr int kMinNcclVersion = 21900;  // 2.19.0

// OK, or FAILED_PRECONDITION naming both versions: the library
// (`runtime_code`, from ncclGetVersion) or the header (`header_code`,
// NCCL_VERSION_CODE) is older than kMinNcclVersion, or their majors differ.
absl::Status CheckNcclVersion(int runtime_code, int header_code);

// "2.28.9" from a version code (both encodings: 2.28.9 is 22809, before
// 2.9 it was 2708 for 2.7.8).
std::string NcclVersionString(int code);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_NCCL_VERSION_H_
