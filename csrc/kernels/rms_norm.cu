// Torch-free RMSNorm kernels of cutlass_nn (see rms_norm.h).
//
// One block per row (a grid-stride loop over rows). The forward reads input (and residual) once:
// the row's h stays in registers between the sum of squares and the normalization when it fits
// (kCache 16-byte packs per thread), otherwise the second pass re-reads input (and residual) and
// forms it again. The backward does the
// same two passes over grad_out and h (the second re-reads them; a row is still in L1/L2) and
// keeps each thread's share of the weight gradient in registers across all the rows of its
// block: a thread always owns the same columns, so the partial sums need no shared memory and
// no atomics, and one [blocks, cols] float buffer of partials is reduced by launch_column_sum
// afterwards (fixed order: reproducible).

#include "rms_norm.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "dtype_pack.cuh"  // Acc, Pack16, load_vec / store_vec
#include "launch_helpers.h"  // resolve_multiprocessors, aligned16

namespace cutlass_nn {
namespace kernels {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kResidentThreadsPerSm = 2048;  // sm_80 / sm_90

__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return rsqrt(v); }

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 32 warps). Every thread adds
// the warp totals in the same order, so all of them get the same, reproducible value.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // the previous row's readers of `scratch` are done
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  A total = A(0);
  const int warps = blockDim.x >> 5;
  for (int i = 0; i < warps; ++i) total += scratch[i];
  return total;
}

// ---------------------------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------------------------

// kV: elements per access (the pack width, or 1 on the scalar path); kCache: packs per thread
// kept in registers between the two passes (0: re-read).
template <typename T, typename W, int kV, int kCache>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_forward_kernel(const T* __restrict__ input, const T* __restrict__ residual,
                            const W* __restrict__ weight, int64_t rows, int64_t cols,
                            Acc<T> eps, T* __restrict__ out, T* __restrict__ h_out,
                            Acc<T>* __restrict__ rstd_out) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  const int64_t nvec = cols / kV;
  const bool has_residual = residual != nullptr;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    // h of this row, pass 1: rounded to T (the new residual is stored in T, and the norm is
    // taken of what is stored, as an unfused `x + residual` followed by RMSNorm does).
    // Kept in T (exact: h is a T value) to hold twice as many elements per register.
    T cache[kCache > 0 ? kCache : 1][kV];
    A sum_sq = A(0);
    auto load_h = [&](int64_t p, A (&h)[kV]) {
      load_vec<T, kV>(input + base + p * kV, h);
      if (has_residual) {
        A r[kV];
        load_vec<T, kV>(residual + base + p * kV, r);
#pragma unroll
        for (int k = 0; k < kV; ++k) h[k] = to_acc(from_acc<T>(h[k] + r[k]));
        store_vec<T, kV>(h_out + base + p * kV, h);
      }
#pragma unroll
      for (int k = 0; k < kV; ++k) sum_sq += h[k] * h[k];
    };
    if constexpr (kCache > 0) {
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t p = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
        if (p < nvec) {
          A h[kV];
          load_h(p, h);
#pragma unroll
          for (int k = 0; k < kV; ++k) cache[c][k] = from_acc<T>(h[k]);
        }
      }
    } else {
      for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
        A h[kV];
        load_h(p, h);
      }
    }
    const A rstd = rsqrt_acc(block_sum(sum_sq, scratch) / static_cast<A>(cols) + eps);
    if (threadIdx.x == 0) rstd_out[row] = rstd;

    auto normalize = [&](int64_t p, const A (&h)[kV]) {
      A w[kV], o[kV];
      load_vec<W, kV>(weight + p * kV, w);
#pragma unroll
      for (int k = 0; k < kV; ++k) o[k] = h[k] * rstd * w[k];
      store_vec<T, kV>(out + base + p * kV, o);
    };
    if constexpr (kCache > 0) {
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t p = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
        if (p < nvec) {
          A h[kV];
#pragma unroll
          for (int k = 0; k < kV; ++k) h[k] = to_acc(cache[c][k]);
          normalize(p, h);
        }
      }
    } else {
      // h again from input (+ residual), rounded as in pass 1 (the row is in L1 / L2 now).
      for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
        A h[kV];
        load_vec<T, kV>(input + base + p * kV, h);
        if (has_residual) {
          A r[kV];
          load_vec<T, kV>(residual + base + p * kV, r);
#pragma unroll
          for (int k = 0; k < kV; ++k) h[k] = to_acc(from_acc<T>(h[k] + r[k]));
        }
        normalize(p, h);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// backward
// ---------------------------------------------------------------------------------------------

// kCache: packs per thread whose weight-gradient sums stay in registers (0: they are added
// into this block's row of weight_partials directly, a read-modify-write per row).
template <typename T, typename W, int kV, int kCache>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_backward_kernel(const T* __restrict__ grad_out, const T* grad_h_in,
                             const T* __restrict__ h, const W* __restrict__ weight,
                             const Acc<T>* __restrict__ rstd_in, int64_t rows, int64_t cols,
                             T* grad_h, Acc<T>* __restrict__ weight_partials) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  const int64_t nvec = cols / kV;
  const bool weight_grad = weight_partials != nullptr;
  A* my_partials = weight_grad ? weight_partials + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
  A dw[kCache > 0 ? kCache : 1][kV];
#pragma unroll
  for (int c = 0; c < (kCache > 0 ? kCache : 1); ++c)
#pragma unroll
    for (int k = 0; k < kV; ++k) dw[c][k] = A(0);
  if constexpr (kCache == 0) {
    if (weight_grad)
      for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x)
#pragma unroll
        for (int k = 0; k < kV; ++k) my_partials[p * kV + k] = A(0);
  }

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * cols;
    const A rstd = rstd_in[row];
    // pass 1: sum_j dn_j * n_j
    A dot = A(0);
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
      A g[kV], x[kV], w[kV];
      load_vec<T, kV>(grad_out + base + p * kV, g);
      load_vec<T, kV>(h + base + p * kV, x);
      load_vec<W, kV>(weight + p * kV, w);
#pragma unroll
      for (int k = 0; k < kV; ++k) dot += g[k] * w[k] * (x[k] * rstd);
    }
    const A mean_dot = block_sum(dot, scratch) / static_cast<A>(cols);

    // pass 2: grad_h and the weight-gradient terms
    int c = 0;
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x, ++c) {
      A g[kV], x[kV], w[kV], d[kV];
      load_vec<T, kV>(grad_out + base + p * kV, g);
      load_vec<T, kV>(h + base + p * kV, x);
      load_vec<W, kV>(weight + p * kV, w);
      if (grad_h_in != nullptr) {
        load_vec<T, kV>(grad_h_in + base + p * kV, d);
      } else {
#pragma unroll
        for (int k = 0; k < kV; ++k) d[k] = A(0);
      }
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const A n = x[k] * rstd;
        d[k] += rstd * (g[k] * w[k] - n * mean_dot);
        x[k] = g[k] * n;  // this row's weight-gradient term
      }
      store_vec<T, kV>(grad_h + base + p * kV, d);
      if (weight_grad) {
        if constexpr (kCache > 0) {
#pragma unroll
          for (int cc = 0; cc < kCache; ++cc)
            if (cc == c)
#pragma unroll
              for (int k = 0; k < kV; ++k) dw[cc][k] += x[k];
        } else {
#pragma unroll
          for (int k = 0; k < kV; ++k) my_partials[p * kV + k] += x[k];
        }
      }
    }
  }

  if constexpr (kCache > 0) {
    if (weight_grad) {
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        const int64_t p = threadIdx.x + static_cast<int64_t>(c) * blockDim.x;
        if (p < nvec)
#pragma unroll
          for (int k = 0; k < kV; ++k) my_partials[p * kV + k] = dw[c][k];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// launch configuration
// ---------------------------------------------------------------------------------------------


int round_up_warp(int64_t v) { return static_cast<int>(std::max<int64_t>(32, (v + 31) / 32 * 32)); }

// Threads per block and packs per thread for `nvec` accesses per row, trying the cache depths
// in `depths` (ascending) in turn; {kMaxThreads, 0} when none fits (the re-reading kernels).
struct RowPlan {
  int threads;
  int cache;
};

template <int N>
RowPlan plan_row(int64_t nvec, const int (&depths)[N]) {
  for (int depth : depths) {
    const int64_t threads = (nvec + depth - 1) / depth;
    if (threads <= kMaxThreads) return {round_up_warp(threads), depth};
  }
  return {kMaxThreads, 0};
}

constexpr int kForwardDepths[] = {2, 8};
constexpr int kBackwardDepths[] = {1, 2, 4};


template <typename T> DType dtype_of();
template <> DType dtype_of<__half>() { return DType::kFloat16; }
template <> DType dtype_of<__nv_bfloat16>() { return DType::kBFloat16; }
template <> DType dtype_of<float>() { return DType::kFloat32; }
template <> DType dtype_of<double>() { return DType::kFloat64; }

int pack_width(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 8;
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 2;
  }
  return 1;
}

template <typename T, typename W>
bool vector_ok(const void* const* ptrs, int n, const W* weight, int64_t cols) {
  constexpr int kN = Pack16<T>::kN;
  if (cols % kN != 0) return false;
  for (int i = 0; i < n; ++i)
    if (ptrs[i] != nullptr && !aligned16(ptrs[i])) return false;
  // The weight is loaded as packs too when it has T's width.
  return sizeof(W) != sizeof(T) || aligned16(weight);
}

constexpr int64_t kMaxGrid = 0x7fffffff;

template <typename T, typename W, int kV>
cudaError_t forward_launch(const T* x, const T* res, const W* w, int64_t rows, int64_t cols,
                           double eps, T* out, T* h_out, Acc<T>* rstd, cudaStream_t stream) {
  const RowPlan plan = plan_row(cols / kV, kForwardDepths);
  const int blocks = static_cast<int>(std::min(rows, kMaxGrid));
  const auto e = static_cast<Acc<T>>(eps);
  switch (plan.cache) {
    case 2:
      rms_norm_forward_kernel<T, W, kV, 2>
          <<<blocks, plan.threads, 0, stream>>>(x, res, w, rows, cols, e, out, h_out, rstd);
      break;
    case 8:
      rms_norm_forward_kernel<T, W, kV, 8>
          <<<blocks, plan.threads, 0, stream>>>(x, res, w, rows, cols, e, out, h_out, rstd);
      break;
    default:
      rms_norm_forward_kernel<T, W, kV, 0>
          <<<blocks, plan.threads, 0, stream>>>(x, res, w, rows, cols, e, out, h_out, rstd);
  }
  return cudaGetLastError();
}

template <typename T, typename W>
cudaError_t forward_impl(const void* x, const void* res, const void* w, int64_t rows,
                         int64_t cols, double eps, void* out, void* h_out, void* rstd,
                         cudaStream_t stream) {
  const T* tx = static_cast<const T*>(x);
  const T* tr = static_cast<const T*>(res);
  const W* tw = static_cast<const W*>(w);
  T* to = static_cast<T*>(out);
  T* th = static_cast<T*>(h_out);
  auto* ts = static_cast<Acc<T>*>(rstd);
  const void* ptrs[] = {x, res, out, h_out};
  if (vector_ok<T>(ptrs, 4, tw, cols))
    return forward_launch<T, W, Pack16<T>::kN>(tx, tr, tw, rows, cols, eps, to, th, ts, stream);
  return forward_launch<T, W, 1>(tx, tr, tw, rows, cols, eps, to, th, ts, stream);
}

template <typename T, typename W, int kV>
cudaError_t backward_launch(const T* g, const T* gin, const T* h, const W* w, const Acc<T>* rstd,
                            int64_t rows, int64_t cols, T* gh, Acc<T>* partials, int blocks,
                            cudaStream_t stream) {
  const RowPlan plan = plan_row(cols / kV, kBackwardDepths);
  switch (plan.cache) {
    case 1:
      rms_norm_backward_kernel<T, W, kV, 1>
          <<<blocks, plan.threads, 0, stream>>>(g, gin, h, w, rstd, rows, cols, gh, partials);
      break;
    case 2:
      rms_norm_backward_kernel<T, W, kV, 2>
          <<<blocks, plan.threads, 0, stream>>>(g, gin, h, w, rstd, rows, cols, gh, partials);
      break;
    case 4:
      rms_norm_backward_kernel<T, W, kV, 4>
          <<<blocks, plan.threads, 0, stream>>>(g, gin, h, w, rstd, rows, cols, gh, partials);
      break;
    default:
      rms_norm_backward_kernel<T, W, kV, 0>
          <<<blocks, plan.threads, 0, stream>>>(g, gin, h, w, rstd, rows, cols, gh, partials);
  }
  return cudaGetLastError();
}

template <typename T, typename W>
cudaError_t backward_impl(const void* g, const void* gin, const void* h, const void* w,
                          const void* rstd, int64_t rows, int64_t cols, void* gh, void* partials,
                          int multiprocessors, cudaStream_t stream) {
  const T* tg = static_cast<const T*>(g);
  const T* tgin = static_cast<const T*>(gin);
  const T* th = static_cast<const T*>(h);
  const W* tw = static_cast<const W*>(w);
  const auto* ts = static_cast<const Acc<T>*>(rstd);
  T* tgh = static_cast<T*>(gh);
  auto* tp = static_cast<Acc<T>*>(partials);
  const void* ptrs[] = {g, gin, h, gh};
  const int blocks = static_cast<int>(
      rms_norm_backward_partial_rows(dtype_of<T>(), rows, cols, multiprocessors));
  if (vector_ok<T>(ptrs, 4, tw, cols))
    return backward_launch<T, W, Pack16<T>::kN>(tg, tgin, th, tw, ts, rows, cols, tgh, tp, blocks,
                                                stream);
  return backward_launch<T, W, 1>(tg, tgin, th, tw, ts, rows, cols, tgh, tp, blocks, stream);
}

}  // namespace

// The (activation, weight) type pairs the kernels are built for: (T, T) for the four dtypes and
// (16-bit T, float). CALL(T, W) returns; unsupported pairs fall through to the caller's return.
#define CUTLASS_NN_RMS_DISPATCH(CALL)                                \
  switch (dtype) {                                                   \
    case DType::kFloat16:                                            \
      if (same) CALL(__half, __half);                                \
      if (weight_dtype == DType::kFloat32) CALL(__half, float);      \
      break;                                                         \
    case DType::kBFloat16:                                           \
      if (same) CALL(__nv_bfloat16, __nv_bfloat16);                  \
      if (weight_dtype == DType::kFloat32) CALL(__nv_bfloat16, float); \
      break;                                                         \
    case DType::kFloat32:                                            \
      if (same) CALL(float, float);                                  \
      break;                                                         \
    case DType::kFloat64:                                            \
      if (same) CALL(double, double);                                \
      break;                                                         \
  }

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

cudaError_t launch_rms_norm_forward(DType dtype, DType weight_dtype, const void* input,
                                    const void* residual, const void* weight, int64_t rows,
                                    int64_t cols, double eps, void* out, void* h_out, void* rstd,
                                    int multiprocessors, cudaStream_t stream) {
  (void)multiprocessors;  // one block per row
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (residual != nullptr && h_out == nullptr) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const bool same = weight_dtype == dtype;
#define CUTLASS_NN_RMS_FORWARD(T, W) \
  return forward_impl<T, W>(input, residual, weight, rows, cols, eps, out, h_out, rstd, stream)
  CUTLASS_NN_RMS_DISPATCH(CUTLASS_NN_RMS_FORWARD)
#undef CUTLASS_NN_RMS_FORWARD
  return cudaErrorInvalidValue;
}

int64_t rms_norm_backward_partial_rows(DType dtype, int64_t rows, int64_t cols,
                                       int multiprocessors) {
  if (rows <= 0 || cols <= 0) return 0;
  // As many blocks as fit on the GPU at the vector path's block size (the scalar path, with
  // its larger blocks, uses the same grid, so the caller can size the partials buffer without
  // knowing which path runs).
  const int threads = plan_row(cols / pack_width(dtype), kBackwardDepths).threads;
  const int64_t per_sm = std::max(1, kResidentThreadsPerSm / threads);
  return std::min<int64_t>(rows, per_sm * resolve_multiprocessors(multiprocessors));
}

cudaError_t launch_rms_norm_backward(DType dtype, DType weight_dtype, const void* grad_out,
                                     const void* grad_h_in, const void* h, const void* weight,
                                     const void* rstd, int64_t rows, int64_t cols, void* grad_h,
                                     void* weight_partials, int multiprocessors,
                                     cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  const bool same = weight_dtype == dtype;
#define CUTLASS_NN_RMS_BACKWARD(T, W)                                                        \
  return backward_impl<T, W>(grad_out, grad_h_in, h, weight, rstd, rows, cols, grad_h,        \
                             weight_partials, multiprocessors, stream)
  CUTLASS_NN_RMS_DISPATCH(CUTLASS_NN_RMS_BACKWARD)
#undef CUTLASS_NN_RMS_BACKWARD
  return cudaErrorInvalidValue;
}

}  // namespace kernels
}  // namespace cutlass_nn
