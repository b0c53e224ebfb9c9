// Plain-CUDA fallback GEMM for what no CUTLASS instantiation covers: operands aligned to fewer
// than 4 bytes (odd K or N with 16-bit types), 16-bit -> fp32 outputs in the forward/dgrad layouts,
// misaligned bias vectors. Correct for any layout / ld / alignment, 64-bit indexing everywhere;
// not fast (shared-memory tiled, 64x64 tile, 4x4 outputs per thread, FMA in float or double).
//
//   D = alpha * (A @ B) + beta * C      (C row-broadcast when c_row_broadcast; C may alias D)
#pragma once

#include <algorithm>

#include "gemm_launch.cuh"

namespace cutlass_nn {
namespace kernels {
namespace fallback {

constexpr int kTile = 64;
constexpr int kTileK = 16;
constexpr int kThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each

template <class T>
__device__ __forceinline__ float to_acc(T v, float) {
  return static_cast<float>(v);
}
__device__ __forceinline__ double to_acc(double v, double) { return v; }

template <class TAB, class TCD, class Acc>
__global__ void __launch_bounds__(kThreads)
    gemm_fallback_kernel(int64_t m, int64_t n, int64_t k, const TAB* __restrict__ a, int64_t lda,
                         bool a_row, const TAB* __restrict__ b, int64_t ldb, bool b_row,
                         const TCD* c, int64_t ldc, TCD* d, int64_t ldd, Acc alpha, Acc beta) {
  __shared__ Acc sa[kTileK][kTile + 1];
  __shared__ Acc sb[kTileK][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t tiles_m = (m + kTile - 1) / kTile, tiles_n = (n + kTile - 1) / kTile;

  for (int64_t tm = blockIdx.x; tm < tiles_m; tm += gridDim.x) {
    for (int64_t tn = blockIdx.y; tn < tiles_n; tn += gridDim.y) {
      const int64_t m0 = tm * kTile, n0 = tn * kTile;
      Acc acc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = Acc(0);

      for (int64_t k0 = 0; k0 < k; k0 += kTileK) {
        // Cooperative loads: kTile x kTileK elements of A and of B, 4 per thread each.
        for (int idx = threadIdx.x; idx < kTile * kTileK; idx += kThreads) {
          int r, kk;
          // Make consecutive threads walk the contiguous dimension of each operand.
          if (a_row) {
            kk = idx % kTileK, r = idx / kTileK;
          } else {
            r = idx % kTile, kk = idx / kTile;
          }
          int64_t gi = m0 + r, gk = k0 + kk;
          Acc v = Acc(0);
          if (gi < m && gk < k) v = to_acc(a_row ? a[gi * lda + gk] : a[gi + gk * lda], Acc(0));
          sa[kk][r] = v;

          if (b_row) {
            r = idx % kTile, kk = idx / kTile;
          } else {
            kk = idx % kTileK, r = idx / kTileK;
          }
          int64_t gj = n0 + r;
          gk = k0 + kk;
          v = Acc(0);
          if (gj < n && gk < k) v = to_acc(b_row ? b[gk * ldb + gj] : b[gk + gj * ldb], Acc(0));
          sb[kk][r] = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kTileK; ++kk) {
          Acc ra[4], rb[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) ra[i] = sa[kk][ty + 16 * i];
#pragma unroll
          for (int j = 0; j < 4; ++j) rb[j] = sb[kk][tx + 16 * j];
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fma(ra[i], rb[j], acc[i][j]);
        }
        __syncthreads();
      }

#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t gi = m0 + ty + 16 * i;
        if (gi >= m) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t gj = n0 + tx + 16 * j;
          if (gj >= n) continue;
          Acc out = alpha * acc[i][j];
          // beta == 0 never reads C (it may hold NaN / be D itself).
          if (beta != Acc(0)) out += beta * to_acc(c[gi * ldc + gj], Acc(0));
          d[gi * ldd + gj] = static_cast<TCD>(out);
        }
      }
    }
  }
}

}  // namespace fallback

template <DType AB, DType CD, Layout LA, Layout LB, int Align, int Config>
struct KernelImpl<KernelTag<KernelFamily::kFallback, AB, CD, LA, LB, Align, Config>> {
  using TAB = detail::element_t<AB>;
  using TCD = detail::element_t<CD>;
  using Acc = typename std::conditional<AB == DType::kFloat64, double, float>::type;

  static GemmStatus launch(const GemmParams& p, void*, size_t, cudaStream_t stream,
                           const char** detail, size_t* workspace_query) {
    if (workspace_query != nullptr) {
      *workspace_query = 0;
      return GemmStatus::kSuccess;
    }
    const int64_t tiles_m = (p.m + fallback::kTile - 1) / fallback::kTile;
    const int64_t tiles_n = (p.n + fallback::kTile - 1) / fallback::kTile;
    // The kernel loops over tiles, so the grid may be capped at the CUDA limits.
    dim3 grid(static_cast<unsigned>(std::min<int64_t>(tiles_m, 0x7fffffff)),
              static_cast<unsigned>(std::min<int64_t>(tiles_n, 65535)));
    const int64_t ldc = p.c_row_broadcast ? 0 : p.ldc;
    fallback::gemm_fallback_kernel<TAB, TCD, Acc><<<grid, fallback::kThreads, 0, stream>>>(
        p.m, p.n, p.k, static_cast<const TAB*>(p.a), p.lda, p.layout_a == Layout::kRowMajor,
        static_cast<const TAB*>(p.b), p.ldb, p.layout_b == Layout::kRowMajor,
        static_cast<const TCD*>(p.c), ldc, static_cast<TCD*>(p.d), p.ldd, static_cast<Acc>(p.alpha),
        static_cast<Acc>(p.beta));
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      return detail::fail(GemmStatus::kLaunchFailed, detail,
                          "cudaGetLastError() after the fallback GEMM launch was not cudaSuccess");
    }
    return GemmStatus::kSuccess;
  }
};

}  // namespace kernels
}  // namespace cutlass_nn
