// Torch-free cross-entropy row kernel of cutlass_nn (see cross_entropy.h).
//
// One block per row (a grid-stride loop over rows). Pass 1 reads the row once and keeps, per
// thread, an online maximum and the sum of exponentials relative to it (plus the plain sum for
// label smoothing); the block combines them in a fixed order, so every thread gets the same,
// reproducible log-sum-exp. Pass 2 reads the row again (partly from L2) and writes the
// gradient over it. A vocabulary-sized row does not fit in registers or shared memory (256 KiB
// at 128k bf16 classes), hence the second read.

#include "cross_entropy.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "dtype_pack.cuh"      // Acc, Pack16, load_vec / store_vec
#include "launch_helpers.h"    // resolve_multiprocessors, aligned16

namespace cutlass_nn {
namespace kernels {
namespace {

constexpr int kMaxThreads = 512;
constexpr int kResidentThreadsPerSm = 2048;  // sm_80 / sm_90

__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }
__device__ __forceinline__ float max_acc(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_acc(double a, double b) { return fmax(a, b); }

// exp(x - m) with exp(-inf - m) = 0 also for m = -inf (a row whose entries so far are all
// -inf contributes nothing instead of exp(NaN)), and exp(x - m) = 1 for x == m also when both
// are +inf (each +inf logit counts once instead of exp(NaN), so a row with a +inf logit has
// the log-sum-exp +inf, as torch.logsumexp; for finite x == m this is exp(0) = 1 unchanged).
// NaN entries stay NaN and poison the sum.
template <typename A> __device__ __forceinline__ A exp_rel(A x, A m) {
  return x == -INFINITY ? A(0) : (x == m ? A(1) : exp_acc(x - m));
}

// Running (max, sum of exp relative to max, plain sum) of a set of logits.
template <typename A> struct Stats {
  A m, s, z;
};

template <typename A> __device__ __forceinline__ Stats<A> combine(Stats<A> a, Stats<A> b) {
  const A m = max_acc(a.m, b.m);
  return {m, a.s * exp_rel(a.m, m) + b.s * exp_rel(b.m, m), a.z + b.z};
}

// The block's combined stats (blockDim.x a multiple of 32, at most 32 warps). Every thread
// combines the warp results in the same order, so all of them get the same value.
template <typename A> __device__ __forceinline__ Stats<A> block_stats(Stats<A> v, Stats<A>* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Stats<A> o{__shfl_xor_sync(0xffffffffu, v.m, offset),
                     __shfl_xor_sync(0xffffffffu, v.s, offset),
                     __shfl_xor_sync(0xffffffffu, v.z, offset)};
    v = combine(v, o);
  }
  __syncthreads();  // the previous row's readers of `scratch` are done
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  Stats<A> total = scratch[0];
  const int warps = blockDim.x >> 5;
  for (int i = 1; i < warps; ++i) total = combine(total, scratch[i]);
  return total;
}

// kV: elements per access (the 16-byte pack width, or 1 on the scalar path).
template <typename T, int kV>
__global__ void __launch_bounds__(kMaxThreads)
    cross_entropy_rows_kernel(T* __restrict__ logits, const int64_t* __restrict__ target,
                              const Acc<T>* __restrict__ row_scale, int64_t rows, int64_t vocab,
                              int64_t ignore_index, Acc<T> eps, bool write_grad,
                              Acc<T>* __restrict__ loss, Acc<T>* __restrict__ lse_out) {
  using A = Acc<T>;
  __shared__ Stats<A> scratch[32];
  const int64_t nvec = vocab / kV;
  const bool smooth = eps != A(0);
  const A eps_per_class = eps / static_cast<A>(vocab);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T* z = logits + row * vocab;
    const int64_t t = target[row];
    const bool valid = t != ignore_index;
    const bool bad = valid && (t < 0 || t >= vocab);

    Stats<A> st{-INFINITY, A(0), A(0)};
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
      A v[kV];
      load_vec<T, kV>(z + p * kV, v);
      A pm = v[0];
#pragma unroll
      for (int k = 1; k < kV; ++k) pm = max_acc(pm, v[k]);
      const A m = max_acc(st.m, pm);
      A s = st.s * exp_rel(st.m, m);
#pragma unroll
      for (int k = 0; k < kV; ++k) s += exp_rel(v[k], m);
      st.m = m;
      st.s = s;
      if (smooth) {
#pragma unroll
        for (int k = 0; k < kV; ++k) st.z += v[k];
      }
    }
    // the target's logit, read before block_stats' barriers and so before pass 2 overwrites it
    const A zt = (threadIdx.x == 0 && valid && !bad) ? to_acc(z[t]) : A(0);
    const Stats<A> total = block_stats(st, scratch);
    // lse = m + log(s). The loss and the gradient are formed from (z - m) and log(s) rather
    // than from lse, so that large logits lose no digits to the cancellation lse - z.
    const A log_s = log_acc(total.s);
    const A lse = total.m + log_s;
    // A row with an infinite maximum (a +inf logit, or all -inf) has lse = m but neither a loss
    // nor a gradient: F.cross_entropy gives NaN for both, and so do the CPU backend and, through
    // log_s_row, this kernel (the loss and gradient formulas below read only log_s_row).
    const bool inf_max = total.m == A(INFINITY) || total.m == A(-INFINITY);
    const A log_s_row = inf_max ? A(NAN) : log_s;
    if (threadIdx.x == 0) {
      A l = A(0);
      if (bad) {
        l = A(NAN);
      } else if (valid) {
        // lse - (1 - eps) z_t - eps mean(z) = log s + (1 - eps)(m - z_t) + eps (m - mean(z))
        l = smooth ? log_s_row + (A(1) - eps) * (total.m - zt) +
                         eps * (total.m - total.z / static_cast<A>(vocab))
                   : log_s_row + (total.m - zt);
      }
      loss[row] = l;
      lse_out[row] = lse;
    }
    if (!write_grad) continue;

    if (!valid) {
      A zero[kV];
#pragma unroll
      for (int k = 0; k < kV; ++k) zero[k] = A(0);
      for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) store_vec<T, kV>(z + p * kV, zero);
      continue;
    }
    const A scale = bad ? A(NAN) : (row_scale != nullptr ? row_scale[row] : A(1));
    const A target_term = A(1) - eps;
    for (int64_t p = threadIdx.x; p < nvec; p += blockDim.x) {
      A v[kV];
      load_vec<T, kV>(z + p * kV, v);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        A g = exp_acc((v[k] - total.m) - log_s_row) - eps_per_class;
        if (p * kV + k == t) g -= target_term;
        v[k] = g * scale;
      }
      store_vec<T, kV>(z + p * kV, v);
    }
  }
}

template <typename T>
cudaError_t launch_typed(void* logits, const int64_t* target, const void* row_scale, int64_t rows,
                         int64_t vocab, int64_t ignore_index, double eps, bool write_grad,
                         void* loss, void* lse, int multiprocessors, cudaStream_t stream) {
  using A = Acc<T>;
  constexpr int kPack = Pack16<T>::kN;
  T* z = static_cast<T*>(logits);
  const bool vec = vocab % kPack == 0 && aligned16(z);
  const int64_t nvec = vec ? vocab / kPack : vocab;
  // enough threads for a few accesses each, a multiple of the warp size
  const int64_t want = std::min<int64_t>(kMaxThreads, (nvec + 31) / 32 * 32);
  const int threads = static_cast<int>(std::max<int64_t>(32, want));
  const int64_t resident =
      static_cast<int64_t>(resolve_multiprocessors(multiprocessors)) * (kResidentThreadsPerSm / threads);
  const int blocks = static_cast<int>(std::min<int64_t>(rows, resident));
  const A* rs = static_cast<const A*>(row_scale);
  A* l = static_cast<A*>(loss);
  A* m = static_cast<A*>(lse);
  if (vec) {
    cross_entropy_rows_kernel<T, kPack><<<blocks, threads, 0, stream>>>(
        z, target, rs, rows, vocab, ignore_index, static_cast<A>(eps), write_grad, l, m);
  } else {
    cross_entropy_rows_kernel<T, 1><<<blocks, threads, 0, stream>>>(
        z, target, rs, rows, vocab, ignore_index, static_cast<A>(eps), write_grad, l, m);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cross_entropy_rows(DType dtype, void* logits, const int64_t* target,
                                      const void* row_scale, int64_t rows, int64_t vocab,
                                      int64_t ignore_index, double label_smoothing,
                                      bool write_grad, void* loss, void* lse,
                                      int multiprocessors, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat16:
      return launch_typed<__half>(logits, target, row_scale, rows, vocab, ignore_index,
                                  label_smoothing, write_grad, loss, lse, multiprocessors, stream);
    case DType::kBFloat16:
      return launch_typed<__nv_bfloat16>(logits, target, row_scale, rows, vocab, ignore_index,
                                         label_smoothing, write_grad, loss, lse, multiprocessors,
                                         stream);
    case DType::kFloat32:
      return launch_typed<float>(logits, target, row_scale, rows, vocab, ignore_index,
                                 label_smoothing, write_grad, loss, lse, multiprocessors, stream);
    case DType::kFloat64:
      return launch_typed<double>(logits, target, row_scale, rows, vocab, ignore_index,
                                  label_smoothing, write_grad, loss, lse, multiprocessors, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kernels
}  // namespace cutlass_nn
