// See local_sum.h. Memory bound: one pass over the sources, one store per
// element; the non-finite check tests the results in registers. 16-byte vectors when aligned (4
// fp32, 2 fp64, 8 fp16/bf16 per load), a scalar tail, a grid-stride loop so the grid stays small.
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

// Exponent bits all ones: Inf or NaN, tested on the stored representation.
__device__ __forceinline__ bool NotFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}
__device__ __forceinline__ bool NotFinite(double x) {
  return (static_cast<unsigned long long>(__double_as_longlong(x)) & 0x7ff0000000000000ull) ==
         0x7ff0000000000000ull;
}
__device__ __forceinline__ bool NotFinite(__half x) {
  return (__half_as_ushort(x) & 0x7c00u) == 0x7c00u;
}
__device__ __forceinline__ bool NotFinite(__nv_bfloat16 x) {
  return (__bfloat16_as_ushort(x) & 0x7f80u) == 0x7f80u;
}

// Returns whether element i's result was not finite (kCheck only).
template <typename T, bool kCheck>
__device__ __forceinline__ bool SumOne(const LocalSumArgs& args, size_t i,
                                       typename Acc<T>::type scale) {
  using A = typename Acc<T>::type;
  const T first = static_cast<const T*>(args.srcs[0])[i];
  A acc = ToAcc(first);
  for (int k = 1; k < args.nsrcs; ++k) acc += ToAcc(static_cast<const T*>(args.srcs[k])[i]);
  T out = FromAcc<T>(acc * scale);
  const bool bad = kCheck && NotFinite(out);
  if (bad) out = first;  // keeps srcs[0]'s input for the culprit search
  static_cast<T*>(args.dst)[i] = out;
  return bad;
}

// kVector: every pointer is 16-byte aligned. kCheck: args.nonfinite_flag is set.
template <typename T, bool kVector, bool kCheck>
__global__ void __launch_bounds__(kThreads) LocalSumKernel(const LocalSumArgs args) {
  using A = typename Acc<T>::type;
  const A scale = static_cast<A>(args.scale);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t scalar_from = 0;
  bool hit = false;
  if (kVector) {
    constexpr int kN = Pack<T>::kN;
    const size_t npacks = args.count / kN;
    for (size_t p = first; p < npacks; p += stride) {
      A acc[kN];
      const Pack<T> in0 = static_cast<const Pack<T>*>(args.srcs[0])[p];
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[j] = ToAcc(in0.v[j]);
      for (int k = 1; k < args.nsrcs; ++k) {
        const Pack<T> in = static_cast<const Pack<T>*>(args.srcs[k])[p];
#pragma unroll
        for (int j = 0; j < kN; ++j) acc[j] += ToAcc(in.v[j]);
      }
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < kN; ++j) out.v[j] = FromAcc<T>(acc[j] * scale);
      if (kCheck) {
        bool bad = false;
#pragma unroll
        for (int j = 0; j < kN; ++j) bad |= NotFinite(out.v[j]);
        if (bad) {  // rare: keep srcs[0]'s inputs where the result is not finite
#pragma unroll
          for (int j = 0; j < kN; ++j) {
            if (NotFinite(out.v[j])) out.v[j] = in0.v[j];
          }
          hit = true;
        }
      }
      static_cast<Pack<T>*>(args.dst)[p] = out;
    }
    scalar_from = npacks * kN;
  }
  for (size_t i = scalar_from + first; i < args.count; i += stride) {
    if (SumOne<T, kCheck>(args, i, scale)) hit = true;
  }
  // Every hitting thread stores the same token: no atomic needed.
  if (kCheck && hit) *args.nonfinite_flag = args.nonfinite_token;
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
  const void* kernel = nullptr;
  if (args.nonfinite_flag != nullptr) {
    kernel = vector ? reinterpret_cast<const void*>(&LocalSumKernel<T, true, true>)
                    : reinterpret_cast<const void*>(&LocalSumKernel<T, false, true>);
  } else {
    kernel = vector ? reinterpret_cast<const void*>(&LocalSumKernel<T, true, false>)
                    : reinterpret_cast<const void*>(&LocalSumKernel<T, false, false>);
  }
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
