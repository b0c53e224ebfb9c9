// Torch-free elementwise / reduction kernels of cutlass_nn (see elementwise.h).
//
//  * launch_add2:       out = a + b, one 16-byte pack per thread (scalar grid-stride fallback).
//  * launch_scale_inplace: x *= *factor, one 16-byte pack per thread like add2; nothing but the
//                       factor's read when it is 1.
//  * launch_column_sum: out[j] = sum_i x[i * ld + j], deterministic single pass (no atomics,
//                       no workspace): each block owns a 64-byte-wide strip of columns and
//                       reduces all rows of it, first per thread in registers, then across
//                       the block's row groups in shared memory in a fixed order.

#include "elementwise.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "dtype_pack.cuh"  // AccType, to_acc / from_acc, Pack16
#include "launch_helpers.h"  // resolve_multiprocessors, aligned16

namespace cutlass_nn {
namespace kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// add2
// ---------------------------------------------------------------------------------------------

constexpr int kAddThreads = 256;
// Scalar path: a grid-stride loop over at most 8 blocks x 256 threads per SM (2048 resident
// threads, the sm_80 / sm_90 maximum).
constexpr int kAddBlocksPerSm = 8;
// Vector path: one 16-byte pack of each operand per thread and as many blocks as that takes
// (the grid-stride loop then runs once), so blocks retire and are replaced in address order.
// The persistent form (8 blocks per SM looping over the array) measured 0.93-0.94x torch.add at
// 256M elements on an H200, with one or two packs per thread per step (benchmarks/NOTES.md v0.5).
constexpr int64_t kAddMaxBlocks = 0x7fffffff;

template <typename T> __device__ __forceinline__ T add_one(T x, T y) {
  // 16-bit: compute in float, round once (torch's opmath behaviour). fp32 / fp64: native.
  return from_acc<T>(to_acc(x) + to_acc(y));
}

// Vector path: all three pointers are 16-byte aligned. The first `nvec` packs are handled
// by the grid-stride loop; the < kN leftover elements by the first threads of the grid.
template <typename T>
__global__ void __launch_bounds__(kAddThreads)
    add2_vec_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                    int64_t nvec, int64_t numel) {
  using P = Pack16<T>;
  constexpr int kN = P::kN;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const P* pa = reinterpret_cast<const P*>(a);
  const P* pb = reinterpret_cast<const P*>(b);
  P* po = reinterpret_cast<P*>(out);
  for (int64_t i = tid; i < nvec; i += stride) {
    const P va = pa[i];
    const P vb = pb[i];
    P vo;
#pragma unroll
    for (int k = 0; k < kN; ++k) vo.v[k] = add_one(va.v[k], vb.v[k]);
    po[i] = vo;
  }
  // Tail: numel - nvec * kN < kN <= 8 < blockDim.x elements, one per thread of block 0.
  const int64_t t = nvec * kN + tid;
  if (t < numel) out[t] = add_one(a[t], b[t]);
}

// Scalar path (some pointer not 16-byte aligned).
template <typename T>
__global__ void __launch_bounds__(kAddThreads)
    add2_scalar_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                       int64_t numel) {
  // (A 4x unrolled variant measured slower for fp16 on H100: 1.2 vs 1.5 TB/s.)
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < numel; i += stride) out[i] = add_one(a[i], b[i]);
}


template <typename T>
cudaError_t add2_impl(const void* a, const void* b, void* out, int64_t numel,
                      int multiprocessors, cudaStream_t stream) {
  constexpr int kN = Pack16<T>::kN;
  const T* ta = static_cast<const T*>(a);
  const T* tb = static_cast<const T*>(b);
  T* to = static_cast<T*>(out);
  if (aligned16(a) && aligned16(b) && aligned16(out)) {
    const int64_t nvec = numel / kN;
    // At least one block so that a numel < kN (pure tail) still runs.
    const int64_t needed = std::max<int64_t>(1, (nvec + kAddThreads - 1) / kAddThreads);
    const int blocks = static_cast<int>(std::min(needed, kAddMaxBlocks));
    add2_vec_kernel<T><<<blocks, kAddThreads, 0, stream>>>(ta, tb, to, nvec, numel);
  } else {
    const int64_t max_blocks =
        static_cast<int64_t>(resolve_multiprocessors(multiprocessors)) * kAddBlocksPerSm;
    const int64_t needed = (numel + kAddThreads - 1) / kAddThreads;
    const int blocks = static_cast<int>(std::min(needed, max_blocks));
    add2_scalar_kernel<T><<<blocks, kAddThreads, 0, stream>>>(ta, tb, to, numel);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// scale_inplace
// ---------------------------------------------------------------------------------------------
//
// The grid shapes are add2's (one pack per thread, as many blocks as that takes; a grid-stride
// scalar loop when x is not 16-byte aligned). Every thread reads the factor (one L2-resident
// value) and returns at once when it is 1.

template <typename T>
__global__ void __launch_bounds__(kAddThreads)
    scale_vec_kernel(T* __restrict__ x, const Acc<T>* __restrict__ factor, int64_t nvec,
                     int64_t numel) {
  const Acc<T> f = *factor;
  if (f == Acc<T>(1)) return;
  constexpr int kN = Pack16<T>::kN;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < nvec; i += stride) {
    Acc<T> v[kN];
    load_vec<T, kN>(x + i * kN, v);
#pragma unroll
    for (int k = 0; k < kN; ++k) v[k] *= f;
    store_vec<T, kN>(x + i * kN, v);
  }
  // Tail: fewer than kN elements, one per thread of block 0.
  const int64_t t = nvec * kN + tid;
  if (t < numel) x[t] = from_acc<T>(to_acc(x[t]) * f);
}

template <typename T>
__global__ void __launch_bounds__(kAddThreads)
    scale_scalar_kernel(T* __restrict__ x, const Acc<T>* __restrict__ factor, int64_t numel) {
  const Acc<T> f = *factor;
  if (f == Acc<T>(1)) return;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < numel; i += stride) x[i] = from_acc<T>(to_acc(x[i]) * f);
}

template <typename T>
cudaError_t scale_impl(void* x, const void* factor, int64_t numel, int multiprocessors,
                       cudaStream_t stream) {
  constexpr int kN = Pack16<T>::kN;
  T* tx = static_cast<T*>(x);
  const Acc<T>* f = static_cast<const Acc<T>*>(factor);
  if (aligned16(x)) {
    const int64_t nvec = numel / kN;
    const int64_t needed = std::max<int64_t>(1, (nvec + kAddThreads - 1) / kAddThreads);
    const int blocks = static_cast<int>(std::min(needed, kAddMaxBlocks));
    scale_vec_kernel<T><<<blocks, kAddThreads, 0, stream>>>(tx, f, nvec, numel);
  } else {
    const int64_t max_blocks =
        static_cast<int64_t>(resolve_multiprocessors(multiprocessors)) * kAddBlocksPerSm;
    const int64_t needed = (numel + kAddThreads - 1) / kAddThreads;
    const int blocks = static_cast<int>(std::min(needed, max_blocks));
    scale_scalar_kernel<T><<<blocks, kAddThreads, 0, stream>>>(tx, f, numel);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// column_sum
// ---------------------------------------------------------------------------------------------
//
// Block shape: kTx threads along columns x blockDim.y (= ty, a power of two) row groups.
// A block owns a strip of kStripCols columns = 64 bytes of every row, so each row segment a
// warp touches is two full 32-byte sectors (fully coalesced) while strips stay narrow enough
// that a 4096-column fp16 matrix still gives 128 blocks (~1 per SM on H100) and fp32 gives 256.
// Thread (tx, ty) sums rows ty, ty + blockDim.y, ... of columns [tx * kV, tx * kV + kV) of the
// strip into kV registers (kV = 16 / sizeof(T) with 16-byte loads, or 1 on the scalar path),
// then the blockDim.y partial rows are reduced by a fixed-shape tree in shared memory. The
// summation order depends only on (rows, block shape), so results are bitwise reproducible.

constexpr int kStripBytes = 64;
constexpr int kColSumMaxThreads = 512;
constexpr int kColSumMinBlocks = 2;  // 2 x 512 threads per SM, <= 64 registers per thread
constexpr int kColSumMaxTy = 128;  // caps the smem use at 128 * 64 / 2 * 4 B = 16 KiB (fp16)
// Rows unrolled per thread so that ~64 bytes of independent loads are in flight per thread:
// 4 x 16-byte packs on the vector path, 8 to 16 scalar loads on the scalar path.
// (A struct constant rather than a constexpr function: usable from host and device code
// without --expt-relaxed-constexpr.)
template <typename T, int kV> struct RowUnroll {
  static constexpr int kLoadBytes = kV * static_cast<int>(sizeof(T));
  static constexpr int value = kLoadBytes >= 16 ? 4 : (64 / kLoadBytes > 16 ? 16 : 64 / kLoadBytes);
};

template <typename T, int kV>
__device__ __forceinline__ void load_cols(const T* __restrict__ p, typename AccType<T>::type (&v)[kV]) {
  if constexpr (kV == 1) {
    v[0] = to_acc(p[0]);
  } else {
    static_assert(kV == Pack16<T>::kN, "vector width must be one 16-byte pack");
    const Pack16<T> pk = *reinterpret_cast<const Pack16<T>*>(p);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = to_acc(pk.v[k]);
  }
}

template <typename T, typename OutT, int kV>
__global__ void __launch_bounds__(kColSumMaxThreads, kColSumMinBlocks)
    column_sum_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld,
                      OutT* __restrict__ out, int64_t num_strips) {
  using Acc = typename AccType<T>::type;
  constexpr int kStripCols = kStripBytes / static_cast<int>(sizeof(T));
  constexpr int kTx = kStripCols / kV;
  constexpr int kRowUnroll = RowUnroll<T, kV>::value;
  static_assert(kTx * kV == kStripCols, "strip must be a whole number of vectors");

  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);  // [blockDim.y][kStripCols]

  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int ny = blockDim.y;

  for (int64_t strip = blockIdx.x; strip < num_strips; strip += gridDim.x) {
    const int64_t col0 = strip * kStripCols + static_cast<int64_t>(tx) * kV;
    Acc acc[kV];
#pragma unroll
    for (int k = 0; k < kV; ++k) acc[k] = Acc(0);

    if (col0 + kV <= cols) {
      // Full vector of columns: rows unrolled by kRowUnroll so that several loads are in
      // flight before the dependent adds (accumulation order stays row-ascending).
      const T* p = x + col0;
      int64_t i = ty;
      for (; i + (kRowUnroll - 1) * static_cast<int64_t>(ny) < rows;
           i += kRowUnroll * static_cast<int64_t>(ny)) {
        Acc v[kRowUnroll][kV];
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u)
          load_cols<T, kV>(p + (i + static_cast<int64_t>(u) * ny) * ld, v[u]);
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u)
#pragma unroll
          for (int k = 0; k < kV; ++k) acc[k] += v[u][k];
      }
      for (; i < rows; i += ny) {
        Acc v[kV];
        load_cols<T, kV>(p + i * ld, v);
#pragma unroll
        for (int k = 0; k < kV; ++k) acc[k] += v[k];
      }
    } else if (col0 < cols) {
      // Ragged last vector of the matrix (vector path only): element-wise loads.
      for (int64_t i = ty; i < rows; i += ny) {
        const T* p = x + i * ld + col0;
#pragma unroll
        for (int k = 0; k < kV; ++k)
          if (col0 + k < cols) acc[k] += to_acc(p[k]);
      }
    }

    // Cross-row-group reduction: smem[ty][c], then a halving tree over ty in which thread
    // (flat id f) adds element f + half * kStripCols into element f.
#pragma unroll
    for (int k = 0; k < kV; ++k) smem[ty * kStripCols + tx * kV + k] = acc[k];
    __syncthreads();
    const int flat = ty * kTx + tx;
    const int nthreads = ny * kTx;
    for (int half = ny / 2; half > 0; half /= 2) {
      const int n = half * kStripCols;
      for (int f = flat; f < n; f += nthreads) smem[f] += smem[f + n];
      __syncthreads();
    }
    for (int f = flat; f < kStripCols; f += nthreads) {
      const int64_t c = strip * kStripCols + f;
      if (c < cols) out[c] = from_acc<OutT>(smem[f]);
    }
    __syncthreads();  // smem is reused by the next strip of this block
  }
}

int floor_pow2(int64_t v) {
  int p = 1;
  while (static_cast<int64_t>(p) * 2 <= v) p *= 2;
  return p;
}

template <typename T, typename OutT, int kV>
cudaError_t column_sum_launch(const T* x, int64_t rows, int64_t cols, int64_t ld, OutT* out,
                              cudaStream_t stream) {
  using Acc = typename AccType<T>::type;
  constexpr int kStripCols = kStripBytes / static_cast<int>(sizeof(T));
  constexpr int kTx = kStripCols / kV;
  constexpr int kRowUnroll = RowUnroll<T, kV>::value;
  const int max_ty = std::min(kColSumMaxTy, kColSumMaxThreads / kTx);
  // Enough row groups that every thread has ~kRowUnroll rows or more: tall matrices get
  // max_ty (up to 512 threads/block; with 2 blocks/SM resident a 4096-column fp16 or fp32
  // matrix is a single wave on H100, 64 B of loads in flight per thread),
  // short ones (rows = 16) small blocks, so no threads idle. Depends on rows only, hence
  // deterministic for a given shape.
  const int64_t want = (rows + kRowUnroll - 1) / kRowUnroll;
  int ty = std::min<int64_t>(max_ty, floor_pow2(std::max<int64_t>(1, want)));
  // Keep at least one full warp per block.
  while (ty * kTx < 32 && ty < max_ty) ty *= 2;

  const int64_t num_strips = (cols + kStripCols - 1) / kStripCols;
  const int blocks = static_cast<int>(std::min<int64_t>(num_strips, 0x7fffffff));
  const size_t smem = static_cast<size_t>(ty) * kStripCols * sizeof(Acc);
  column_sum_kernel<T, OutT, kV>
      <<<blocks, dim3(kTx, ty), smem, stream>>>(x, rows, cols, ld, out, num_strips);
  return cudaGetLastError();
}

template <typename T, typename OutT>
cudaError_t column_sum_impl(const void* x, int64_t rows, int64_t cols, int64_t ld, void* out,
                            cudaStream_t stream) {
  constexpr int kN = Pack16<T>::kN;
  const T* tx = static_cast<const T*>(x);
  OutT* to = static_cast<OutT*>(out);
  // 16-byte loads need every row start to be 16-byte aligned: x aligned and ld a multiple
  // of the pack (ld is irrelevant for a single row).
  const bool vec = aligned16(x) && (rows <= 1 || ld % kN == 0);
  if (vec) return column_sum_launch<T, OutT, kN>(tx, rows, cols, ld, to, stream);
  return column_sum_launch<T, OutT, 1>(tx, rows, cols, ld, to, stream);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

cudaError_t launch_add2(DType dtype, const void* a, const void* b, void* out, int64_t numel,
                        int multiprocessors, cudaStream_t stream) {
  if (numel < 0) return cudaErrorInvalidValue;
  if (numel == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat16: return add2_impl<__half>(a, b, out, numel, multiprocessors, stream);
    case DType::kBFloat16:
      return add2_impl<__nv_bfloat16>(a, b, out, numel, multiprocessors, stream);
    case DType::kFloat32: return add2_impl<float>(a, b, out, numel, multiprocessors, stream);
    case DType::kFloat64: return add2_impl<double>(a, b, out, numel, multiprocessors, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_scale_inplace(DType dtype, void* x, const void* factor, int64_t numel,
                                 int multiprocessors, cudaStream_t stream) {
  if (numel < 0) return cudaErrorInvalidValue;
  if (numel == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat16: return scale_impl<__half>(x, factor, numel, multiprocessors, stream);
    case DType::kBFloat16:
      return scale_impl<__nv_bfloat16>(x, factor, numel, multiprocessors, stream);
    case DType::kFloat32: return scale_impl<float>(x, factor, numel, multiprocessors, stream);
    case DType::kFloat64: return scale_impl<double>(x, factor, numel, multiprocessors, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_column_sum(DType dtype, const void* x, int64_t rows, int64_t cols, int64_t ld,
                              DType out_dtype, void* out, int multiprocessors,
                              cudaStream_t stream) {
  // One block per 64-byte column strip; the grid does not depend on the SM count (that keeps
  // the summation order device independent), so multiprocessors is unused.
  (void)multiprocessors;
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (cols == 0) return cudaSuccess;
  if (rows > 1 && ld < cols) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kFloat16:
      if (out_dtype == DType::kFloat16)
        return column_sum_impl<__half, __half>(x, rows, cols, ld, out, stream);
      if (out_dtype == DType::kFloat32)
        return column_sum_impl<__half, float>(x, rows, cols, ld, out, stream);
      return cudaErrorInvalidValue;
    case DType::kBFloat16:
      if (out_dtype == DType::kBFloat16)
        return column_sum_impl<__nv_bfloat16, __nv_bfloat16>(x, rows, cols, ld, out, stream);
      if (out_dtype == DType::kFloat32)
        return column_sum_impl<__nv_bfloat16, float>(x, rows, cols, ld, out, stream);
      return cudaErrorInvalidValue;
    case DType::kFloat32:
      if (out_dtype == DType::kFloat32)
        return column_sum_impl<float, float>(x, rows, cols, ld, out, stream);
      return cudaErrorInvalidValue;
    case DType::kFloat64:
      if (out_dtype == DType::kFloat64)
        return column_sum_impl<double, double>(x, rows, cols, ld, out, stream);
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

}  // namespace kernels
}  // namespace cutlass_nn
