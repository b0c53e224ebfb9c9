// The batched split-K's reduction pass (split_k_reduce.h): one thread per group of four output
// columns (one column where n is not a multiple of 4), the slices read as float4 (they are
// contiguous, 16-byte aligned by the dispatcher), the C term and the output element by element in
// their own dtype (any leading dimension and alignment).
#include "split_k_reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "dtype_pack.cuh"  // to_acc / from_acc

namespace cutlass_nn {
namespace kernels {
namespace {

enum class CTerm : int { kNone = 0, kScaled = 1, kRowBroadcast = 2 };

// Columns [j, j + kVec) of row i: the partial sums in slice order, then the C term, rounded once.
template <typename T, int kVec>
__global__ void reduce_k_slices_kernel(const float* __restrict__ partials, int slices, int64_t m,
                                       int64_t n, CTerm c_term, const T* c, int64_t ldc,
                                       float beta, T* d, int64_t ldd) {
  const int64_t groups_per_row = n / kVec;
  const int64_t groups = m * groups_per_row;
  const int64_t slice = m * n;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < groups;
       g += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = g / groups_per_row, j = (g % groups_per_row) * kVec;
    float acc[kVec];
    const float* p = partials + i * n + j;
    if constexpr (kVec == 4) {
      const float4 v = *reinterpret_cast<const float4*>(p);
      acc[0] = v.x, acc[1] = v.y, acc[2] = v.z, acc[3] = v.w;
      for (int l = 1; l < slices; ++l) {
        const float4 w = *reinterpret_cast<const float4*>(p + l * slice);
        acc[0] += w.x, acc[1] += w.y, acc[2] += w.z, acc[3] += w.w;
      }
    } else {
      acc[0] = p[0];
      for (int l = 1; l < slices; ++l) acc[0] += p[l * slice];
    }
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      float x = acc[v];
      if (c_term == CTerm::kScaled) {
        x += beta * static_cast<float>(to_acc(c[i * ldc + j + v]));
      } else if (c_term == CTerm::kRowBroadcast) {
        x += beta * static_cast<float>(to_acc(c[j + v]));  // GemmParams: beta times the bias
      }
      d[i * ldd + j + v] = from_acc<T>(x);
    }
  }
}

template <typename T>
GemmStatus reduce_impl(const float* partials, int slices, const GemmParams& out,
                       cudaStream_t stream) {
  CTerm c_term = CTerm::kNone;
  if (out.c != nullptr && out.c_row_broadcast) {
    c_term = CTerm::kRowBroadcast;
  } else if (out.c != nullptr && out.beta != 0.0f) {
    c_term = CTerm::kScaled;
  }
  // The slices' rows are 16-byte vectors where n is a multiple of 4 (always, for the
  // dispatcher's plans); C and D are accessed element by element, at any alignment.
  const bool vec4 = out.n % 4 == 0;
  const int64_t groups = out.m * (vec4 ? out.n / 4 : out.n);
  const int threads = 256;
  const int64_t wanted = (groups + threads - 1) / threads;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, 8192)));
  const T* c = static_cast<const T*>(out.c);
  T* d = static_cast<T*>(out.d);
  if (vec4) {
    reduce_k_slices_kernel<T, 4><<<blocks, threads, 0, stream>>>(
        partials, slices, out.m, out.n, c_term, c, out.ldc, out.beta, d, out.ldd);
  } else {
    reduce_k_slices_kernel<T, 1><<<blocks, threads, 0, stream>>>(
        partials, slices, out.m, out.n, c_term, c, out.ldc, out.beta, d, out.ldd);
  }
  return cudaGetLastError() == cudaSuccess ? GemmStatus::kSuccess : GemmStatus::kLaunchFailed;
}

}  // namespace

GemmStatus reduce_k_slices(const float* partials, int slices, const GemmParams& out,
                           cudaStream_t stream) {
  if (out.m < 1 || out.n < 1) return GemmStatus::kSuccess;
  switch (out.dtype_cd) {
    case DType::kFloat16: return reduce_impl<__half>(partials, slices, out, stream);
    case DType::kBFloat16: return reduce_impl<__nv_bfloat16>(partials, slices, out, stream);
    case DType::kFloat32: return reduce_impl<float>(partials, slices, out, stream);
    case DType::kFloat64: break;
  }
  return GemmStatus::kUnsupported;
}

}  // namespace kernels
}  // namespace cutlass_nn
