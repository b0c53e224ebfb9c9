// Torch-free interface of the operand preparation of cutlass_nn's float32 GEMMs on SM90. The SM90
// TF32 kernels read K-major A and B (the "tn" layout) in 16-byte aligned rows; this writes an
// operand in that form from any strides, in one of two forms:
//
//  * kCopy (TF32 matmuls, float32 matmul precision "high"): dst[r, c] = src(r, c), the plain
//    K-major copy, so that a dgrad / wgrad (or a misaligned forward) runs on the SM90 kernel.
//  * kSplitA / kSplitB (the 3xTF32 path of precision "highest"): x = big + small with
//    big = tf32(x), small = tf32(x - big), so that
//      A @ B ~= big(A) @ big(B) + big(A) @ small(B) + small(A) @ big(B)
//    to about fp32 accuracy (the dropped small @ small term is ~2^-22 relative), computed as ONE
//    TF32 GEMM over a K three times as long: [big(A) | big(A) | small(A)] @ [big(B); small(B);
//    big(B)].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutlass_nn {
namespace kernels {

enum class Tf32OperandForm : int {
  kCopy = 0,    // one K segment: x
  kSplitA = 1,  // three K segments: big, big, small
  kSplitB = 2,  // three K segments: big, small, big
};

// K segments of a form (the row length of dst is segments * kp).
inline int tf32_operand_segments(Tf32OperandForm form) {
  return form == Tf32OperandForm::kCopy ? 1 : 3;
}

// dst[r, s * kp + c] = part_s(src(r, c)) for r < rows, c < k, s < segments, and 0 for
// k <= c < kp. src element (r, c) is at src[r * src_row_stride + c * src_col_stride] (any
// strides: a transposed view is read in place); dst is row-major [rows, segments * kp], 16-byte
// aligned, with kp a multiple of 4 (else cudaErrorInvalidValue). In a split, a non-finite x is
// written to segment 0 (the big x big product) and 0 to the others, so infinities and NaN give the
// non-finite results an fp32 GEMM would (kSplitA's segment 0 meets kSplitB's segment 0).
cudaError_t launch_tf32_operand(const float* src, int64_t rows, int64_t k,
                                int64_t src_row_stride, int64_t src_col_stride, float* dst,
                                int64_t kp, Tf32OperandForm form, cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
