// Torch-free interface of the cutlass_nn RMSNorm kernels (rms_norm / add_rms_norm and their
// backward): one pass over the activations each way, float statistics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm_params.h"  // DType

namespace cutlass_nn {
namespace kernels {

// Forward over `rows` contiguous rows of `cols` elements of `dtype`:
//
//   h    = input + residual, rounded to dtype     (residual != nullptr; h is written to h_out)
//   h    = input                                  (residual == nullptr; h_out is unused)
//   rstd = 1 / sqrt(mean_j(h_j^2) + eps)          (float; double for kFloat64), written to rstd
//   out  = h * rstd * weight, rounded once to dtype
//
// weight has `cols` elements of `weight_dtype`: `dtype`, or kFloat32 for 16-bit `dtype`.
// input, residual, out and h_out must not overlap each other. 16-byte loads and stores where
// the pointers and `cols` allow it; a row of up to 4096 16-byte packs stays in registers.
cudaError_t launch_rms_norm_forward(DType dtype, DType weight_dtype, const void* input,
                                    const void* residual, const void* weight, int64_t rows,
                                    int64_t cols, double eps, void* out, void* h_out, void* rstd,
                                    int multiprocessors, cudaStream_t stream);

// Rows of the float (double for kFloat64) weight-gradient partials that
// launch_rms_norm_backward writes: one per block of its grid. Depends on the shape, dtype and
// multiprocessor count only (so the result is reproducible on a given GPU).
int64_t rms_norm_backward_partial_rows(DType dtype, int64_t rows, int64_t cols,
                                       int multiprocessors);

// Backward of the forward above, with h and rstd as it produced them:
//
//   n      = h * rstd,  dn = grad_out * weight
//   grad_h = rstd * (dn - n * mean_j(dn_j * n_j)) + grad_h_in   (grad_h_in: nullptr = 0)
//   weight_partials[b, j] = sum over the rows of block b of grad_out[:, j] * n[:, j]
//
// grad_h is `dtype` (the gradient of input and of residual); weight_partials (nullptr: no
// weight gradient) is a [rms_norm_backward_partial_rows(...), cols] float (double for
// kFloat64) buffer whose column sums are the weight gradient. grad_h may alias grad_h_in (each
// element is read before it is written, by the same thread) but no other buffer.
cudaError_t launch_rms_norm_backward(DType dtype, DType weight_dtype, const void* grad_out,
                                     const void* grad_h_in, const void* h, const void* weight,
                                     const void* rstd, int64_t rows, int64_t cols, void* grad_h,
                                     void* weight_partials, int multiprocessors,
                                     cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
