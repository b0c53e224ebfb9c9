// Torch-free interface of the cutlass_nn cross-entropy row kernel: the loss of each row of a
// logits chunk and, in the same pass, the gradient of that loss written over the logits. The
// fused language-model head (cutlass_nn/linear_cross_entropy.py) runs it on each chunk of
// tokens between its logits GEMM and its two gradient GEMMs, so the full [tokens, vocab]
// logits never exist.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm_params.h"  // DType

namespace cutlass_nn {
namespace kernels {

// For each of `rows` contiguous rows z of `vocab` elements of `dtype` (row r at
// logits + r * vocab) with class index target[r] (int64):
//
//   lse[r]  = log(sum_j exp(z_j))                             (float; double for kFloat64)
//             (+inf for a row with a +inf logit, -inf for a row of -inf: torch.logsumexp's;
//             loss and gradient are NaN for such rows, as F.cross_entropy's)
//   loss[r] = lse - (1 - eps) * z_t - (eps / vocab) * sum_j z_j     (t = target[r])
//           = 0    when target[r] == ignore_index
//           = NaN  when target[r] is outside [0, vocab) (and not ignore_index)
//
// and, when write_grad, the row is overwritten with d loss[r] / d z times a row factor,
// computed in float and rounded once to dtype:
//
//   z_j <- (softmax(z)_j - eps / vocab - (1 - eps) * [j == t]) * scale
//   scale = (row_scale ? row_scale[r] : 1)   (row_scale: float; double for kFloat64)
//   ignored rows get exact zeros; out-of-range rows get NaN.
//
// eps is the label smoothing in [0, 1]. Two reads of each row (an online max / sum of
// exponentials, then the gradient) and one write; 16-byte accesses when the rows allow it.
cudaError_t launch_cross_entropy_rows(DType dtype, void* logits, const int64_t* target,
                                      const void* row_scale, int64_t rows, int64_t vocab,
                                      int64_t ignore_index, double label_smoothing,
                                      bool write_grad, void* loss, void* lse,
                                      int multiprocessors, cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
