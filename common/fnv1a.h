// FNV-1a, 64 bit: a hash that is stable across processes and builds
// (std::hash and absl::Hash are seeded per process), for values nodes
// compare with each other: layout hashes, bucket-plan fingerprints.
#ifndef GRADSYNC_COMMON_FNV1A_H_
#define GRADSYNC_COMMON_FNV1A_H_

#include <cstddef>
#include <cstdint>

namespace gradsync {

class Fnv1a {
 public:
  void Add(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      hash_ ^= p[i];
      hash_ *= 0x100000001b3ull;
    }
  }
  template <typename T>
  void AddValue(T v) {
    Add(&v, sizeof(v));
  }
  uint64_t hash() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

}  // namespace gradsync

#endif  // GRADSYNC_COMMON_FNV1A_H_
