// Torch-free activation kernels of cutlass_nn (see activation.h).
//
//  * launch_activation_forward:  out = act(z), 16-byte vectorized grid-stride loop (scalar
//                                fallback), like launch_add2.
//  * launch_activation_backward: grad_z = grad_out * act'(z); without a bias gradient the same
//                                kind of flat loop, with one a 2-D grid (column strip x row
//                                chunk) whose blocks also reduce their chunk's column sums into
//                                a workspace, followed by a small kernel that adds the chunks in
//                                order. Deterministic: no atomics, and the partition depends on
//                                (dtype, rows, cols) only.

#include "activation.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "dtype_pack.cuh"  // AccType, to_acc / from_acc, Pack16
#include "launch_helpers.h"  // resolve_multiprocessors, aligned16

namespace cutlass_nn {
namespace kernels {
namespace {



template <typename T, Activation A> __device__ __forceinline__ T forward_one(T z) {
  return from_acc<T>(activation_forward(A, to_acc(z)));
}

template <typename T, Activation A> __device__ __forceinline__ T backward_one(T g, T z) {
  return from_acc<T>(activation_backward(A, to_acc(g), to_acc(z)));
}

// ---------------------------------------------------------------------------------------------
// Flat elementwise kernels: forward, and backward without a bias gradient
// ---------------------------------------------------------------------------------------------

constexpr int kFlatThreads = 256;
constexpr int kFlatBlocksPerSm = 8;  // 2048 resident threads per SM (sm_80 / sm_90 maximum)

// Vector path (all pointers 16-byte aligned): the first nvec packs in the grid-stride loop, the
// < kN leftover elements by the first threads of the grid. `out` may equal `z` (in place: each
// element is read before it is written, by the same thread), hence no __restrict__.
template <typename T, Activation A>
__global__ void __launch_bounds__(kFlatThreads)
    act_forward_vec_kernel(const T* z, T* out, int64_t nvec, int64_t numel) {
  using P = Pack16<T>;
  constexpr int kN = P::kN;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const P* pz = reinterpret_cast<const P*>(z);
  P* po = reinterpret_cast<P*>(out);
  for (int64_t i = tid; i < nvec; i += stride) {
    const P vz = pz[i];
    P vo;
#pragma unroll
    for (int k = 0; k < kN; ++k) vo.v[k] = forward_one<T, A>(vz.v[k]);
    po[i] = vo;
  }
  const int64_t t = nvec * kN + tid;
  if (t < numel) out[t] = forward_one<T, A>(z[t]);
}

template <typename T, Activation A>
__global__ void __launch_bounds__(kFlatThreads)
    act_forward_scalar_kernel(const T* z, T* out, int64_t numel) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < numel; i += stride) out[i] = forward_one<T, A>(z[i]);
}

template <typename T, Activation A>
__global__ void __launch_bounds__(kFlatThreads)
    act_backward_vec_kernel(const T* __restrict__ g, const T* __restrict__ z,
                            T* __restrict__ dz, int64_t nvec, int64_t numel) {
  using P = Pack16<T>;
  constexpr int kN = P::kN;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const P* pg = reinterpret_cast<const P*>(g);
  const P* pz = reinterpret_cast<const P*>(z);
  P* po = reinterpret_cast<P*>(dz);
  for (int64_t i = tid; i < nvec; i += stride) {
    const P vg = pg[i];
    const P vz = pz[i];
    P vo;
#pragma unroll
    for (int k = 0; k < kN; ++k) vo.v[k] = backward_one<T, A>(vg.v[k], vz.v[k]);
    po[i] = vo;
  }
  const int64_t t = nvec * kN + tid;
  if (t < numel) dz[t] = backward_one<T, A>(g[t], z[t]);
}

template <typename T, Activation A>
__global__ void __launch_bounds__(kFlatThreads)
    act_backward_scalar_kernel(const T* __restrict__ g, const T* __restrict__ z,
                               T* __restrict__ dz, int64_t numel) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < numel; i += stride) dz[i] = backward_one<T, A>(g[i], z[i]);
}

// Grid of a flat kernel: enough blocks for `work` items (at least one), at most kFlatBlocksPerSm
// per multiprocessor (the grid-stride loop covers the rest).
int flat_blocks(int64_t work, int multiprocessors) {
  const int64_t max_blocks =
      static_cast<int64_t>(resolve_multiprocessors(multiprocessors)) * kFlatBlocksPerSm;
  const int64_t needed = std::max<int64_t>(1, (work + kFlatThreads - 1) / kFlatThreads);
  return static_cast<int>(std::min(needed, max_blocks));
}

template <typename T, Activation A>
cudaError_t forward_impl(const void* z, void* out, int64_t numel, int multiprocessors,
                         cudaStream_t stream) {
  constexpr int kN = Pack16<T>::kN;
  const T* tz = static_cast<const T*>(z);
  T* to = static_cast<T*>(out);
  if (aligned16(z) && aligned16(out)) {
    const int64_t nvec = numel / kN;
    act_forward_vec_kernel<T, A><<<flat_blocks(nvec, multiprocessors), kFlatThreads, 0, stream>>>(
        tz, to, nvec, numel);
  } else {
    act_forward_scalar_kernel<T, A>
        <<<flat_blocks(numel, multiprocessors), kFlatThreads, 0, stream>>>(tz, to, numel);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// Backward with the bias gradient: one pass, per-chunk column sums, then the chunk reduction
// ---------------------------------------------------------------------------------------------
//
// Block = kBwdTx x kBwdTy threads; block (x = strip, y = chunk) owns a strip of kStripCols =
// 128 bytes of columns (kBwdTx threads x one 16-byte pack each) and the rows [chunk *
// rows_per_chunk, ...) of the chunk. Thread (tx, ty) handles columns [tx * kV, tx * kV + kV) of
// the strip in rows ty, ty + kBwdTy, ... of the chunk, in ascending order, summing the rounded
// grad_z values per column in registers; then the kBwdTy row groups are added by a fixed
// halving tree in shared memory and the strip's sums of the chunk go to
// partial[chunk][column]. The vector path (16-byte loads) and the scalar path (misaligned
// pointers, or cols not a multiple of the pack) use the same thread / row / column mapping, so
// they sum in the same order and give bitwise-identical results.

constexpr int kStripBytes = 128;
constexpr int kBwdTx = 8;   // threads across a strip: 8 x 16 bytes
constexpr int kBwdTy = 32;  // row groups per block
constexpr int kBwdThreads = kBwdTx * kBwdTy;
constexpr int kBwdRowUnroll = 4;
// Partition targets (constants, never the SM count, so the summation order is the same on
// every GPU): about kTargetBlocks blocks in all, and chunks of at least kMinChunkRows rows.
constexpr int64_t kTargetBlocks = 2048;
constexpr int64_t kMinChunkRows = static_cast<int64_t>(kBwdTy) * kBwdRowUnroll;
constexpr int kReduceThreads = 256;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
  }
  return 0;
}

struct BwdPartition {
  int64_t strips = 0;
  int64_t chunks = 0;  // 0 when rows == 0
  int64_t rows_per_chunk = 0;
};

BwdPartition bwd_partition(DType dtype, int64_t rows, int64_t cols) {
  BwdPartition p;
  const int64_t strip_cols = kStripBytes / dtype_bytes(dtype);
  p.strips = ceil_div(cols, strip_cols);
  if (rows <= 0 || cols <= 0) return p;
  int64_t chunks = ceil_div(kTargetBlocks, p.strips);
  chunks = std::min(chunks, ceil_div(rows, kMinChunkRows));
  chunks = std::max<int64_t>(chunks, 1);
  p.rows_per_chunk = ceil_div(rows, chunks);
  p.chunks = ceil_div(rows, p.rows_per_chunk);  // <= kTargetBlocks, well within gridDim.y
  return p;
}

int acc_bytes(DType dtype) { return dtype == DType::kFloat64 ? 8 : 4; }

template <typename T, Activation A, bool kVec>
__global__ void __launch_bounds__(kBwdThreads)
    act_backward_bias_kernel(const T* __restrict__ g, const T* __restrict__ z,
                             T* __restrict__ dz, int64_t rows, int64_t cols,
                             int64_t rows_per_chunk, typename AccType<T>::type* __restrict__ partial) {
  using Acc = typename AccType<T>::type;
  using P = Pack16<T>;
  constexpr int kV = P::kN;
  constexpr int kStripCols = kBwdTx * kV;
  static_assert(kStripCols * static_cast<int>(sizeof(T)) == kStripBytes, "strip width");

  __shared__ Acc smem[kBwdTy * kStripCols];

  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int64_t strip = blockIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t col0 = strip * kStripCols + static_cast<int64_t>(tx) * kV;
  const int64_t r_begin = chunk * rows_per_chunk;
  const int64_t r_end = rows < r_begin + rows_per_chunk ? rows : r_begin + rows_per_chunk;

  Acc acc[kV];
#pragma unroll
  for (int k = 0; k < kV; ++k) acc[k] = Acc(0);

  if constexpr (kVec) {
    // cols is a multiple of kV: a pack is either entirely inside the matrix or outside.
    if (col0 < cols) {
      int64_t r = r_begin + ty;
      for (; r + (kBwdRowUnroll - 1) * static_cast<int64_t>(kBwdTy) < r_end;
           r += kBwdRowUnroll * static_cast<int64_t>(kBwdTy)) {
        P vg[kBwdRowUnroll], vz[kBwdRowUnroll];
#pragma unroll
        for (int u = 0; u < kBwdRowUnroll; ++u) {
          const int64_t i = (r + static_cast<int64_t>(u) * kBwdTy) * cols + col0;
          vg[u] = *reinterpret_cast<const P*>(g + i);
          vz[u] = *reinterpret_cast<const P*>(z + i);
        }
#pragma unroll
        for (int u = 0; u < kBwdRowUnroll; ++u) {
          const int64_t i = (r + static_cast<int64_t>(u) * kBwdTy) * cols + col0;
          P vo;
#pragma unroll
          for (int k = 0; k < kV; ++k) {
            vo.v[k] = backward_one<T, A>(vg[u].v[k], vz[u].v[k]);
            acc[k] += to_acc(vo.v[k]);
          }
          *reinterpret_cast<P*>(dz + i) = vo;
        }
      }
      for (; r < r_end; r += kBwdTy) {
        const int64_t i = r * cols + col0;
        const P vg = *reinterpret_cast<const P*>(g + i);
        const P vz = *reinterpret_cast<const P*>(z + i);
        P vo;
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          vo.v[k] = backward_one<T, A>(vg.v[k], vz.v[k]);
          acc[k] += to_acc(vo.v[k]);
        }
        *reinterpret_cast<P*>(dz + i) = vo;
      }
    }
  } else {
    for (int64_t r = r_begin + ty; r < r_end; r += kBwdTy) {
      const int64_t row = r * cols;
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        if (col0 + k < cols) {
          const int64_t i = row + col0 + k;
          const T d = backward_one<T, A>(g[i], z[i]);
          dz[i] = d;
          acc[k] += to_acc(d);
        }
      }
    }
  }

  // Row groups: smem[ty][c], then a halving tree in which flat thread f adds element
  // f + half * kStripCols into element f.
#pragma unroll
  for (int k = 0; k < kV; ++k) smem[ty * kStripCols + tx * kV + k] = acc[k];
  __syncthreads();
  const int flat = ty * kBwdTx + tx;
#pragma unroll
  for (int half = kBwdTy / 2; half > 0; half /= 2) {
    const int n = half * kStripCols;
    for (int f = flat; f < n; f += kBwdThreads) smem[f] += smem[f + n];
    __syncthreads();
  }
  for (int f = flat; f < kStripCols; f += kBwdThreads) {
    const int64_t c = strip * kStripCols + f;
    if (c < cols) partial[chunk * cols + c] = smem[f];
  }
}

// bias[c] = round(sum_{k < chunks} partial[k][c]), chunks in ascending order (zeros when
// chunks == 0).
template <typename T>
__global__ void __launch_bounds__(kReduceThreads)
    bias_reduce_kernel(const typename AccType<T>::type* __restrict__ partial, int64_t chunks,
                       int64_t cols, T* __restrict__ bias) {
  using Acc = typename AccType<T>::type;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += stride) {
    Acc s = Acc(0);
    for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + c];
    bias[c] = from_acc<T>(s);
  }
}

template <typename T, Activation A>
cudaError_t backward_impl(DType dtype, const void* g, const void* z, void* dz, int64_t rows,
                          int64_t cols, void* bias, void* workspace, size_t workspace_bytes,
                          int multiprocessors, cudaStream_t stream) {
  using Acc = typename AccType<T>::type;
  constexpr int kN = Pack16<T>::kN;
  const T* tg = static_cast<const T*>(g);
  const T* tz = static_cast<const T*>(z);
  T* td = static_cast<T*>(dz);
  const int64_t numel = rows * cols;
  const bool aligned = aligned16(g) && aligned16(z) && aligned16(dz);

  if (bias == nullptr) {
    if (numel == 0) return cudaSuccess;
    if (aligned) {
      const int64_t nvec = numel / kN;
      act_backward_vec_kernel<T, A>
          <<<flat_blocks(nvec, multiprocessors), kFlatThreads, 0, stream>>>(tg, tz, td, nvec,
                                                                           numel);
    } else {
      act_backward_scalar_kernel<T, A>
          <<<flat_blocks(numel, multiprocessors), kFlatThreads, 0, stream>>>(tg, tz, td, numel);
    }
    return cudaGetLastError();
  }

  if (cols == 0) return cudaSuccess;
  const BwdPartition p = bwd_partition(dtype, rows, cols);
  if (workspace_bytes < activation_backward_workspace_size(dtype, rows, cols, multiprocessors) ||
      (p.chunks > 0 && (workspace == nullptr || !aligned16(workspace)))) {
    return cudaErrorInvalidValue;
  }
  Acc* partial = static_cast<Acc*>(workspace);
  if (p.chunks > 0) {
    const dim3 grid(static_cast<unsigned>(p.strips), static_cast<unsigned>(p.chunks));
    const dim3 block(kBwdTx, kBwdTy);
    if (aligned && cols % kN == 0) {
      act_backward_bias_kernel<T, A, true>
          <<<grid, block, 0, stream>>>(tg, tz, td, rows, cols, p.rows_per_chunk, partial);
    } else {
      act_backward_bias_kernel<T, A, false>
          <<<grid, block, 0, stream>>>(tg, tz, td, rows, cols, p.rows_per_chunk, partial);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const int64_t reduce_blocks = std::min<int64_t>(ceil_div(cols, kReduceThreads), 0x7fffffff);
  bias_reduce_kernel<T><<<static_cast<unsigned>(reduce_blocks), kReduceThreads, 0, stream>>>(
      partial, p.chunks, cols, static_cast<T*>(bias));
  return cudaGetLastError();
}

// Calls f.template run<T, A>() for the runtime (dtype, act) pair; an unknown value gives
// cudaErrorInvalidValue.
template <typename T, typename F> cudaError_t with_activation(Activation act, F&& f) {
  switch (act) {
    case Activation::kIdentity: return f.template run<T, Activation::kIdentity>();
    case Activation::kReLU: return f.template run<T, Activation::kReLU>();
    case Activation::kGelu: return f.template run<T, Activation::kGelu>();
    case Activation::kGeluTanh: return f.template run<T, Activation::kGeluTanh>();
  }
  return cudaErrorInvalidValue;
}

template <typename F> cudaError_t with_dtype_and_activation(DType dtype, Activation act, F&& f) {
  switch (dtype) {
    case DType::kFloat16: return with_activation<__half>(act, f);
    case DType::kBFloat16: return with_activation<__nv_bfloat16>(act, f);
    case DType::kFloat32: return with_activation<float>(act, f);
    case DType::kFloat64: return with_activation<double>(act, f);
  }
  return cudaErrorInvalidValue;
}

struct ForwardLauncher {
  const void* z;
  void* out;
  int64_t numel;
  int multiprocessors;
  cudaStream_t stream;
  template <typename T, Activation A> cudaError_t run() const {
    return forward_impl<T, A>(z, out, numel, multiprocessors, stream);
  }
};

struct BackwardLauncher {
  DType dtype;
  const void* g;
  const void* z;
  void* dz;
  int64_t rows, cols;
  void* bias;
  void* workspace;
  size_t workspace_bytes;
  int multiprocessors;
  cudaStream_t stream;
  template <typename T, Activation A> cudaError_t run() const {
    return backward_impl<T, A>(dtype, g, z, dz, rows, cols, bias, workspace, workspace_bytes,
                               multiprocessors, stream);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

cudaError_t launch_activation_forward(DType dtype, Activation act, const void* z, void* out,
                                      int64_t numel, int multiprocessors, cudaStream_t stream) {
  if (numel < 0) return cudaErrorInvalidValue;
  if (numel == 0) return cudaSuccess;
  return with_dtype_and_activation(dtype, act,
                                   ForwardLauncher{z, out, numel, multiprocessors, stream});
}

size_t activation_backward_workspace_size(DType dtype, int64_t rows, int64_t cols,
                                          int multiprocessors) {
  (void)multiprocessors;  // the partition depends on the shape only (reproducible everywhere)
  if (rows <= 0 || cols <= 0 || dtype_bytes(dtype) == 0) return 0;
  const BwdPartition p = bwd_partition(dtype, rows, cols);
  return static_cast<size_t>(p.chunks) * static_cast<size_t>(cols) *
         static_cast<size_t>(acc_bytes(dtype));
}

cudaError_t launch_activation_backward(DType dtype, Activation act, const void* grad_out,
                                       const void* z, void* grad_z, int64_t rows, int64_t cols,
                                       void* bias_grad, void* workspace, size_t workspace_bytes,
                                       int multiprocessors, cudaStream_t stream) {
  if (rows < 0 || cols < 0) return cudaErrorInvalidValue;
  return with_dtype_and_activation(
      dtype, act,
      BackwardLauncher{dtype, grad_out, z, grad_z, rows, cols, bias_grad, workspace,
                       workspace_bytes, multiprocessors, stream});
}

}  // namespace kernels
}  // namespace cutlass_nn
