// FP8 quantization kernels (fp8_quantize.h). The absolute maximum is kept as the bits of a
// non-negative float: for those, and for a positive NaN (fabsf clears the sign), unsigned integer
// order is float order with NaN above infinity, so atomicMax / __reduce_max_sync on the bits take
// the maximum and let a NaN win, as torch's amax does.
#include "fp8_quantize.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

namespace cutlass_nn {
namespace kernels {
namespace {

constexpr float kAmaxFloor = 1e-12f;  // cutlass_nn.fp8_reference.AMAX_FLOOR

template <class T>
__device__ __forceinline__ float load_float(const T* p, int64_t i);
template <>
__device__ __forceinline__ float load_float<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float load_float<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
template <>
__device__ __forceinline__ float load_float<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(fabsf(v)); }

// 16-byte packs: kPack elements of T loaded with one instruction (the vectorized paths run where
// the row length is a multiple of kPack and x is 16-byte aligned).
template <class T>
struct Pack {
  static constexpr int kElems = 16 / sizeof(T);
  __device__ __forceinline__ static void load(const T* p, float (&v)[kElems]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kElems; ++i) v[i] = load_float(e, i);
  }
};

template <class T>
__device__ __forceinline__ uint32_t pack_max(const T* p) {
  float v[Pack<T>::kElems];
  Pack<T>::load(p, v);
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < Pack<T>::kElems; ++i) m = max(m, abs_bits(v[i]));
  return m;
}

// qs = largest / clamp_min(amax, floor) as the reference computes it: the reciprocal, then the
// product, each rounded to float32; clamp_min keeps a NaN (as torch's does).
__device__ __forceinline__ float quant_scale(uint32_t amax_bits, float largest) {
  const float a = __uint_as_float(amax_bits);
  const float clamped = (a != a) ? a : (a < kAmaxFloor ? kAmaxFloor : a);
  return __fmul_rn(__frcp_rn(clamped), largest);
}

// The quantization factor of slice j: from its maximum, or the reciprocal of a given scale.
__device__ __forceinline__ float slice_qs(const uint32_t* amax, const float* given, int64_t j,
                                          float largest) {
  return given != nullptr ? __frcp_rn(given[j]) : quant_scale(amax[j], largest);
}

__device__ __forceinline__ uint8_t to_fp8(float v, float qs, float largest, Fp8Format format) {
  float s = __fmul_rn(v, qs);
  s = s > largest ? largest : (s < -largest ? -largest : s);  // NaN passes through
  const __nv_fp8_interpretation_t kind = format == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, kind));
}

// Maximum over one row per block (grid-stride over rows); written directly.
template <class T, bool kVec>
__global__ void amax_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                 uint32_t* __restrict__ amax) {
  __shared__ uint32_t warp_max[32];
  constexpr int E = Pack<T>::kElems;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    uint32_t m = 0;
    if constexpr (kVec) {
      for (int64_t c = threadIdx.x * int64_t(E); c < cols; c += int64_t(blockDim.x) * E) {
        m = max(m, pack_max(x + r * cols + c));
      }
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        m = max(m, abs_bits(load_float(x, r * cols + c)));
      }
    }
    m = __reduce_max_sync(0xffffffffu, m);
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
      uint32_t w = threadIdx.x < (blockDim.x >> 5) ? warp_max[threadIdx.x] : 0u;
      w = __reduce_max_sync(0xffffffffu, w);
      if (threadIdx.x == 0) amax[r] = w;
    }
    __syncthreads();
  }
}

// Maximum over everything: grid-stride, one atomicMax per warp.
template <class T, bool kVec>
__global__ void amax_tensor_kernel(const T* __restrict__ x, int64_t n, uint32_t* __restrict__ amax) {
  uint32_t m = 0;
  constexpr int E = kVec ? Pack<T>::kElems : 1;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * E; i < n;
       i += int64_t(gridDim.x) * blockDim.x * E) {
    if constexpr (kVec) {
      m = max(m, pack_max(x + i));
    } else {
      m = max(m, abs_bits(load_float(x, i)));
    }
  }
  m = __reduce_max_sync(0xffffffffu, m);
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(amax, m);
}

// Maximum per column: 32 columns per block (threadIdx.x), rows strided over threadIdx.y and
// gridDim.y; one atomicMax per thread.
template <class T>
__global__ void amax_cols_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                 uint32_t* __restrict__ amax) {
  const int64_t c = blockIdx.x * 32 + threadIdx.x;
  if (c >= cols) return;
  uint32_t m = 0;
  for (int64_t r = blockIdx.y * int64_t(blockDim.y) + threadIdx.y; r < rows;
       r += int64_t(gridDim.y) * blockDim.y) {
    m = max(m, abs_bits(load_float(x, r * cols + c)));
  }
  if (m != 0) atomicMax(amax + c, m);
}

__device__ __forceinline__ int64_t scale_index(Fp8Axis axis, int64_t r, int64_t c) {
  return axis == Fp8Axis::kTensor ? 0 : axis == Fp8Axis::kRow ? r : c;
}

__device__ __forceinline__ void write_scales(const uint32_t* amax, float* scale, int64_t count,
                                             float largest) {
  const int64_t block = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t threads = int64_t(blockDim.x) * blockDim.y;
  const int64_t tid = block * threads + threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t total = int64_t(gridDim.x) * gridDim.y * threads;
  for (int64_t j = tid; j < count; j += total) scale[j] = __frcp_rn(quant_scale(amax[j], largest));
}

// data[r, c] = cast(x[r, c] * qs): rows over blocks (grid-stride), columns over threads; then the
// scales.
template <class T, bool kVec>
__global__ void cast_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, Fp8Axis axis,
                            Fp8Format format, float largest, const uint32_t* __restrict__ amax, const float* __restrict__ given,
                            uint8_t* __restrict__ data, float* __restrict__ scale,
                            int64_t scale_count) {
  const float tensor_qs = slice_qs(amax, given, 0, largest);
  constexpr int E = Pack<T>::kElems;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float row_qs = axis == Fp8Axis::kRow ? slice_qs(amax, given, r, largest) : tensor_qs;
    if constexpr (kVec) {
      // E elements in, E bytes out (8 for 16-bit x, 4 for float32) with one store each
      for (int64_t c = threadIdx.x * int64_t(E); c < cols; c += int64_t(blockDim.x) * E) {
        float v[E];
        Pack<T>::load(x + r * cols + c, v);
        using Store = std::conditional_t<E == 8, uint2, uint32_t>;
        union {
          uint8_t bytes[E];
          Store word;
        } out;
#pragma unroll
        for (int i = 0; i < E; ++i) {
          const float qs = axis == Fp8Axis::kColumn ? slice_qs(amax, given, c + i, largest) : row_qs;
          out.bytes[i] = to_fp8(v[i], qs, largest, format);
        }
        *reinterpret_cast<Store*>(data + r * cols + c) = out.word;
      }
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float qs = axis == Fp8Axis::kColumn ? slice_qs(amax, given, c, largest) : row_qs;
        data[r * cols + c] = to_fp8(load_float(x, r * cols + c), qs, largest, format);
      }
    }
  }
  if (given == nullptr) write_scales(amax, scale, scale_count, largest);
}

// data^T [cols, rows]: 32x32 tiles through shared memory (blockDim 32 x 8); with data_rows,
// the untransposed data too (kBoth).
template <class T, bool kBoth>
__global__ void cast_transposed_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                       Fp8Axis axis, Fp8Format format, float largest,
                                       const uint32_t* __restrict__ amax, const float* __restrict__ given,
                                       uint8_t* __restrict__ data, uint8_t* __restrict__ data_rows,
                                       float* __restrict__ scale, int64_t scale_count) {
  __shared__ uint8_t tile[32][33];
  const float tensor_qs = slice_qs(amax, given, 0, largest);
  // row tiles on grid.x (up to 2^31 - 1 of them: any token count), column tiles on grid.y
  const int64_t r0 = int64_t(blockIdx.x) * 32, c0 = int64_t(blockIdx.y) * 32;
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      float qs = tensor_qs;
      if (axis != Fp8Axis::kTensor) qs = slice_qs(amax, given, scale_index(axis, r, c), largest);
      const uint8_t q = to_fp8(load_float(x, r * cols + c), qs, largest, format);
      tile[j][threadIdx.x] = q;
      if constexpr (kBoth) data_rows[r * cols + c] = q;
    }
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) data[c * rows + r] = tile[threadIdx.x][j];
  }
  if (given == nullptr) write_scales(amax, scale, scale_count, largest);
}

// The transposed cast of 16-byte packs: 64x64 tiles, 256 threads. Each thread loads whole packs
// of x along a row (one 16-byte load for E elements), keeps the casts in shared memory, and
// writes 16 consecutive bytes of a row of data^T (one 16-byte store). Needs x 16-byte aligned
// with cols a multiple of the pack, rows a multiple of 16 and data 16-byte aligned (the caller
// checks; the 32x32 kernel above takes the rest). With kBoth the untransposed data is written
// from the registers too (E bytes per store).
template <class T, bool kBoth>
__global__ void __launch_bounds__(256)
    cast_transposed_packs_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, Fp8Axis axis,
                                 Fp8Format format, float largest, const uint32_t* __restrict__ amax, const float* __restrict__ given,
                                 uint8_t* __restrict__ data, uint8_t* __restrict__ data_rows,
                                 float* __restrict__ scale, int64_t scale_count) {
  constexpr int E = Pack<T>::kElems;  // 8 (16-bit x) or 4 (float32 x)
  constexpr int kTile = 64;
  constexpr int kPacksPerRow = kTile / E;
  __shared__ uint8_t tile[kTile][kTile + 4];  // [row][column] of the tile, padded against conflicts
  const float tensor_qs = slice_qs(amax, given, 0, largest);
  const int64_t r0 = int64_t(blockIdx.x) * kTile, c0 = int64_t(blockIdx.y) * kTile;
  for (int i = threadIdx.x; i < kTile * kPacksPerRow; i += blockDim.x) {
    const int lr = i / kPacksPerRow, lc = (i % kPacksPerRow) * E;
    const int64_t r = r0 + lr, c = c0 + lc;
    if (r < rows && c < cols) {  // cols % E == 0: the whole pack is inside
      float v[E];
      Pack<T>::load(x + r * cols + c, v);
      const float row_qs = axis == Fp8Axis::kRow ? slice_qs(amax, given, r, largest) : tensor_qs;
      using Store = std::conditional_t<E == 8, uint2, uint32_t>;
      union {
        uint8_t bytes[E];
        Store word;
      } out;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float qs = axis == Fp8Axis::kColumn ? slice_qs(amax, given, c + e, largest) : row_qs;
        out.bytes[e] = to_fp8(v[e], qs, largest, format);
        tile[lr][lc + e] = out.bytes[e];
      }
      if constexpr (kBoth) *reinterpret_cast<Store*>(data_rows + r * cols + c) = out.word;
    }
  }
  __syncthreads();
  // data^T rows c0..c0+63, 16 bytes each of rows r0..r0+63: 4 stores per row of the tile
  for (int i = threadIdx.x; i < kTile * (kTile / 16); i += blockDim.x) {
    const int lc = i / (kTile / 16), lr = (i % (kTile / 16)) * 16;
    const int64_t c = c0 + lc, r = r0 + lr;
    if (c < cols && r < rows) {  // rows % 16 == 0: the 16 bytes are inside
      union {
        uint8_t bytes[16];
        uint4 word;
      } out;
#pragma unroll
      for (int j = 0; j < 16; ++j) out.bytes[j] = tile[lr + j][lc];
      *reinterpret_cast<uint4*>(data + c * rows + r) = out.word;
    }
  }
  if (given == nullptr) write_scales(amax, scale, scale_count, largest);
}

template <class T, bool kVec>
cudaError_t run(const Fp8QuantizeParams& p, cudaStream_t stream) {
  const T* x = static_cast<const T*>(p.x);
  const int64_t count = fp8_scale_count(p.axis, p.rows, p.cols);
  const int64_t n = p.rows * p.cols;
  const int sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  const float largest = p.format == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
  auto* data = static_cast<uint8_t*>(p.data);
  const float* given = p.given_scale;
  cudaError_t err = cudaSuccess;
  if (given == nullptr) {
    err = cudaMemsetAsync(p.amax, 0, sizeof(uint32_t) * std::max<int64_t>(count, 1), stream);
    if (err != cudaSuccess) return err;
  }
  if (n > 0 && given == nullptr) {
    if (p.axis == Fp8Axis::kRow) {
      const int threads = p.cols >= 1024 ? 512 : 128;
      const int64_t blocks = std::min<int64_t>(p.rows, int64_t(sms) * 16);
      amax_rows_kernel<T, kVec><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, p.rows, p.cols, p.amax);
    } else if (p.axis == Fp8Axis::kTensor) {
      const int64_t blocks = std::min<int64_t>((n + 255) / 256, int64_t(sms) * 8);
      amax_tensor_kernel<T, kVec><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, n, p.amax);
    } else {
      const int64_t col_blocks = (p.cols + 31) / 32;
      int64_t row_blocks = std::max<int64_t>(1, int64_t(sms) * 8 / col_blocks);
      row_blocks = std::min<int64_t>(row_blocks, (p.rows + 31) / 32);
      row_blocks = std::min<int64_t>(std::max<int64_t>(row_blocks, 1), 65535);
      amax_cols_kernel<T><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks)),
                            dim3(32, 8), 0, stream>>>(x, p.rows, p.cols, p.amax);
    }
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (p.transpose && n > 0) {
    auto* rows_out = static_cast<uint8_t*>(p.data_rows);
    const bool aligned = reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(rows_out) % 16 == 0;
    if (kVec && aligned && p.rows % 16 == 0) {
      const dim3 grid(static_cast<unsigned>((p.rows + 63) / 64), static_cast<unsigned>((p.cols + 63) / 64));
      if (grid.y > 65535) return cudaErrorInvalidConfiguration;  // more than 4,194,240 columns
      if (rows_out != nullptr) {
        cast_transposed_packs_kernel<T, true><<<grid, 256, 0, stream>>>(
            x, p.rows, p.cols, p.axis, p.format, largest, p.amax, given, data, rows_out, p.scale, count);
      } else {
        cast_transposed_packs_kernel<T, false><<<grid, 256, 0, stream>>>(
            x, p.rows, p.cols, p.axis, p.format, largest, p.amax, given, data, nullptr, p.scale, count);
      }
      return cudaGetLastError();
    }
    const dim3 grid(static_cast<unsigned>((p.rows + 31) / 32), static_cast<unsigned>((p.cols + 31) / 32));
    if (grid.y > 65535) return cudaErrorInvalidConfiguration;  // more than 2,097,120 columns
    if (rows_out != nullptr) {
      cast_transposed_kernel<T, true><<<grid, dim3(32, 8), 0, stream>>>(
          x, p.rows, p.cols, p.axis, p.format, largest, p.amax, given, data, rows_out, p.scale, count);
    } else {
      cast_transposed_kernel<T, false><<<grid, dim3(32, 8), 0, stream>>>(
          x, p.rows, p.cols, p.axis, p.format, largest, p.amax, given, data, nullptr, p.scale, count);
    }
  } else {
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(std::max(p.rows, (count + 255) / 256),
                                                                  int64_t(sms) * 16));
    cast_kernel<T, kVec><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, p.rows, p.cols, p.axis, p.format,
                                                                     largest, p.amax, given, data, p.scale, count);
  }
  return cudaGetLastError();
}

template <class T>
cudaError_t run_any(const Fp8QuantizeParams& p, cudaStream_t stream) {
  // 16-byte packs where every row starts on a pack: x 16-byte aligned and the row length a
  // multiple of the pack (the data rows then start on 8- / 4-byte boundaries for the stores).
  const bool vec = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.data) % 16 == 0 &&
                   p.cols % Pack<T>::kElems == 0;
  return vec ? run<T, true>(p, stream) : run<T, false>(p, stream);
}

}  // namespace

cudaError_t launch_fp8_quantize(const Fp8QuantizeParams& params, cudaStream_t stream) {
  switch (params.dtype_x) {
    case DType::kFloat32: return run_any<float>(params, stream);
    case DType::kFloat16: return run_any<__half>(params, stream);
    case DType::kBFloat16: return run_any<__nv_bfloat16>(params, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kernels
}  // namespace cutlass_nn
