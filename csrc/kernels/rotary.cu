// The rotary position embedding kernel (interface: rotary.h). Memory-bound: each work item is
// one chunk of kN elements of the first half of a head row and the matching chunk of the second
// half, with the same chunks of cos and sin. Items are numbered position-major, (batch, position)
// then (query heads, key heads) then chunk, so the threads of a block walk the heads of one token
// (adjacent in memory for the [batch, seq, heads, head_dim] layout a projection's output has)
// and share its cos / sin rows through the cache.
#include "rotary.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "dtype_pack.cuh"    // Acc, load_vec / store_vec, Pack16
#include "launch_helpers.h"  // resolve_multiprocessors, aligned16

namespace cutlass_nn {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

// Correctly rounded products and sums (no FMA contraction), so the kernel rounds exactly as the
// CPU reference's separate multiply and add do.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

struct Problem {
  RotaryOperand q, k;
  RotaryTable cos, sin;
  int64_t seq, half;
  int64_t chunks;       // chunks per half row: half / kN
  int64_t q_items;      // q.heads * chunks
  int64_t row_items;    // (q.heads + k.heads) * chunks: the items of one token
  int64_t total;        // batch * seq * row_items
};

template <typename T, int kN, bool kBackward>
__global__ void __launch_bounds__(kThreads) rotary_kernel(const Problem p) {
  using A = Acc<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       item < p.total; item += step) {
    const int64_t token = item / p.row_items;
    int64_t w = item - token * p.row_items;
    const int64_t b = token / p.seq;
    const int64_t s = token - b * p.seq;
    const RotaryOperand* op = &p.q;
    if (w >= p.q_items) {
      op = &p.k;
      w -= p.q_items;
    }
    const int64_t h = w / p.chunks;
    const int64_t d = (w - h * p.chunks) * kN;
    const T* x = static_cast<const T*>(op->in) + b * op->in_stride[0] + h * op->in_stride[1] +
                 s * op->in_stride[2] + d;
    T* out = static_cast<T*>(op->out) + b * op->out_stride[0] + h * op->out_stride[1] +
             s * op->out_stride[2] + d;
    const T* c = static_cast<const T*>(p.cos.data) + b * p.cos.stride[0] + s * p.cos.stride[1] + d;
    const T* sn = static_cast<const T*>(p.sin.data) + b * p.sin.stride[0] + s * p.sin.stride[1] + d;
    A x1[kN], x2[kN], c1[kN], c2[kN], s1[kN], s2[kN];
    load_vec<T, kN>(x, x1);
    load_vec<T, kN>(x + p.half, x2);
    load_vec<T, kN>(c, c1);
    load_vec<T, kN>(c + p.half, c2);
    load_vec<T, kN>(sn, s1);
    load_vec<T, kN>(sn + p.half, s2);
    A o1[kN], o2[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if constexpr (kBackward) {
        o1[j] = add_rn(mul_rn(x1[j], c1[j]), mul_rn(x2[j], s2[j]));
        o2[j] = add_rn(mul_rn(x2[j], c2[j]), -mul_rn(x1[j], s1[j]));
      } else {
        o1[j] = add_rn(mul_rn(x1[j], c1[j]), -mul_rn(x2[j], s1[j]));
        o2[j] = add_rn(mul_rn(x2[j], c2[j]), mul_rn(x1[j], s2[j]));
      }
    }
    store_vec<T, kN>(out, o1);
    store_vec<T, kN>(out + p.half, o2);
  }
}

bool strides_fit(const int64_t* strides, int n, int64_t multiple) {
  for (int i = 0; i < n; ++i) {
    if (strides[i] % multiple != 0) return false;
  }
  return true;
}

template <typename T>
cudaError_t launch_typed(bool backward, Problem p, int multiprocessors, cudaStream_t stream) {
  constexpr int kVec = Pack16<T>::kN;
  const bool vec = p.half % kVec == 0 && aligned16(p.q.in) && aligned16(p.q.out) &&
                   aligned16(p.k.in) && aligned16(p.k.out) && aligned16(p.cos.data) &&
                   aligned16(p.sin.data) && strides_fit(p.q.in_stride, 3, kVec) &&
                   strides_fit(p.q.out_stride, 3, kVec) && strides_fit(p.k.in_stride, 3, kVec) &&
                   strides_fit(p.k.out_stride, 3, kVec) && strides_fit(p.cos.stride, 2, kVec) &&
                   strides_fit(p.sin.stride, 2, kVec);
  const int n = vec ? kVec : 1;
  p.chunks = p.half / n;
  p.q_items = p.q.heads * p.chunks;
  p.row_items = (p.q.heads + p.k.heads) * p.chunks;
  p.total = p.total * p.row_items;  // p.total held batch * seq
  const int64_t blocks = std::min<int64_t>(
      (p.total + kThreads - 1) / kThreads,
      static_cast<int64_t>(resolve_multiprocessors(multiprocessors)) * kBlocksPerSm);
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(blocks, 1))), block(kThreads);
  if (vec) {
    if (backward) {
      rotary_kernel<T, kVec, true><<<grid, block, 0, stream>>>(p);
    } else {
      rotary_kernel<T, kVec, false><<<grid, block, 0, stream>>>(p);
    }
  } else if (backward) {
    rotary_kernel<T, 1, true><<<grid, block, 0, stream>>>(p);
  } else {
    rotary_kernel<T, 1, false><<<grid, block, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rotary(DType dtype, bool backward, const RotaryOperand& q,
                          const RotaryOperand& k, const RotaryTable& cos, const RotaryTable& sin,
                          int64_t batch, int64_t seq, int64_t head_dim, int multiprocessors,
                          cudaStream_t stream) {
  if (batch < 0 || seq < 0 || head_dim < 0 || head_dim % 2 != 0 || q.heads < 0 || k.heads < 0) {
    return cudaErrorInvalidValue;
  }
  if (batch == 0 || seq == 0 || head_dim == 0 || q.heads + k.heads == 0) return cudaSuccess;
  Problem p;
  p.q = q;
  p.k = k;
  p.cos = cos;
  p.sin = sin;
  p.seq = seq;
  p.half = head_dim / 2;
  p.total = batch * seq;
  switch (dtype) {
    case DType::kFloat16: return launch_typed<__half>(backward, p, multiprocessors, stream);
    case DType::kBFloat16:
      return launch_typed<__nv_bfloat16>(backward, p, multiprocessors, stream);
    case DType::kFloat32: return launch_typed<float>(backward, p, multiprocessors, stream);
    case DType::kFloat64: return launch_typed<double>(backward, p, multiprocessors, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kernels
}  // namespace cutlass_nn
