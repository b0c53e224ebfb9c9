// Torch-free interface of the batched split-K's reduction pass (gemm_dispatch.cu's second
// kernel where GemmPlan::k_slices > 1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm_params.h"

namespace cutlass_nn {
namespace kernels {

// D = sum_{l < slices} P_l (+ C): P_l the l-th of `slices` contiguous fp32 m x n row-major
// partial products (alpha already applied), summed in order l = 0, 1, ... (deterministic); then
// out's C term: beta * C[i, j] where out.c is set and beta != 0, or beta * bias[j] for a
// row-broadcast C;
// the result rounded once to out.dtype_cd (16-bit or float32) into out.d (RowMajor, out.ldd).
// out.c may alias out.d (in-place accumulation): each element is read before it is written, by
// the same thread. Returns kLaunchFailed if the launch fails.
GemmStatus reduce_k_slices(const float* partials, int slices, const GemmParams& out,
                           cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
