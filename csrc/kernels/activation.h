// Torch-free interface of the cutlass_nn activation kernels (the elementwise parts of the
// fused-activation linear layers: linear_act's activation where the GEMM epilogue does not apply
// it, and activation_grad). The scalar math is csrc/kernels/activation_math.h, shared with the
// GEMM epilogue and the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "activation_math.h"  // Activation
#include "gemm_params.h"      // DType

namespace cutlass_nn {
namespace kernels {

// out[i] = act(z[i]) for 0 <= i < numel, computed in float (double for kFloat64) and rounded once
// to `dtype`. Both buffers are contiguous, of `dtype`, and either identical (in place) or not
// overlapping. 16-byte vectorized where both pointers allow it; grid-stride loop sized from
// `multiprocessors` (<= 0: queried from the current device). Returns the launch status.
cudaError_t launch_activation_forward(DType dtype, Activation act, const void* z, void* out,
                                      int64_t numel, int multiprocessors, cudaStream_t stream);

// Bytes of workspace that launch_activation_backward needs for a [rows, cols] problem of
// `dtype` with a bias gradient (0 when rows or cols is 0). Depends on the shape and dtype only.
size_t activation_backward_workspace_size(DType dtype, int64_t rows, int64_t cols,
                                          int multiprocessors);

// The backward of act on a contiguous RowMajor [rows, cols] problem (all buffers of `dtype`):
//
//   grad_z[i, j] = round(grad_out[i, j] * act'(z[i, j]))   (computed in float / double)
//
// and, when bias_grad != nullptr, bias_grad[j] = sum_i grad_z[i, j] (of the rounded values,
// accumulated in float, double for kFloat64, rounded once to `dtype`; rows == 0 gives zeros).
//
// One pass over grad_out and z: each block of the 2-D grid (column strip x row chunk) writes
// grad_z and the column sums of its chunk into `workspace` (at least
// activation_backward_workspace_size(dtype, rows, cols, ...) bytes, 16-byte aligned; unused
// without bias_grad), then a second small kernel adds the chunks' partial sums in chunk order.
// No atomics and a partition that depends on (dtype, rows, cols) only: bitwise reproducible,
// on any GPU and for any pointer alignment. grad_z must not overlap grad_out or z.
// `multiprocessors` sizes the grid of the elementwise (no bias) path; <= 0: queried.
cudaError_t launch_activation_backward(DType dtype, Activation act, const void* grad_out,
                                       const void* z, void* grad_z, int64_t rows, int64_t cols,
                                       void* bias_grad, void* workspace, size_t workspace_bytes,
                                       int multiprocessors, cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
