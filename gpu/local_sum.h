// The daemon's own kernel: dst[i] = scale * sum_k srcs[k][i], for several
// trainers sharing one GPU (their gradients are summed on the device before
// the single NCCL rank of that GPU takes part in the allreduce).
//
// fp16 and bf16 are accumulated in fp32 and rounded once (nearest even);
// fp32 in fp32, fp64 in fp64. Sources are added in order 0, 1, ..., then
// multiplied by `scale`: a host loop doing the same gives the same bits.
//
// The non-finite check (LocalSumArgs::nonfinite_flag set): a result element
// that is not finite (exponent bits all ones, tested on the value as
// stored, so Inf or NaN in any source and an overflowing sum alike) is not
// written; dst receives srcs[0]'s element there instead (unchanged when dst
// is srcs[0], so that trainer's input survives for the culprit search), and
// the launch stores nonfinite_token in *nonfinite_flag (a plain store, only
// on a hit). The flag is never cleared here: a fresh token per launch says
// which launch hit.
//
// Aliasing: dst may be any of the sources (each element is read by the
// thread that writes it, before it writes it); otherwise dst must not
// overlap a source. All pointers are device memory of the stream's GPU
// (or mapped into it: IPC-opened memory of another GPU works over peers).
//
// Plain C++ header (no CUDA C++): the daemon's .cc files include it.
#ifndef GRADSYNC_GPU_LOCAL_SUM_H_
#define GRADSYNC_GPU_LOCAL_SUM_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace gradsync::gpu {

// DType's numbering (common/dtype.h); not included so the .cu needs
// nothing of gradsync.
enum class LocalSumType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

inline constexpr int kMaxLocalSumSources = 16;

// Passed to the kernel by value (kernel parameters, no device copy).
struct LocalSumArgs {
  const void* srcs[kMaxLocalSumSources] = {};
  void* dst = nullptr;
  int nsrcs = 0;                           // 1..kMaxLocalSumSources
  size_t count = 0;                        // elements
  double scale = 1.0;                      // rounded once to the accumulation type, then applied
  unsigned int* nonfinite_flag = nullptr;  // device memory; null: no check
  unsigned int nonfinite_token = 0;
};

// Enqueues the sum on `stream` and returns at once (cudaErrorInvalidValue
// for bad arguments, else the launch's error; count == 0 launches nothing).
// `max_blocks` caps the grid (a grid-stride loop covers the rest); pass
// about 8 per SM, or 0 for a default sized for the largest GPUs. Uses
// 16-byte loads and stores when every pointer is 16-byte aligned. The
// caller has made the stream's GPU current.
cudaError_t LaunchLocalSum(const LocalSumArgs& args, LocalSumType type, int max_blocks,
                           cudaStream_t stream);

}  // namespace gradsync::gpu

#endif  // GRADSYNC_GPU_LOCAL_SUM_H_
