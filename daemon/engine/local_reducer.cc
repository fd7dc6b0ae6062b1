#include "daemon/engine/local_reducer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>  // non-temporal stores for the kept copies
#endif

#include "common/half.h"
#include "common/half_convert.h"
#include "common/monotonic.h"
#include "daemon/engine/bucket_pieces.h"
#include "daemon/engine/half_average.h"

namespace gradsync {
namespace {

// Elements per chunk: the trainers' slices of one chunk stay in L2 while
// they are summed, divided and copied back.
constexpr size_t kChunkElements = 2048;
// Below this many bytes a bucket is reduced on the calling thread alone:
// waking helpers costs more than it saves.
constexpr uint64_t kParallelThresholdBytes = 256 << 10;

using SliceFinding = LocalReducer::SliceFinding;

// The non-finite check accumulates a "poison" word per block: zero for every
// finite element, nonzero for an Inf or a NaN, OR-ed together and tested
// once per block. It must vectorize at the reducer's -O3 without
// -ffast-math (a float compare reduction does not) and add as few
// instructions per vector as possible (the plain loops are close to the
// memory's limit): x - x is +0 (no bits set) for every finite x and NaN for
// an Inf or a NaN, so floats cost a subtract and an OR.
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "local_reducer's non-finite check needs IEEE x - x: build without -ffinite-math-only"
#endif
inline uint32_t Poison(float v) {
  const float zero_if_finite = v - v;
  uint32_t bits;
  std::memcpy(&bits, &zero_if_finite, sizeof(bits));
  return bits;
}
inline uint64_t Poison(double v) {
  const double zero_if_finite = v - v;
  uint64_t bits;
  std::memcpy(&bits, &zero_if_finite, sizeof(bits));
  return bits;
}
// Halves, on the stored bits: an all-ones exponent plus one carries into
// the sign bit (16-bit lanes, three integer instructions).
inline uint16_t HalfPoison(uint16_t v, uint16_t exponent_mask, uint16_t exponent_one) {
  return static_cast<uint16_t>(((v & exponent_mask) + exponent_one) & 0x8000u);
}

// Copies a chunk into an elastic job's kept sums or kept result. Nothing
// reads those again unless a node dies, so the stores bypass the cache
// (non-temporal, SSE2): no read of the destination's lines before they are
// written, and the trainers' data keeps the cache. The caller fences
// (FenceStreamedStores) before the copy may be read.
void StreamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  const size_t head = std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
  }
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}
// Orders the streamed stores before whatever follows (they are weakly
// ordered): once per kernel call, before the pool hands the piece on.
inline void FenceStreamedStores() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Native element access: float/double are summed in their own precision.
// Poison(): the stored element's poison word (see above).
// kBlocks: the chunk passes convert whole blocks (common/half_convert.h)
// instead of calling Load / Store per element.
template <typename T>
struct Native {
  static constexpr bool kBlocks = false;
  using Acc = T;
  using Flag = decltype(gradsync::Poison(T{}));
  static Acc Load(const T& v) { return v; }
  static T Store(Acc v) { return v; }
  static Flag Poison(T v) { return gradsync::Poison(v); }
};
struct Half16 {
  static constexpr bool kBlocks = false;
  using Acc = float;
  using Flag = uint16_t;
  static float Load(const uint16_t& v) { return Float16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToFloat16(v); }
  static Flag Poison(uint16_t v) { return HalfPoison(v, 0x7c00u, 0x0400u); }
};
struct BHalf16 {
  static constexpr bool kBlocks = false;
  using Acc = float;
  using Flag = uint16_t;
  static float Load(const uint16_t& v) { return BFloat16ToFloat(v); }
  static uint16_t Store(float v) { return FloatToBFloat16(v); }
  static Flag Poison(uint16_t v) { return HalfPoison(v, 0x7f80u, 0x0080u); }
};
// The same conversions a block at a time: F16C / AVX2 lanes where the CPU
// has them, the same bits (half_convert.h), so only the speed differs.
struct Half16Blocks : Half16 {
  static constexpr bool kBlocks = true;
  static void LoadBlock(const uint16_t* in, float* out, size_t n) {
    Float16ToFloatBlock(in, out, n);
  }
  static void StoreBlock(const float* in, uint16_t* out, size_t n) {
    FloatToFloat16Block(in, out, n);
  }
};
struct BHalf16Blocks : BHalf16 {
  static constexpr bool kBlocks = true;
  static void LoadBlock(const uint16_t* in, float* out, size_t n) {
    BFloat16ToFloatBlock(in, out, n);
  }
  static void StoreBlock(const float* in, uint16_t* out, size_t n) {
    FloatToBFloat16Block(in, out, n);
  }
};

// The work of one Reduce call, shared with the worker threads.
struct ReduceWork {
  const std::vector<uint8_t*>* arenas;
  const std::vector<ReduceSpan>* spans;
  size_t elem_size;
  uint64_t total_elements;
  int world_size;
  uint8_t* staging;  // nullptr on one node
  // 0: one node (AverageKernel); 1: sum into staging; 2: write back from staging;
  // 3: sum into trainer 0's memory; 4: divide trainer 0's memory, copy out;
  // 5: only check trainer 0's memory (one trainer, in place, checking).
  int phase;
  void (*kernel)(const ReduceWork&, size_t span, uint64_t first, uint64_t count,
                 uint64_t staging_index, SliceFinding* found);
  BucketPiece piece;       // the cross-node pipeline's current piece (RunPieceSlice)
  SliceFinding* findings;  // per slice; the checking kernels write theirs
  // Elastic jobs (KeptSums, KeptResultSink), else nullptr: the local sum,
  // staged dtype, indexed like staging (phases 1, 3, 5 write it); the
  // average at its arena offsets (phases 2, 4 write it).
  uint8_t* kept_sums = nullptr;
  uint8_t* kept_result = nullptr;
  // Elastic jobs with several local trainers (TrainerInputCopies), else
  // nullptr: per trainer, where its input lands at its arena offsets (the
  // phases that sum the arenas write it).
  uint8_t* const* input_copies = nullptr;
};

// One node: every trainer's memory is read once and the average written
// back once, in a single streaming pass, in blocks of this many elements
// where it needs them (3+ trainers: 256 B of fp32 per trainer). See
// AverageKernel below.
constexpr size_t kStreamBlockElements = 64;

// The first non-finite input among the trainers' elements [first, first +
// count) of `span`, recorded in *found unless it holds an earlier one. Runs
// only where the fused check found something: blocks without a bad input
// are passed over at vector speed (the one-node search covers the whole
// bucket), the bad block is searched element by element.
template <typename T, typename Access>
void FindCulprit(const ReduceWork& job, size_t span, uint64_t first, uint64_t count,
                 SliceFinding* found) {
  if (found->local) return;  // chunks run in order: the one recorded is earlier
  const auto& arenas = *job.arenas;
  const uint64_t offset = (*job.spans)[span].offset;
  auto input = [&](size_t t, uint64_t i) {
    return reinterpret_cast<const T*>(arenas[t] + offset) + first + i;
  };
  for (uint64_t c = 0; c < count; c += kStreamBlockElements) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kStreamBlockElements, count - c));
    typename Access::Flag poison = 0;
    for (size_t t = 0; t < arenas.size(); ++t) {
      const T* block = input(t, c);
      for (size_t i = 0; i < m; ++i) poison |= Access::Poison(block[i]);
    }
    if (poison == 0) continue;
    for (uint64_t i = c; i < c + m; ++i) {
      for (size_t t = 0; t < arenas.size(); ++t) {
        const auto v = Access::Load(*input(t, i));
        if (std::isfinite(v)) continue;
        found->local = true;
        found->trainer = t;
        found->arena_offset = offset + (first + i) * sizeof(T);
        found->value = static_cast<double>(v);
        return;
      }
    }
  }
}

// Calls job.kernel for the piece of every span that falls in [begin, end) of
// the spans' concatenation.
void ForRange(const ReduceWork& job, uint64_t begin, uint64_t end, size_t slice) {
  uint64_t base = 0;
  for (size_t s = 0; s < job.spans->size() && base < end; ++s) {
    const uint64_t n = (*job.spans)[s].bytes / job.elem_size;
    const uint64_t lo = std::max(begin, base), hi = std::min(end, base + n);
    if (lo < hi) job.kernel(job, s, lo - base, hi - lo, lo, &job.findings[slice]);
    base += n;
  }
}

void RunSlice(void* context, size_t slice, size_t slices) {
  const ReduceWork& job = *static_cast<ReduceWork*>(context);
  // Slices end on chunk boundaries so threads never share a cache line.
  const uint64_t chunks = (job.total_elements + kChunkElements - 1) / kChunkElements;
  const uint64_t begin = std::min(job.total_elements, chunks * slice / slices * kChunkElements);
  const uint64_t end = std::min(job.total_elements, chunks * (slice + 1) / slices * kChunkElements);
  ForRange(job, begin, end, slice);
}

// RunSlice over job.piece only: the cross-node path goes piece by piece.
void RunPieceSlice(void* context, size_t slice, size_t slices) {
  const ReduceWork& job = *static_cast<ReduceWork*>(context);
  const uint64_t chunks = (job.piece.count + kChunkElements - 1) / kChunkElements;
  const uint64_t begin = std::min(job.piece.count, chunks * slice / slices * kChunkElements);
  const uint64_t end = std::min(job.piece.count, chunks * (slice + 1) / slices * kChunkElements);
  ForRange(job, job.piece.first + begin, job.piece.first + end, slice);
}

// acc[0, m) = the sum of the local trainers' elements [c, c + m): (a0 + a1)
// + a2 ... With kCheck, returns the sum's poison word, taken in the loop
// that finishes acc (no extra pass over it); else 0.
template <typename T, typename Access, bool kCheck>
auto SumChunk(T* const* src, size_t local, uint64_t c, size_t m, typename Access::Acc* acc) {
  decltype(Poison(acc[0])) poison = 0;
  const T* a0 = src[0] + c;
  if (local == 1) {
    for (size_t i = 0; i < m; ++i) {
      acc[i] = Access::Load(a0[i]);
      if (kCheck) poison |= Poison(acc[i]);
    }
    return poison;
  }
  // The first two trainers in one pass: one fewer sweep over acc.
  const T* a1 = src[1] + c;
  if (kCheck && local == 2) {
    for (size_t i = 0; i < m; ++i) {
      acc[i] = Access::Load(a0[i]) + Access::Load(a1[i]);
      poison |= Poison(acc[i]);
    }
    return poison;
  }
  for (size_t i = 0; i < m; ++i) acc[i] = Access::Load(a0[i]) + Access::Load(a1[i]);
  for (size_t t = 2; t < local; ++t) {
    const T* at = src[t] + c;
    if (kCheck && t + 1 == local) {
      for (size_t i = 0; i < m; ++i) {
        acc[i] += Access::Load(at[i]);
        poison |= Poison(acc[i]);
      }
    } else {
      for (size_t i = 0; i < m; ++i) acc[i] += Access::Load(at[i]);
    }
  }
  return poison;
}

// SumChunk's sum and poison word for halves converted a block at a time:
// each trainer's chunk widened (exactly) into `wide`, then added in the
// same order, so acc holds the same bits.
template <typename Access, bool kCheck>
uint32_t SumChunkBlocks(uint16_t* const* src, size_t local, uint64_t c, size_t m, float* acc) {
  uint32_t poison = 0;
  Access::LoadBlock(src[0] + c, acc, m);
  if (local == 1) {
    if (kCheck) {
      for (size_t i = 0; i < m; ++i) poison |= Poison(acc[i]);
    }
    return poison;
  }
  float wide[kChunkElements];
  for (size_t t = 1; t < local; ++t) {
    Access::LoadBlock(src[t] + c, wide, m);
    if (kCheck && t + 1 == local) {
      for (size_t i = 0; i < m; ++i) {
        acc[i] += wide[i];
        poison |= Poison(acc[i]);
      }
    } else {
      for (size_t i = 0; i < m; ++i) acc[i] += wide[i];
    }
  }
  return poison;
}

// Narrows acc[0, m) into out; with kCheck, the stored halves' poison word.
template <typename T, typename Access, bool kCheck>
typename Access::Flag StoreChunk(const typename Access::Acc* acc, size_t m, T* out) {
  typename Access::Flag poison = 0;
  if constexpr (Access::kBlocks) {
    Access::StoreBlock(acc, out, m);
    if (kCheck) {
      for (size_t i = 0; i < m; ++i) poison |= Access::Poison(out[i]);
    }
  } else if (kCheck) {
    for (size_t i = 0; i < m; ++i) {
      out[i] = Access::Store(acc[i]);
      poison |= Access::Poison(out[i]);
    }
  } else {
    for (size_t i = 0; i < m; ++i) out[i] = Access::Store(acc[i]);
  }
  return poison;
}

// Streams elements [element, element + m) of `span` of every trainer's
// input (src[t] + c) into its copy, at the same arena offsets.
template <typename T>
void CopyInputs(const ReduceWork& job, size_t span, uint64_t element, T* const* src, uint64_t c,
                size_t m) {
  const uint64_t at = (*job.spans)[span].offset + element * sizeof(T);
  for (size_t t = 0; t < job.arenas->size(); ++t) {
    StreamCopy(job.input_copies[t] + at, src[t] + c, m * sizeof(T));
  }
}

template <typename T, typename Access, bool kCheck>
auto SumChunkFor(T* const* src, size_t local, uint64_t c, size_t m, typename Access::Acc* acc) {
  if constexpr (Access::kBlocks) {
    return SumChunkBlocks<Access, kCheck>(src, local, c, m, acc);
  } else {
    return SumChunk<T, Access, kCheck>(src, local, c, m, acc);
  }
}

template <typename T, typename Access, bool kCheck>
void Kernel(const ReduceWork& job, size_t span, uint64_t first, uint64_t count,
            uint64_t staging_index, SliceFinding* found) {
  using Acc = typename Access::Acc;
  const auto& arenas = *job.arenas;
  const size_t local = arenas.size();
  T* src[kMaxLocalTrainers];
  for (size_t t = 0; t < local; ++t) {
    src[t] = reinterpret_cast<T*>(arenas[t] + (*job.spans)[span].offset) + first;
  }
  T* const kept_result =
      job.kept_result == nullptr
          ? nullptr
          : reinterpret_cast<T*>(job.kept_result + (*job.spans)[span].offset) + first;
  const Acc divisor = static_cast<Acc>(job.world_size);
  Acc acc[kChunkElements];
  typename Access::Flag result_bad = 0;
  for (uint64_t c = 0; c < count; c += kChunkElements) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kChunkElements, count - c));
    if (job.phase == 2) {
      const Acc* staged = reinterpret_cast<const Acc*>(job.staging) + staging_index + c;
      for (size_t i = 0; i < m; ++i) acc[i] = staged[i] / divisor;
    } else if (job.phase == 4) {
      // In place: fp32 / fp64 only, never halves.
      const T* a0 = src[0] + c;
      for (size_t i = 0; i < m; ++i) acc[i] = Access::Load(a0[i]) / divisor;
    } else {
      // The local sum is checked before anything is written: every input is
      // still there for FindCulprit.
      if (SumChunkFor<T, Access, kCheck>(src, local, c, m, acc) != 0) {
        FindCulprit<T, Access>(job, span, first + c, m, found);
      }
      // The kept sum is the collective's input, written from acc while it
      // is still in L1 (in place, fp32/fp64 only, it equals what is stored).
      if (job.kept_sums != nullptr) {
        StreamCopy(reinterpret_cast<Acc*>(job.kept_sums) + staging_index + c, acc, m * sizeof(Acc));
      }
      // Each input chunk was just read into L1: copied from there before
      // phase 3 overwrites trainer 0's.
      if (job.input_copies != nullptr) CopyInputs<T>(job, span, first + c, src, c, m);
      if (job.phase == 1) {
        std::memcpy(reinterpret_cast<Acc*>(job.staging) + staging_index + c, acc, m * sizeof(Acc));
        continue;
      }
      if (job.phase == 3) {
        StoreChunk<T, Access, false>(acc, m, src[0] + c);
        continue;
      }
      if (job.phase == 5) continue;
      for (size_t i = 0; i < m; ++i) acc[i] /= divisor;
    }
    // Write back: convert once into trainer 0's memory, copy to the others.
    T* out0 = src[0] + c;
    result_bad |= StoreChunk<T, Access, kCheck>(acc, m, out0);
    for (size_t t = 1; t < local; ++t) std::memcpy(src[t] + c, out0, m * sizeof(T));
    // The kept result from the chunk just stored, still in cache: no second
    // read of trainer 0's memory.
    if (kept_result != nullptr) StreamCopy(kept_result + c, out0, m * sizeof(T));
  }
  if (job.kept_sums != nullptr || kept_result != nullptr || job.input_copies != nullptr) {
    FenceStreamedStores();
  }
  if (kCheck) found->result_bad |= result_bad != 0;
}

// One node: every trainer's memory is read once and the average written
// back once, in a single streaming pass. The chunked Kernel above alternates
// one pass from DRAM with three in-cache passes (divide, store, copy) during
// which no loads are in flight; how much of that the hardware prefetcher
// hides depends on the machine (52% vs 91% of `a += b` on two 2-core VMs).
// Streaming keeps the memory system busy (see docs/PERFORMANCE.md).
//
// Checking (kCheck) stays one pass over memory, and a trainer's input
// that is not finite stays where the culprit search after the pass finds it:
// with one trainer its average is itself not finite (x / world with world
// >= 1 keeps an Inf an Inf of that sign and a NaN a NaN), with more an
// average that is not finite is not written back (its 64-element block
// keeps every trainer's input).
template <typename T, typename Access, bool kCheck>
void AverageOne(T* __restrict a0, uint64_t count, typename Access::Acc divisor,
                SliceFinding* found) {
  typename Access::Flag poison = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const T v = Access::Store(Access::Load(a0[i]) / divisor);
    if (kCheck) poison |= Access::Poison(v);
    a0[i] = v;
  }
  if (kCheck) found->result_bad |= poison != 0;
}

// Two trainers, checking: one loop sums and checks block k into one half of
// `ring` while it stores block k - 1, found clean, from the other half, so
// loads and stores stream together as in the unchecked loop (a separate
// store pass per block cost ~20%; this ~1% on the bench's machine). A bad
// block is never stored. Returns whether any block was bad.
template <typename T, typename Access>
bool AverageTwoChecked(T* a0, T* a1, uint64_t count, typename Access::Acc divisor) {
  constexpr size_t kBlock = kStreamBlockElements;
  alignas(64) T ring[2][kBlock];
  size_t half = 0;
  bool any_bad = false;
  bool pending = false;  // ring[half ^ 1] holds the clean block at `pending_at`
  uint64_t pending_at = 0;
  uint64_t c = 0;
  for (; c + kBlock <= count; c += kBlock, half ^= 1) {
    const T* __restrict x0 = a0 + c;
    const T* __restrict x1 = a1 + c;
    T* __restrict next = ring[half];
    typename Access::Flag poison = 0;
    if (pending) {
      const T* __restrict clean = ring[half ^ 1];
      T* __restrict out0 = a0 + pending_at;
      T* __restrict out1 = a1 + pending_at;
      for (size_t i = 0; i < kBlock; ++i) {
        const T v = Access::Store((Access::Load(x0[i]) + Access::Load(x1[i])) / divisor);
        next[i] = v;
        poison |= Access::Poison(v);
        out0[i] = clean[i];
        out1[i] = clean[i];
      }
    } else {
      for (size_t i = 0; i < kBlock; ++i) {
        const T v = Access::Store((Access::Load(x0[i]) + Access::Load(x1[i])) / divisor);
        next[i] = v;
        poison |= Access::Poison(v);
      }
    }
    any_bad |= poison != 0;
    pending = poison == 0;
    pending_at = c;
  }
  if (pending) {
    std::memcpy(a0 + pending_at, ring[half ^ 1], kBlock * sizeof(T));
    std::memcpy(a1 + pending_at, ring[half ^ 1], kBlock * sizeof(T));
  }
  // The tail, shorter than a block: element by element.
  for (; c < count; ++c) {
    const T v = Access::Store((Access::Load(a0[c]) + Access::Load(a1[c])) / divisor);
    if (Access::Poison(v) != 0) {
      any_bad = true;
      continue;
    }
    a0[c] = v;
    a1[c] = v;
  }
  return any_bad;
}

template <typename T, typename Access, bool kCheck>
void AverageTwo(T* __restrict a0, T* __restrict a1, uint64_t count, typename Access::Acc divisor,
                SliceFinding* found) {
  if (kCheck) {
    if (AverageTwoChecked<T, Access>(a0, a1, count, divisor)) found->result_bad = 1;
    return;
  }
  for (uint64_t i = 0; i < count; ++i) {
    const T v = Access::Store((Access::Load(a0[i]) + Access::Load(a1[i])) / divisor);
    a0[i] = v;
    a1[i] = v;
  }
}

// 3+ trainers: blocks small enough that every trainer's stream stays in
// flight (measured: 64 elements beat 16 and 1024 by 1.3-2x).
template <typename T, typename Access, bool kCheck>
void AverageMany(T* const* src, size_t local, uint64_t count, typename Access::Acc divisor,
                 SliceFinding* found) {
  using Acc = typename Access::Acc;
  for (uint64_t c = 0; c < count; c += kStreamBlockElements) {
    const size_t m = static_cast<size_t>(std::min<uint64_t>(kStreamBlockElements, count - c));
    Acc acc[kStreamBlockElements];
    const T* a0 = src[0] + c;
    const T* a1 = src[1] + c;
    for (size_t i = 0; i < m; ++i) acc[i] = Access::Load(a0[i]) + Access::Load(a1[i]);
    for (size_t t = 2; t < local; ++t) {
      const T* at = src[t] + c;
      for (size_t i = 0; i < m; ++i) acc[i] += Access::Load(at[i]);
    }
    T average[kStreamBlockElements];
    if (kCheck) {
      typename Access::Flag poison = 0;
      for (size_t i = 0; i < m; ++i) {
        average[i] = Access::Store(acc[i] / divisor);
        poison |= Access::Poison(average[i]);
      }
      if (poison != 0) {
        found->result_bad = 1;
        continue;  // the whole block keeps its inputs
      }
    } else {
      for (size_t i = 0; i < m; ++i) average[i] = Access::Store(acc[i] / divisor);
    }
    for (size_t t = 0; t < local; ++t) std::memcpy(src[t] + c, average, m * sizeof(T));
  }
}

template <typename T, typename Access, bool kCheck>
void AverageKernel(const ReduceWork& job, size_t span, uint64_t first, uint64_t count, uint64_t,
                   SliceFinding* found) {
  const auto& arenas = *job.arenas;
  const size_t local = arenas.size();
  const uint64_t offset = (*job.spans)[span].offset;
  const auto divisor = static_cast<typename Access::Acc>(job.world_size);
  T* src[kMaxLocalTrainers];
  for (size_t t = 0; t < local; ++t) src[t] = reinterpret_cast<T*>(arenas[t] + offset) + first;
  // Same operations in the same order as Kernel: ((a0 + a1) + a2 ...) / world.
  if (local == 1) return AverageOne<T, Access, kCheck>(src[0], count, divisor, found);
  if (local == 2) return AverageTwo<T, Access, kCheck>(src[0], src[1], count, divisor, found);
  AverageMany<T, Access, kCheck>(src, local, count, divisor, found);
}

// Halves where the CPU converts blocks of them (common/half_convert.h):
// AverageKernel's pass, same bits, converted a block at a time.
template <DType kDType, bool kCheck>
void HalfBlockAverageKernel(const ReduceWork& job, size_t span, uint64_t first, uint64_t count,
                            uint64_t, SliceFinding* found) {
  const auto& arenas = *job.arenas;
  const uint64_t offset = (*job.spans)[span].offset;
  uint16_t* src[kMaxLocalTrainers];
  for (size_t t = 0; t < arenas.size(); ++t) {
    src[t] = reinterpret_cast<uint16_t*>(arenas[t] + offset) + first;
  }
  const float divisor = static_cast<float>(job.world_size);
  if (AverageHalves(src, arenas.size(), count, divisor, kDType, kCheck)) found->result_bad = 1;
}

using KernelFn = void (*)(const ReduceWork&, size_t, uint64_t, uint64_t, uint64_t, SliceFinding*);

template <bool kCheck>
KernelFn AverageKernelFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &AverageKernel<float, Native<float>, kCheck>;
    case DType::kFloat64:
      return &AverageKernel<double, Native<double>, kCheck>;
    case DType::kFloat16:
      if (HardwareConvertsFloat16()) return &HalfBlockAverageKernel<DType::kFloat16, kCheck>;
      return &AverageKernel<uint16_t, Half16, kCheck>;
    case DType::kBFloat16:
      if (HardwareConvertsBFloat16()) return &HalfBlockAverageKernel<DType::kBFloat16, kCheck>;
      return &AverageKernel<uint16_t, BHalf16, kCheck>;
  }
  return nullptr;
}

template <bool kCheck>
KernelFn KernelFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &Kernel<float, Native<float>, kCheck>;
    case DType::kFloat64:
      return &Kernel<double, Native<double>, kCheck>;
    case DType::kFloat16:
      if (HardwareConvertsFloat16()) return &Kernel<uint16_t, Half16Blocks, kCheck>;
      return &Kernel<uint16_t, Half16, kCheck>;
    case DType::kBFloat16:
      if (HardwareConvertsBFloat16()) return &Kernel<uint16_t, BHalf16Blocks, kCheck>;
      return &Kernel<uint16_t, BHalf16, kCheck>;
  }
  return nullptr;
}

// The culprit search after a one-node pass (AverageKernel left the inputs
// of every non-finite result element in place), over all spans.
template <typename T, typename Access>
void FindCulpritInSpans(const ReduceWork& job, SliceFinding* found) {
  for (size_t s = 0; s < job.spans->size() && !found->local; ++s) {
    FindCulprit<T, Access>(job, s, 0, (*job.spans)[s].bytes / sizeof(T), found);
  }
}

void FindCulpritAfterPass(const ReduceWork& job, DType dtype, SliceFinding* found) {
  switch (dtype) {
    case DType::kFloat32:
      return FindCulpritInSpans<float, Native<float>>(job, found);
    case DType::kFloat64:
      return FindCulpritInSpans<double, Native<double>>(job, found);
    case DType::kFloat16:
      return FindCulpritInSpans<uint16_t, Half16>(job, found);
    case DType::kBFloat16:
      return FindCulpritInSpans<uint16_t, BHalf16>(job, found);
  }
}

// Folds the slices' findings into the report (the lowest slice's culprit
// is the earliest) and clears them for the next run.
void Collect(std::vector<SliceFinding>& findings, NonFiniteReport* report) {
  for (SliceFinding& f : findings) {
    report->result_non_finite |= f.result_bad != 0;
    if (f.local && !report->local) {
      report->local = true;
      report->trainer = f.trainer;
      report->arena_offset = f.arena_offset;
      report->value = f.value;
    }
    f = SliceFinding{};
  }
}

// One node: the single streaming pass, then the culprit search if the
// check found something.
void AverageOnOneNode(WorkerPool& pool, ReduceWork& job, DType dtype, size_t slices,
                      std::vector<SliceFinding>& findings, NonFiniteReport* nonfinite) {
  job.staging = nullptr;
  job.phase = 0;
  job.kernel = nonfinite ? AverageKernelFor<true>(dtype) : AverageKernelFor<false>(dtype);
  pool.Run(&RunSlice, &job, slices);
  if (nonfinite == nullptr) return;
  Collect(findings, nonfinite);
  if (nonfinite->result_non_finite) {
    FindCulpritAfterPass(job, dtype, &findings[0]);
    Collect(findings, nonfinite);
  }
}

// An elastic job shrunk to one node: no collective, so no other node can
// need this result; it is still kept (a copy after the pass, the one-node
// kernels have no chunk in cache to write it from) so that the kept result
// means the same whatever the node count.
void KeepAfterOneNodePass(const uint8_t* arena0, const std::vector<ReduceSpan>& spans,
                          KeptResultSink* kept_result) {
  kept_result->written = true;
  for (const ReduceSpan& s : spans) {
    std::memcpy(kept_result->base + s.offset, arena0 + s.offset, s.bytes);
  }
}

// A piece pipeline's phases as the bucket's critical path (bucket_pieces.h):
// the sums and write-backs that ran while a collective was in flight are
// inside the collective phase, so the phases add up to the bucket's time
// and "local reduce" is only what no collective hid.
void RecordCriticalPath(const PipelineTimings& pipeline, ReduceTimings* timings) {
  timings->local_reduce_ns = pipeline.exposed_sum_ns + pipeline.exposed_write_back_ns;
  timings->collective_ns = pipeline.collective_span_ns;
  timings->write_back_ns = pipeline.exposed_write_back_ns;
}

// The dtype the staging buffer holds (and the backend reduces).
DType StagingDType(DType dtype) {
  return (dtype == DType::kFloat64) ? DType::kFloat64 : DType::kFloat32;
}

}  // namespace

LocalReducer::LocalReducer(size_t threads, uint64_t staging_bytes)
    : pool_(std::max<size_t>(1, threads)), staging_(staging_bytes), findings_(pool_.size()) {
  copies_.reserve(kMaxLocalTrainers);
}

uint64_t LocalReducer::StagingBytes(uint64_t bytes, DType dtype) {
  return bytes / DTypeSize(dtype) * DTypeSize(StagingDType(dtype));
}

namespace {

// One bucket's reduction as the passes read it.
ReduceWork MakeWork(const std::vector<uint8_t*>& arenas, const std::vector<ReduceSpan>& spans,
                    DType dtype, int world_size, bool check, SliceFinding* findings, KeptSums* kept,
                    KeptResultSink* kept_result, const std::vector<uint8_t*>* input_copies) {
  ReduceWork job;
  job.arenas = &arenas;
  job.spans = &spans;
  job.elem_size = DTypeSize(dtype);
  job.world_size = world_size;
  job.kernel = check ? KernelFor<true>(dtype) : KernelFor<false>(dtype);
  job.findings = findings;
  job.kept_sums = kept != nullptr ? kept->sums : nullptr;
  job.kept_result = kept_result != nullptr ? kept_result->base : nullptr;
  job.input_copies = input_copies != nullptr ? input_copies->data() : nullptr;
  uint64_t total_bytes = 0;
  for (const ReduceSpan& s : spans) total_bytes += s.bytes;
  job.total_elements = total_bytes / job.elem_size;
  return job;
}

}  // namespace

absl::Status LocalReducer::Reduce(const std::vector<uint8_t*>& arenas,
                                  const std::vector<ReduceSpan>& spans, DType dtype, int world_size,
                                  Backend& backend, ReduceTimings* timings, size_t threads,
                                  NonFiniteReport* nonfinite, KeptSums* kept,
                                  KeptResultSink* kept_result,
                                  const std::vector<uint8_t*>* input_copies) {
  if ((arenas.empty() && backend.num_nodes() <= 1) || arenas.size() > kMaxLocalTrainers ||
      world_size <= 0) {
    return absl::InvalidArgumentError("bad reduction arguments");
  }
  if (nonfinite) *nonfinite = NonFiniteReport{};
  // A node whose trainers all joined contributes zeros and writes nothing:
  // nothing of its own to check.
  if (arenas.empty()) return ReduceZeros(spans, dtype, backend, timings);
  const bool check = nonfinite != nullptr;
  if (input_copies != nullptr && input_copies->size() != arenas.size()) {
    return absl::InvalidArgumentError("bad reduction arguments: one input copy per arena");
  }
  ReduceWork job = MakeWork(arenas, spans, dtype, world_size, check, findings_.data(), kept,
                            kept_result, input_copies);
  const uint64_t total_bytes = job.total_elements * job.elem_size;
  const size_t usable = (threads == 0) ? pool_.size() : std::min(threads, pool_.size());
  const size_t slices = total_bytes >= kParallelThresholdBytes ? usable : 1;
  if (timings) timings->threads = slices;

  const int64_t t0 = MonotonicNowNs();
  // An iteration redone after the job shrank to this node takes the
  // pieces summed before from their kept sums (the arenas may hold the old
  // world's average): the pieces path below does, its collective a no-op
  // on one node. Otherwise one pass averages the arenas.
  const bool redo_from_kept = kept != nullptr && kept->pieces > 0;
  if (backend.num_nodes() <= 1 && !redo_from_kept) {
    AverageOnOneNode(pool_, job, dtype, slices, findings_, nonfinite);
    if (kept_result != nullptr) KeepAfterOneNodePass(arenas[0], spans, kept_result);
    if (timings) timings->local_reduce_ns = MonotonicNowNs() - t0, timings->collective_ns = 0;
    return absl::OkStatus();
  }

  const DType staged = StagingDType(dtype);
  auto run = [&](int phase, const BucketPiece& piece) {
    job.phase = phase;
    job.piece = piece;
    const bool parallel = piece.count * job.elem_size >= kParallelThresholdBytes;
    pool_.Run(&RunPieceSlice, &job, parallel ? slices : 1);
    if (check) Collect(findings_, nonfinite);
  };
  // Best: a backend that reduces in the trainers' arenas itself. Not for
  // kept sums (the arenas must keep the sum until the collective is known
  // to have run), a kept result (the backend writes the average) nor
  // halves (summed in fp32).
  if (kept == nullptr && kept_result == nullptr && spans.size() == 1 && staged == dtype) {
    copies_.clear();
    for (size_t t = 1; t < arenas.size(); ++t) copies_.push_back(arenas[t] + spans[0].offset);
    if (backend.ReducesInArenas(arenas[0] + spans[0].offset, total_bytes, copies_)) {
      CutBucketPieces(job.total_elements, DTypeSize(dtype), kPieceBytes, &pieces_);
      PipelineTimings pipeline;
      absl::Status status = ReduceInArenas(arenas, spans[0].offset, dtype, world_size, backend,
                                           nonfinite, input_copies == nullptr, run, &pipeline);
      // The backend's collectives include writing the average back.
      if (timings) RecordCriticalPath(pipeline, timings);
      return status;
    }
  }
  // A backend that reduces in another process offers its shared buffer as
  // staging: the local sum lands where the collective runs, no extra copy.
  uint8_t* shared = backend.Staging(job.total_elements * DTypeSize(staged));
  // In place (no staging): the local sum goes into trainer 0's arena, the
  // backend reduces it there, and the average is copied out.
  const bool in_place = shared == nullptr && spans.size() == 1 &&
                        (dtype == DType::kFloat32 || dtype == DType::kFloat64);
  // One node (a redo from kept sums): the plan sized the old world's
  // shared staging, which this backend has none of.
  if (!in_place && backend.num_nodes() <= 1) EnsureStaging(job.total_elements * DTypeSize(staged));
  if (!in_place && shared == nullptr && job.total_elements * DTypeSize(staged) > staging_.size()) {
    return absl::InternalError("bucket is larger than the staging buffer");
  }
  job.staging = in_place ? nullptr : shared != nullptr ? shared : staging_.data();
  // The same cut on every node: it depends on the plan's bucket only. The
  // in-place path cuts by the staged size too, so all paths agree.
  CutBucketPieces(job.total_elements, DTypeSize(staged), kPieceBytes, &pieces_);
  // Where piece's collective input lies (in place: halves never are).
  const size_t unit = DTypeSize(staged);
  auto input = [&](const BucketPiece& piece) {
    return (in_place ? arenas[0] + spans[0].offset : job.staging) + piece.first * unit;
  };
  auto sum = [&](const BucketPiece& piece) {
    const size_t index = static_cast<size_t>(&piece - pieces_.data());
    if (kept != nullptr && index < kept->pieces) {
      std::memcpy(input(piece), kept->sums + piece.first * unit, piece.count * unit);
      return;
    }
    if (!in_place) {
      run(1, piece);
    } else if (arenas.size() > 1) {
      run(3, piece);
    } else if (check) {
      run(5, piece);  // one trainer in place: no sum pass to fuse into, a read-only scan
    } else if (kept != nullptr) {
      // One trainer in place, unchecked: no pass at all to write it from.
      std::memcpy(kept->sums + piece.first * unit, input(piece), piece.count * unit);
    }
    if (kept != nullptr) kept->pieces = index + 1;  // the passes above wrote it
  };
  auto issue = [&](const BucketPiece& piece) {
    uint8_t* data = in_place ? arenas[0] + spans[0].offset : job.staging;
    return backend.IssueAllreduceSum(data + piece.first * DTypeSize(in_place ? dtype : staged),
                                     piece.count, in_place ? dtype : staged);
  };
  auto write_back = [&](const BucketPiece& piece) {
    if (kept_result != nullptr) kept_result->written = true;  // before its first byte
    run(in_place ? 4 : 2, piece);
  };
  PipelineTimings pipeline;
  absl::Status status =
      RunPiecePipeline(pieces_, backend, PieceSteps{sum, issue, write_back}, &pipeline);
  if (timings) RecordCriticalPath(pipeline, timings);
  return status;
}

absl::Status LocalReducer::ReduceInArenas(const std::vector<uint8_t*>& arenas, uint64_t offset,
                                          DType dtype, int world_size, Backend& backend,
                                          NonFiniteReport* nonfinite, bool may_fold_scan,
                                          absl::FunctionRef<void(int, const BucketPiece&)> run,
                                          PipelineTimings* pipeline) {
  const size_t unit = DTypeSize(dtype);
  const bool check = nonfinite != nullptr;
  // One trainer: nothing to sum, only its inputs to check, less those the
  // collective tests itself while reducing (each input is still tested
  // once, by the node that holds it).
  const bool fold = check && may_fold_scan && arenas.size() == 1;
  piece_flags_.assign(pieces_.size(), PieceFlag{});
  auto sum = [&](const BucketPiece& piece) {
    if (arenas.size() > 1) {
      run(3, piece);  // into trainer 0's arena, where the collective runs
    } else if (check) {
      PieceFlag& flag = piece_flags_[static_cast<size_t>(&piece - pieces_.data())];
      if (fold) flag.tested = backend.InputsTestedInCollective(piece.count, dtype);
      ScanUntested(piece, flag.tested, run);
    }
  };
  auto issue = [&](const BucketPiece& piece) {
    const uint64_t at = offset + piece.first * unit;
    copies_.clear();
    for (size_t t = 1; t < arenas.size(); ++t) copies_.push_back(arenas[t] + at);
    PieceFlag& flag = piece_flags_[static_cast<size_t>(&piece - pieces_.data())];
    return backend.IssueAllreduceAverage(arenas[0] + at, piece.count, dtype, world_size, copies_,
                                         check ? &flag.check : nullptr);
  };
  auto write_back = [](const BucketPiece&) {};  // the backend wrote the average
  absl::Status status =
      RunPiecePipeline(pieces_, backend, PieceSteps{sum, issue, write_back}, pipeline);
  if (check && status.ok()) status = CollectPieceChecks(offset, unit, fold, nonfinite);
  return status;
}

void LocalReducer::ScanUntested(const BucketPiece& piece, const ElementSpan& tested,
                                absl::FunctionRef<void(int, const BucketPiece&)> run) {
  if (tested.empty()) return run(5, piece);
  if (tested.begin > 0) run(5, BucketPiece{piece.first, tested.begin});
  if (tested.end < piece.count) {
    run(5, BucketPiece{piece.first + tested.end, piece.count - tested.end});
  }
}

absl::Status LocalReducer::CollectPieceChecks(uint64_t offset, size_t unit, bool fold,
                                              NonFiniteReport* nonfinite) {
  for (size_t p = 0; p < piece_flags_.size(); ++p) {
    const PieceFlag& flag = piece_flags_[p];
    nonfinite->result_non_finite |= flag.check.result_non_finite;
    if (!fold) continue;
    if (!(flag.check.inputs_tested == flag.tested)) {
      return absl::InternalError(absl::StrCat(
          "piece ", p, " of ", pieces_[p].count, " elements: the collective tested inputs [",
          flag.check.inputs_tested.begin, ", ", flag.check.inputs_tested.end, "), not [",
          flag.tested.begin, ", ", flag.tested.end, ") as the scan left them"));
    }
    // The lowest arena offset is the culprit, as when the scan read it all.
    const uint64_t at = offset + (pieces_[p].first + flag.check.input_element) * unit;
    if (flag.check.input_non_finite && (!nonfinite->local || at < nonfinite->arena_offset)) {
      nonfinite->local = true;
      nonfinite->trainer = 0;
      nonfinite->arena_offset = at;
      nonfinite->value = flag.check.input_value;
    }
  }
  return absl::OkStatus();
}

absl::Status LocalReducer::ReduceZeros(const std::vector<ReduceSpan>& spans, DType dtype,
                                       Backend& backend, ReduceTimings* timings) {
  uint64_t total_bytes = 0;
  for (const ReduceSpan& s : spans) total_bytes += s.bytes;
  const DType staged = StagingDType(dtype);
  const uint64_t elements = total_bytes / DTypeSize(dtype);
  uint8_t* staging = backend.Staging(elements * DTypeSize(staged));
  if (staging == nullptr) {
    if (elements * DTypeSize(staged) > staging_.size()) {
      return absl::InternalError("bucket is larger than the staging buffer");
    }
    staging = staging_.data();
  }
  // Zeros, cut into the same pieces as every other node's bucket.
  CutBucketPieces(elements, DTypeSize(staged), kPieceBytes, &pieces_);
  auto sum = [&](const BucketPiece& piece) {
    std::memset(staging + piece.first * DTypeSize(staged), 0, piece.count * DTypeSize(staged));
  };
  auto issue = [&](const BucketPiece& piece) {
    return backend.IssueAllreduceSum(staging + piece.first * DTypeSize(staged), piece.count,
                                     staged);
  };
  auto write_back = [](const BucketPiece&) {};  // nothing of this node's is written
  PipelineTimings pipeline;
  absl::Status status =
      RunPiecePipeline(pieces_, backend, PieceSteps{sum, issue, write_back}, &pipeline);
  if (timings) RecordCriticalPath(pipeline, timings);
  return status;
}

}  // namespace gradsync
