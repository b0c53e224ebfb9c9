// CUDA side of the fused-activation operators: the elementwise activation for linear_act /
// linear_act_aux where the GEMM epilogue does not fuse it, and the activation_grad operator
// (registered in activation_cuda.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include "activation_math.h"  // kernels::Activation

namespace cutlass_nn {
namespace cuda {

// act(preact) as a new contiguous tensor of preact's shape, dtype and device (any strides in;
// computed in float, double for float64, rounded once). `op` names the calling operator in
// launch-error messages. preact must be a CUDA tensor of a float dtype (already checked).
at::Tensor apply_activation_cuda(const char* op, const at::Tensor& preact,
                                 kernels::Activation act);

// t = act(t) in place; t must be a contiguous CUDA tensor of a float dtype (already checked).
void apply_activation_cuda_(const char* op, const at::Tensor& t, kernels::Activation act);

// out = act(preact) into an existing tensor: `out` contiguous, with preact's shape, dtype and
// device, not overlapping preact unless identical to it (preact may have any strides).
void apply_activation_cuda_out(const char* op, const at::Tensor& preact, const at::Tensor& out,
                               kernels::Activation act);

}  // namespace cuda
}  // namespace cutlass_nn
