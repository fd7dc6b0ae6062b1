// See local_sum.h. Memory bound: one pass over the sources, one store per
// element. 16-byte vectors when aligned (4 fp32, 2 fp64, 8 fp16/bf16 per
// load), a scalar tail, a grid-stride loop so the grid stays small.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gpu/local_sum.h"

namespace gradsync::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kDefaultMaxBlocks = 4096;  // 8 per SM on GPUs up to 512 SMs

// The accumulation type: fp32 except for fp64.
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};

__device__ __forceinline__ float ToAcc(float x) { return x; }
__device__ __forceinline__ double ToAcc(double x) { return x; }
__device__ __forceinline__ float ToAcc(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToAcc(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromAcc(typename Acc<T>::type x);
template <>
__device__ __forceinline__ float FromAcc<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double FromAcc<double>(double x) {
  return x;
}
template <>
__device__ __forceinline__ __half FromAcc<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromAcc<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// 16 bytes of T, loaded and stored as one vector access.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

template <typename T>
__device__ __forceinline__ void SumOne(const LocalSumArgs& args, size_t i,
                                       typename Acc<T>::type scale) {
  using A = typename Acc<T>::type;
  A acc = ToAcc(static_cast<const T*>(args.srcs[0])[i]);
  for (int k = 1; k < args.nsrcs; ++k) acc += ToAcc(static_cast<const T*>(args.srcs[k])[i]);
  static_cast<T*>(args.dst)[i] = FromAcc<T>(acc * scale);
}

// kVector: every pointer is 16-byte aligned.
template <typename T, bool kVector>
__global__ void __launch_bounds__(kThreads) LocalSumKernel(const LocalSumArgs args) {
  using A = typename Acc<T>::type;
  const A scale = static_cast<A>(args.scale);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t scalar_from = 0;
  if (kVector) {
    constexpr int kN = Pack<T>::kN;
    const size_t npacks = args.count / kN;
    for (size_t p = first; p < npacks; p += stride) {
      A acc[kN];
      Pack<T> in = static_cast<const Pack<T>*>(args.srcs[0])[p];
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[j] = ToAcc(in.v[j]);
      for (int k = 1; k < args.nsrcs; ++k) {
        in = static_cast<const Pack<T>*>(args.srcs[k])[p];
#pragma unroll
        for (int j = 0; j < kN; ++j) acc[j] += ToAcc(in.v[j]);
      }
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < kN; ++j) out.v[j] = FromAcc<T>(acc[j] * scale);
      static_cast<Pack<T>*>(args.dst)[p] = out;
    }
    scalar_from = npacks * kN;
  }
  for (size_t i = scalar_from + first; i < args.count; i += stride) SumOne<T>(args, i, scale);
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
cudaError_t Launch(const LocalSumArgs& args, int max_blocks, cudaStream_t stream) {
  bool vector = Aligned16(args.dst);
  for (int k = 0; k < args.nsrcs; ++k) vector = vector && Aligned16(args.srcs[k]);
  const size_t work = vector ? (args.count + Pack<T>::kN - 1) / Pack<T>::kN : args.count;
  const size_t cap = static_cast<size_t>(max_blocks > 0 ? max_blocks : kDefaultMaxBlocks);
  size_t blocks = (work + kThreads - 1) / kThreads;
  if (blocks > cap) blocks = cap;
  const void* kernel = vector ? reinterpret_cast<const void*>(&LocalSumKernel<T, true>)
                              : reinterpret_cast<const void*>(&LocalSumKernel<T, false>);
  void* params[] = {const_cast<LocalSumArgs*>(&args)};
  // cudaLaunchKernel returns this launch's own error; <<<>>> + cudaGetLastError
  // could report a stale error of an earlier call on this thread instead.
  // Launch errors only: the kernel runs later.
  return cudaLaunchKernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), params, 0,
                          stream);
}

}  // namespace

cudaError_t LaunchLocalSum(const LocalSumArgs& args, LocalSumType type, int max_blocks,
                           cudaStream_t stream) {
  if (args.nsrcs < 1 || args.nsrcs > kMaxLocalSumSources || args.dst == nullptr) {
    return cudaErrorInvalidValue;
  }
  for (int k = 0; k < args.nsrcs; ++k) {
    if (args.srcs[k] == nullptr) return cudaErrorInvalidValue;
  }
  if (args.count == 0) return cudaSuccess;
  switch (type) {
    case LocalSumType::kFloat32:
      return Launch<float>(args, max_blocks, stream);
    case LocalSumType::kFloat64:
      return Launch<double>(args, max_blocks, stream);
    case LocalSumType::kFloat16:
      return Launch<__half>(args, max_blocks, stream);
    case LocalSumType::kBFloat16:
      return Launch<__nv_bfloat16>(args, max_blocks, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gradsync::gpu
