// Main-gradient buffers (cutlass_nn.attach_main_grads): a weight registered here with a buffer
// (the weight's shape and device, contiguous, in the weight's own dtype or float32 beside a
// 16-bit weight: what _set_main_grad accepts, csrc/op_checks.h's check_main_grad_args) has its
// weight gradient added into that buffer by the backward of linear / linear_act / gated_mlp, in
// the GEMM itself (beta = 1), and autograd receives no gradient for it
// (csrc/autograd/autograd_kernels.cpp, grad_to_accumulate_into).
// The registry holds the weight and the buffer weakly (an entry keeps neither alive: the Python
// side keeps the buffer as the parameter's main_grad attribute); entries whose weight or buffer
// has died are dropped when looked up and on the next registration.
#pragma once

#include <ATen/core/Tensor.h>

namespace cutlass_nn {

// Registers `buffer` as the main gradient of `weight`; an undefined buffer removes the entry.
void set_main_grad(const at::Tensor& weight, const at::Tensor& buffer);

// The buffer registered for `weight`, or an undefined tensor.
at::Tensor main_grad_of(const at::Tensor& weight);

// Whether any weight is registered (a lock-free check for the backward's fast path).
bool any_main_grads();

}  // namespace cutlass_nn
