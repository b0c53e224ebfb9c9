// Torch-free interface of the operand split of cutlass_nn's 3xTF32 path (float32 matmuls at
// precision "highest" on SM90): x = big + small with big = tf32(x), small = tf32(x - big), so that
//   A @ B ~= big(A) @ big(B) + big(A) @ small(B) + small(A) @ big(B)
// to about fp32 accuracy (the dropped small @ small term is ~2^-22 relative), computed as ONE TF32
// GEMM over a K three times as long: [big(A) | big(A) | small(A)] @ [big(B); small(B); big(B)].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutlass_nn {
namespace kernels {

// Which part goes into each of the three K segments: bit s set = small part in segment s.
constexpr int kSplitPatternA = 0b100;  // big, big, small
constexpr int kSplitPatternB = 0b010;  // big, small, big

// dst[r, s * kp + c] = part_s(src(r, c)) for r < rows, c < k, s < 3, and 0 for k <= c < kp.
// src element (r, c) is at src[r * src_row_stride + c * src_col_stride] (any strides: a
// transposed view is read in place); dst is row-major [rows, 3 * kp], 16-byte aligned, with kp a
// multiple of 4 (else cudaErrorInvalidValue). A non-finite x is written
// to segment 0 (the big x big product) and 0 to the others, so infinities and NaN give the
// non-finite results an fp32 GEMM would (pattern A's segment 0 meets pattern B's segment 0).
cudaError_t launch_split_tf32(const float* src, int64_t rows, int64_t k, int64_t src_row_stride,
                              int64_t src_col_stride, float* dst, int64_t kp, int pattern,
                              cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
