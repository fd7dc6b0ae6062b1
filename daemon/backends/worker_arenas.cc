#include "daemon/backends/worker_arenas.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_code.h"
#include "common/status_macros.h"
#include "daemon/backends/average_math.h"

namespace gradsync {
namespace {

// Elements per chunk: a chunk is divided, then copied to every other
// trainer while it is still in L1.
constexpr size_t kChunkElements = 2048;

template <typename T, typename Bits, typename Div>
bool AverageChunks(T* sum, size_t count, Div div, const std::vector<char*>& copies, bool check) {
  Bits poison = 0;
  for (size_t c = 0; c < count; c += kChunkElements) {
    const size_t m = std::min(kChunkElements, count - c);
    T* chunk = sum + c;
    if (check) {
      for (size_t i = 0; i < m; ++i) {
        chunk[i] = div(chunk[i]);
        poison |= Poison<T, Bits>(chunk[i]);
      }
    } else {
      for (size_t i = 0; i < m; ++i) chunk[i] = div(chunk[i]);
    }
    for (char* copy : copies) std::memcpy(reinterpret_cast<T*>(copy) + c, chunk, m * sizeof(T));
  }
  return poison != 0;
}

template <typename T, typename Bits>
bool Average(T* sum, size_t count, int divisor, const std::vector<char*>& copies, bool check) {
  if (IsPowerOfTwo(divisor)) {
    const Divide<T, true> div{T{1} / static_cast<T>(divisor)};
    return AverageChunks<T, Bits>(sum, count, div, copies, check);
  }
  const Divide<T, false> div{static_cast<T>(divisor)};
  return AverageChunks<T, Bits>(sum, count, div, copies, check);
}

// The poison of the elements of [from, to) outside [skip_begin, skip_end).
template <typename T, typename Bits>
Bits PoisonOutside(const T* v, size_t from, size_t to, size_t skip_begin, size_t skip_end) {
  Bits poison = 0;
  const auto scan = [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) poison |= Poison<T, Bits>(v[i]);
  };
  scan(from, std::min(to, std::max(from, skip_begin)));
  scan(std::max(from, std::min(to, skip_end)), to);
  return poison;
}

template <typename T, typename Bits>
bool CopyChunks(const T* average, size_t count, size_t checked_begin, size_t checked_end,
                const std::vector<char*>& copies, bool check) {
  Bits poison = 0;
  for (size_t c = 0; c < count; c += kChunkElements) {
    const size_t m = std::min(kChunkElements, count - c);
    if (check) poison |= PoisonOutside<T, Bits>(average, c, c + m, checked_begin, checked_end);
    for (char* copy : copies) {
      std::memcpy(reinterpret_cast<T*>(copy) + c, average + c, m * sizeof(T));
    }
  }
  return poison != 0;
}

}  // namespace

absl::Status WorkerArenas::Map(
    const google::protobuf::RepeatedPtrField<v1::GlooWorkerArena>& arenas) {
  mapped_.clear();
  std::vector<Mapped> mapped;
  for (const v1::GlooWorkerArena& arena : arenas) {
    ASSIGN_OR_RETURN(ipc::SharedSegment segment, ipc::SharedSegment::Open(arena.segment()));
    if (static_cast<uint64_t>(segment.device()) != arena.device() ||
        static_cast<uint64_t>(segment.inode()) != arena.inode()) {
      return MakeError(v1::INTERNAL,
                       absl::StrCat("segment ", arena.segment(),
                                    " no longer names the daemon's segment: another object "
                                    "took the name"));
    }
    if (arena.offset() > segment.size() || arena.bytes() > segment.size() - arena.offset()) {
      return MakeError(v1::INTERNAL, absl::StrCat("segment ", arena.segment(), " holds ",
                                                  segment.size(), " bytes, not an arena of ",
                                                  arena.bytes(), " at ", arena.offset()));
    }
    Mapped m;
    ASSIGN_OR_RETURN(m.guard, ipc::TruncationGuard::Watch(segment.data(), segment.size()));
    m.segment = std::move(segment);
    m.offset = arena.offset();
    m.bytes = arena.bytes();
    mapped.push_back(std::move(m));
  }
  mapped_ = std::move(mapped);
  return absl::OkStatus();
}

char* WorkerArenas::At(int index, uint64_t offset, uint64_t bytes) const {
  if (index < 0 || static_cast<size_t>(index) >= mapped_.size()) return nullptr;
  const Mapped& m = mapped_[static_cast<size_t>(index)];
  if (offset > m.bytes || bytes > m.bytes - offset) return nullptr;
  return static_cast<char*>(m.segment.data()) + m.offset + offset;
}

absl::Status WorkerArenas::CheckWhole(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= mapped_.size()) return absl::OkStatus();
  const Mapped& m = mapped_[static_cast<size_t>(index)];
  if (!m.guard->truncated()) return absl::OkStatus();
  return MakeError(v1::INVALID_ARGUMENT,
                   absl::StrCat("the trainer's segment ", m.segment.name(),
                                " was cut short while the Gloo worker reduced in it"));
}

bool WriteAverage(char* sum, size_t count, DType dtype, int divisor,
                  const std::vector<char*>& copies, bool check) {
  if (dtype == DType::kFloat64) {
    return Average<double, uint64_t>(reinterpret_cast<double*>(sum), count, divisor, copies, check);
  }
  return Average<float, uint32_t>(reinterpret_cast<float*>(sum), count, divisor, copies, check);
}

bool CopyAverage(const char* average, size_t count, DType dtype, size_t checked_begin,
                 size_t checked_end, const std::vector<char*>& copies, bool check) {
  if (dtype == DType::kFloat64) {
    return CopyChunks<double, uint64_t>(reinterpret_cast<const double*>(average), count,
                                        checked_begin, checked_end, copies, check);
  }
  return CopyChunks<float, uint32_t>(reinterpret_cast<const float*>(average), count, checked_begin,
                                     checked_end, copies, check);
}

}  // namespace gradsync
