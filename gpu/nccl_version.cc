#include "gpu/nccl_version.h"

#include "absl/strings/str_cat.h"

namespace gradsync::gpu {
namespace {

// NCCL before 2.9 packed versions as major*1000 + minor*100 + patch.
constexpr int kWideEncodingFrom = 10000;

int Major(int code) { return code >= kWideEncodingFrom ? code / 10000 : code / 1000; }

}  // namespace

std::string NcclVersionString(int code) {
  if (code < kWideEncodingFrom) {
    return absl::StrCat(code / 1000, ".", (code / 100) % 10, ".", code % 100);
  }
  return absl::StrCat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

absl::Status CheckNcclVersion(int runtime_code, int header_code) {
  const std::string both = absl::StrCat("library NCCL ", NcclVersionString(runtime_code),
                                        ", built with nccl.h ", NcclVersionString(header_code));
  if (header_code < kMinNcclVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        both, ": gradsync must be built with nccl.h >= ", NcclVersionString(kMinNcclVersion)));
  }
  if (Major(runtime_code) != Major(header_code)) {
    return absl::FailedPreconditionError(
        absl::StrCat(both, ": major versions must match (the header's ABI is compiled in)"));
  }
  if (runtime_code < kMinNcclVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(both, ": gradsync needs NCCL >= ", NcclVersionString(kMinNcclVersion)));
  }
  return absl::OkStatus();
}

}  // namespace gradsync::gpu
