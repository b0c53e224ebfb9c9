// The gated-activation kernels (interface: gated_act.h). Memory-bound elementwise work over rows
// of a [rows, 2n] GEMM output: a 2-D grid (column packs x row groups) so that a thread finds its
// gate and up elements without a 64-bit division, 16-byte packs where n and the pointers allow
// (a pack never straddles a row then), one element per thread otherwise.
#include "gated_act.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "dtype_pack.cuh"    // AccType, to_acc / from_acc, Pack16
#include "launch_helpers.h"  // resolve_multiprocessors, aligned16

namespace cutlass_nn {
namespace kernels {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxGridY = 65535;

// kN consecutive elements of T: one 16-byte pack (kVec) or a single element.
template <typename T, bool kVec> struct Chunk {
  static constexpr int kN = kVec ? Pack16<T>::kN : 1;
  T v[kN];
};

template <typename T, bool kVec>
__device__ __forceinline__ Chunk<T, kVec> load_chunk(const T* p) {
  if constexpr (kVec) {
    const Pack16<T> pack = *reinterpret_cast<const Pack16<T>*>(p);
    Chunk<T, kVec> c;
#pragma unroll
    for (int k = 0; k < Chunk<T, kVec>::kN; ++k) c.v[k] = pack.v[k];
    return c;
  } else {
    Chunk<T, kVec> c;
    c.v[0] = *p;
    return c;
  }
}

template <typename T, bool kVec>
__device__ __forceinline__ void store_chunk(T* p, const Chunk<T, kVec>& c) {
  if constexpr (kVec) {
    Pack16<T> pack;
#pragma unroll
    for (int k = 0; k < Chunk<T, kVec>::kN; ++k) pack.v[k] = c.v[k];
    *reinterpret_cast<Pack16<T>*>(p) = pack;
  } else {
    *p = c.v[0];
  }
}

// chunks = n / kN chunks per row; rows advance by gridDim.y, chunks by gridDim.x * blockDim.x.
// The forward takes kRows rows per step, their loads issued before any math or store: twice the
// bytes in flight per thread (with the occupancy-sized grid, forward 98.8 -> 78.5 us at 4096 x
// 11008 in bfloat16 with SiLU on an H200, 0.84 of a same-size device copy's bandwidth; other
// dtypes and activations not timed; the backward, with three loads per row already, measured
// slower so: 109 registers per thread, 2 blocks per SM).
template <typename T, Activation A, bool kVec>
__global__ void __launch_bounds__(kMaxThreads)
    gated_forward_kernel(const T* __restrict__ gate_up, T* __restrict__ out, int64_t rows,
                         int64_t n, int64_t chunks) {
  constexpr int kN = Chunk<T, kVec>::kN;
  constexpr int kRows = 2;
  const int64_t step = gridDim.y;
  for (int64_t r0 = blockIdx.y; r0 < rows; r0 += kRows * step) {
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t j = c * kN;
      Chunk<T, kVec> g[kRows], u[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int64_t r = r0 + i * step;
        if (r < rows) {
          g[i] = load_chunk<T, kVec>(gate_up + r * 2 * n + j);
          u[i] = load_chunk<T, kVec>(gate_up + r * 2 * n + n + j);
        }
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int64_t r = r0 + i * step;
        if (r < rows) {
          Chunk<T, kVec> o;
#pragma unroll
          for (int k = 0; k < kN; ++k) {
            o.v[k] = from_acc<T>(activation_forward(A, to_acc(g[i].v[k])) * to_acc(u[i].v[k]));
          }
          store_chunk<T, kVec>(out + r * n + j, o);
        }
      }
    }
  }
}

// grad_gate_up may be gate_up itself (in place): every element is read and then written by the
// same thread, and no other thread touches it, hence no __restrict__ on those two.
template <typename T, Activation A, bool kVec>
__global__ void __launch_bounds__(kMaxThreads)
    gated_backward_kernel(const T* __restrict__ grad_out, const T* gate_up, T* grad_gate_up,
                          T* __restrict__ out, int64_t rows,
                          int64_t n, int64_t chunks) {
  using Acc = typename AccType<T>::type;
  constexpr int kN = Chunk<T, kVec>::kN;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* gate_row = gate_up + r * 2 * n;
    const T* grad_row = grad_out + r * n;
    T* grad_gate_row = grad_gate_up + r * 2 * n;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t j = c * kN;
      const Chunk<T, kVec> go = load_chunk<T, kVec>(grad_row + j);
      const Chunk<T, kVec> g = load_chunk<T, kVec>(gate_row + j);
      const Chunk<T, kVec> u = load_chunk<T, kVec>(gate_row + n + j);
      Chunk<T, kVec> o, dg, du;
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        Acc vo, vdg, vdu;
        gated_backward<Acc>(A, to_acc(go.v[k]), to_acc(g.v[k]), to_acc(u.v[k]), vo, vdg, vdu);
        o.v[k] = from_acc<T>(vo);
        dg.v[k] = from_acc<T>(vdg);
        du.v[k] = from_acc<T>(vdu);
      }
      store_chunk<T, kVec>(grad_gate_row + j, dg);
      store_chunk<T, kVec>(grad_gate_row + n + j, du);
      if (out != nullptr) store_chunk<T, kVec>(out + r * n + j, o);
    }
  }
}

// The grid of a [rows, chunks] problem: enough threads in x for one row's chunks (capped at one
// block of kMaxThreads per step), and row groups in y for `blocks_per_sm` blocks of that size
// per SM. The forward asks for the blocks its registers let reside at once (one wave, its row
// loop balancing the work; 4 blocks of 256 at 64 registers per thread in bfloat16 with SiLU);
// the backward, as before v0.34, for kBackwardBlocksPerSm blocks of 256 threads per SM (more for
// smaller blocks), more than reside (4 of 256 at 60 registers): with the occupancy-sized grid it
// measured no faster at 4096 x 11008 and 16384 x 14336 and slower at 4096 x 2816 (bfloat16,
// SiLU, H200; benchmarks/NOTES.md v0.34).
constexpr int64_t kBackwardBlocksPerSm = 8;

struct Grid {
  dim3 grid, block;
};

int64_t block_threads(int64_t chunks) {
  return std::min<int64_t>(kMaxThreads, std::max<int64_t>(32, (chunks + 31) / 32 * 32));
}

Grid make_grid(int64_t rows, int64_t chunks, int64_t threads, int64_t blocks_per_sm,
               int multiprocessors) {
  const int64_t blocks_x = std::max<int64_t>(1, (chunks + threads - 1) / threads);
  const int64_t target = static_cast<int64_t>(resolve_multiprocessors(multiprocessors)) *
                         std::max<int64_t>(blocks_per_sm, 1);
  const int64_t bx = std::min<int64_t>(blocks_x, target);
  const int64_t by = std::clamp<int64_t>(target / bx, 1, std::min<int64_t>(rows, kMaxGridY));
  return {dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by)),
          dim3(static_cast<unsigned>(threads))};
}

// Blocks of `threads` threads of `kernel` resident on one SM at once (at least 1). The
// occupancy query is a host-side computation on the kernel's attributes; it is asked once per
// kernel and block size: a cache with one slot per block size in warps (1..kMaxThreads / 32) per
// kernel (the kernel is a template
// argument, not a function argument, so that kernels of one signature but different activations
// or vector widths, whose register counts differ, get caches of their own; the first device's
// answer; with GPUs of different architectures in one process the others' grids are sized by it,
// which changes their speed, not their results).
template <auto kernel>
int resident_blocks(int64_t threads) {
  static std::atomic<int> cache[kMaxThreads / 32 + 1] = {};
  const int slot = static_cast<int>(threads / 32);
  int n = cache[slot].load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, static_cast<int>(threads), 0) !=
          cudaSuccess ||
      n < 1) {
    // one block per SM this time, not cached (the next launch asks again); the launch itself
    // reports real problems
    (void)cudaGetLastError();
    return 1;
  }
  cache[slot].store(n, std::memory_order_relaxed);
  return n;
}

template <typename T> constexpr bool vec_ok(int64_t n) { return n % Pack16<T>::kN == 0; }

template <typename T, Activation A>
cudaError_t forward_typed(const void* gate_up, void* out, int64_t rows, int64_t n,
                          int multiprocessors, cudaStream_t stream) {
  const T* gu = static_cast<const T*>(gate_up);
  T* o = static_cast<T*>(out);
  if (vec_ok<T>(n) && aligned16(gu) && aligned16(o)) {
    const int64_t chunks = n / Pack16<T>::kN;
    const int64_t threads = block_threads(chunks);
    constexpr auto kernel = gated_forward_kernel<T, A, true>;
    const Grid g = make_grid(rows, chunks, threads, resident_blocks<kernel>(threads),
                             multiprocessors);
    kernel<<<g.grid, g.block, 0, stream>>>(gu, o, rows, n, chunks);
  } else {
    const int64_t threads = block_threads(n);
    constexpr auto kernel = gated_forward_kernel<T, A, false>;
    const Grid g = make_grid(rows, n, threads, resident_blocks<kernel>(threads), multiprocessors);
    kernel<<<g.grid, g.block, 0, stream>>>(gu, o, rows, n, n);
  }
  return cudaGetLastError();
}

template <typename T, Activation A>
cudaError_t backward_typed(const void* grad_out, const void* gate_up, void* grad_gate_up,
                           void* out, int64_t rows, int64_t n, int multiprocessors,
                           cudaStream_t stream) {
  const T* go = static_cast<const T*>(grad_out);
  const T* gu = static_cast<const T*>(gate_up);
  T* dgu = static_cast<T*>(grad_gate_up);
  T* o = static_cast<T*>(out);
  const bool vec = vec_ok<T>(n) && aligned16(go) && aligned16(gu) && aligned16(dgu) &&
                   (o == nullptr || aligned16(o));
  if (vec) {
    const int64_t chunks = n / Pack16<T>::kN;
    const int64_t threads = block_threads(chunks);
    const Grid g = make_grid(rows, chunks, threads, kBackwardBlocksPerSm * (kMaxThreads / threads),
                             multiprocessors);
    gated_backward_kernel<T, A, true>
        <<<g.grid, g.block, 0, stream>>>(go, gu, dgu, o, rows, n, chunks);
  } else {
    const int64_t threads = block_threads(n);
    const Grid g = make_grid(rows, n, threads, kBackwardBlocksPerSm * (kMaxThreads / threads),
                             multiprocessors);
    gated_backward_kernel<T, A, false><<<g.grid, g.block, 0, stream>>>(go, gu, dgu, o, rows, n, n);
  }
  return cudaGetLastError();
}

// Calls f.template run<T, A>() for the runtime (dtype, act); the gated activations only.
template <typename F> cudaError_t dispatch(DType dtype, Activation act, F&& f) {
  auto with_act = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    switch (act) {
      case Activation::kSilu: return f.template run<T, Activation::kSilu>();
      case Activation::kGelu: return f.template run<T, Activation::kGelu>();
      case Activation::kGeluTanh: return f.template run<T, Activation::kGeluTanh>();
      default: return cudaErrorInvalidValue;
    }
  };
  switch (dtype) {
    case DType::kFloat16: return with_act(__half{});
    case DType::kBFloat16: return with_act(__nv_bfloat16{});
    case DType::kFloat32: return with_act(float{});
    case DType::kFloat64: return with_act(double{});
  }
  return cudaErrorInvalidValue;
}

struct ForwardLauncher {
  const void* gate_up;
  void* out;
  int64_t rows, n;
  int multiprocessors;
  cudaStream_t stream;
  template <typename T, Activation A> cudaError_t run() const {
    return forward_typed<T, A>(gate_up, out, rows, n, multiprocessors, stream);
  }
};

struct BackwardLauncher {
  const void* grad_out;
  const void* gate_up;
  void* grad_gate_up;
  void* out;
  int64_t rows, n;
  int multiprocessors;
  cudaStream_t stream;
  template <typename T, Activation A> cudaError_t run() const {
    return backward_typed<T, A>(grad_out, gate_up, grad_gate_up, out, rows, n, multiprocessors,
                                stream);
  }
};

}  // namespace

cudaError_t launch_gated_act_forward(DType dtype, Activation act, const void* gate_up, void* out,
                                     int64_t rows, int64_t n, int multiprocessors,
                                     cudaStream_t stream) {
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch(dtype, act, ForwardLauncher{gate_up, out, rows, n, multiprocessors, stream});
}

cudaError_t launch_gated_act_backward(DType dtype, Activation act, const void* grad_out,
                                      const void* gate_up, void* grad_gate_up, void* out,
                                      int64_t rows, int64_t n, int multiprocessors,
                                      cudaStream_t stream) {
  if (rows < 0 || n < 0) return cudaErrorInvalidValue;
  if (rows == 0 || n == 0) return cudaSuccess;
  return dispatch(dtype, act,
                  BackwardLauncher{grad_out, gate_up, grad_gate_up, out, rows, n,
                                   multiprocessors, stream});
}

}  // namespace kernels
}  // namespace cutlass_nn
