// The operand split of the 3xTF32 path: see split_tf32.h.
#include <cstdint>

#include "split_tf32.h"

namespace cutlass_nn {
namespace kernels {
namespace {

// Round to the nearest TF32 value (10 explicit mantissa bits), ties away from zero: the rounding
// cvt.rna.tf32.f32 of sm_80+ (the tensor cores themselves would truncate the low 13 bits).
__device__ __forceinline__ float round_to_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
#else
  // Same rounding on the bit pattern (only reached on pre-sm_80 targets, never launched there).
  const uint32_t bits = __float_as_uint(x);
  return __uint_as_float((bits + 0x1000u) & 0xffffe000u);
#endif
}

constexpr int kTileRows = 32;
constexpr int kTileCols = 32;
constexpr int kThreads = 256;
constexpr int kColGroups = kTileCols / 4;  // float4 column groups of a tile row

// The three parts of x for the K segments selected by `pattern` (see split_tf32.h).
struct Parts {
  float seg[3];
};

__device__ __forceinline__ Parts split_one(float x, int pattern) {
  Parts p;
  if (!isfinite(x)) {
    // inf / NaN only in the big x big segment (0 elsewhere): the sum then has exactly the
    // non-finite terms an fp32 product would have (no inf * 0 or inf - inf of our making).
    p.seg[0] = x;
    p.seg[1] = 0.0f;
    p.seg[2] = 0.0f;
    return p;
  }
  float big = round_to_tf32(x);
  // Rounding up may overflow next to FLT_MAX: truncate there instead.
  if (!isfinite(big)) big = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
  const float small = round_to_tf32(x - big);
#pragma unroll
  for (int s = 0; s < 3; ++s) p.seg[s] = (pattern >> s) & 1 ? small : big;
  return p;
}

// One 32x32 tile of the logical [rows, kp] matrix per block, staged through shared memory so
// that a transposed source is read along its contiguous dimension and dst is written along its
// own: both coalesced whichever way src is laid out. Stores are 16-byte (4 consecutive columns
// of one segment per thread; kp and the tile's first column are multiples of 4): the first
// version stored one float per thread and ran at 2.9 TB/s (344 us for an 8192 x 8192 operand on
// an H200, 6% of a 3xTF32 GEMM of 8192^3).
__global__ void __launch_bounds__(kThreads)
    split_tf32_kernel(const float* __restrict__ src, int64_t rows, int64_t k, int64_t s_row,
                      int64_t s_col, float* __restrict__ dst, int64_t kp, int pattern) {
  __shared__ float tile[kTileRows][kTileCols + 1];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTileRows;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileCols;
  const bool row_contiguous = s_col == 1 || s_row != 1;
  // Load: threadIdx.x runs along the contiguous dimension of src.
  for (int i = threadIdx.y; i < kTileRows; i += blockDim.y) {
    const int j = threadIdx.x;
    const int tr = row_contiguous ? i : j, tc = row_contiguous ? j : i;
    const int64_t r = r0 + tr, c = c0 + tc;
    tile[tr][tc] = (r < rows && c < k) ? src[r * s_row + c * s_col] : 0.0f;
  }
  __syncthreads();
  // Store: thread t writes columns [4 * (t % 8), +4) of tile row t / 8 in each segment.
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
  const int i = t / kColGroups, j = (t % kColGroups) * 4;
  const int64_t r = r0 + i, c = c0 + j;
  if (r >= rows || c >= kp) return;
  Parts p[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) p[e] = split_one(tile[i][j + e], pattern);
  float4* row = reinterpret_cast<float4*>(dst + r * 3 * kp + c);
  const int64_t seg = kp / 4;  // a segment's length in float4
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    row[s * seg] = make_float4(p[0].seg[s], p[1].seg[s], p[2].seg[s], p[3].seg[s]);
  }
}

}  // namespace

cudaError_t launch_split_tf32(const float* src, int64_t rows, int64_t k, int64_t src_row_stride,
                              int64_t src_col_stride, float* dst, int64_t kp, int pattern,
                              cudaStream_t stream) {
  if (rows <= 0 || kp <= 0) return cudaSuccess;
  if (kp % 4 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t grid_x = (kp + kTileCols - 1) / kTileCols;
  const int64_t grid_y = (rows + kTileRows - 1) / kTileRows;
  if (grid_y > 65535 || grid_x > 2147483647) return cudaErrorInvalidConfiguration;
  const dim3 block(kTileCols, kThreads / kTileCols);
  const dim3 grid(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y));
  split_tf32_kernel<<<grid, block, 0, stream>>>(src, rows, k, src_row_stride, src_col_stride, dst,
                                                kp, pattern);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace cutlass_nn
