// Torch-free interface of the gated-activation kernels of the gated MLP (SwiGLU / GeGLU):
//
//   out[r, j] = act(gate_up[r, j]) * gate_up[r, n + j]                        (forward)
//   grad_gate_up[r, j]     = grad_out[r, j] * gate_up[r, n + j] * act'(gate_up[r, j])
//   grad_gate_up[r, n + j] = grad_out[r, j] * act(gate_up[r, j])             (backward)
//
// for a contiguous gate+up GEMM output gate_up [rows, 2n] (the gate in its first n columns).
// Computed in float (double for kFloat64), each output rounded once; the scalar math is
// activation_math.h's, shared with the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "activation_math.h"  // Activation
#include "gemm_params.h"      // DType

namespace cutlass_nn {
namespace kernels {

// out [rows, n] from gate_up [rows, 2n]; both contiguous, of `dtype`, not overlapping. 16-byte
// accesses where n and the pointers allow. `multiprocessors` sizes the grid (<= 0: queried).
// Returns the launch status.
cudaError_t launch_gated_act_forward(DType dtype, Activation act, const void* gate_up, void* out,
                                     int64_t rows, int64_t n, int multiprocessors,
                                     cudaStream_t stream);

// grad_gate_up [rows, 2n] from grad_out [rows, n] and gate_up [rows, 2n] in one pass, and, when
// out != nullptr, the recomputed forward out [rows, n] from the same loads (the backward of the
// gated MLP needs it for the down projection's weight gradient). All contiguous, of `dtype`; the
// outputs do not overlap the inputs or each other, except that grad_gate_up may be gate_up
// itself (in place).
cudaError_t launch_gated_act_backward(DType dtype, Activation act, const void* grad_out,
                                      const void* gate_up, void* grad_gate_up, void* out,
                                      int64_t rows, int64_t n, int multiprocessors,
                                      cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
