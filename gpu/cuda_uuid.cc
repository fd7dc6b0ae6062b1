#include "gpu/cuda_uuid.h"

#include "absl/strings/match.h"

namespace gradsync::gpu {

DeviceId FormatGpuUuid(const void* bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* b = static_cast<const unsigned char*>(bytes);
  std::string out = "GPU-";
  out.reserve(40);
  for (int i = 0; i < 16; ++i) {
    // 8-4-4-4-12 hex digits, as nvidia-smi -L prints them.
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[b[i] >> 4];
    out += kHex[b[i] & 0xf];
  }
  return out;
}

bool SameGpu(const DeviceId& a, const DeviceId& b) { return absl::EqualsIgnoreCase(a, b); }

}  // namespace gradsync::gpu
