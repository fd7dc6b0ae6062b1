// MarkChecksum: what GRADSYNC_DEBUG=detail records of a gradient when it is
// marked ready, and what the daemon recomputes just before reducing it: a
// difference means the trainer wrote the buffer after marking it.
//
// FNV-1a (stable across processes, unlike absl::Hash) folded to the 32 bits
// a readiness entry has room for. 0 is reserved for "not computed", so a
// hash that folds to 0 is reported as 1.
#ifndef GRADSYNC_IPC_MARK_CHECKSUM_H_
#define GRADSYNC_IPC_MARK_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "common/fnv1a.h"

namespace gradsync::ipc {

inline uint32_t MarkChecksum(const void* data, size_t bytes) {
  Fnv1a h;
  h.Add(data, bytes);
  const uint32_t folded = static_cast<uint32_t>(h.hash() ^ (h.hash() >> 32));
  return folded == 0 ? 1 : folded;
}

}  // namespace gradsync::ipc

#endif  // GRADSYNC_IPC_MARK_CHECKSUM_H_
