// The simulation's "kernels": what the CUDA local-sum kernel computes, on
// the host. Shared by SumAsync and the simulated collectives, so that every
// rank sums in the same order and gets bit-identical results.
#ifndef GRADSYNC_GPU_SIM_SIM_KERNELS_H_
#define GRADSYNC_GPU_SIM_SIM_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace gradsync::gpu::sim {

// dst[i] = scale * (srcs[0][i] + srcs[1][i] + ...), summed in srcs order;
// fp16/bf16 accumulate in fp32 and round once, fp32 in fp32, fp64 in fp64.
// dst may be one of srcs (exactly, not partially overlapping).
// `nonfinite_flag` non-null: the CUDA kernel's non-finite check
// (gpu/local_sum.h): where a result element is not finite (its exponent bits
// all ones), dst receives srcs[0]'s element instead and *nonfinite_flag
// becomes `token`.
void SumKernel(void* dst, const std::vector<const void*>& srcs, size_t count, DType dtype,
               double scale, uint32_t* nonfinite_flag = nullptr, uint32_t token = 0);

}  // namespace gradsync::gpu::sim

#endif  // GRADSYNC_GPU_SIM_SIM_KERNELS_H_
