// RMSNorm written with ATen operators: the CPU kernels of rms_norm / add_rms_norm /
// rms_norm_backward, and the backward the autograd kernel uses under create_graph (every step
// is a differentiable ATen op, so second-order gradients flow through it).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace cutlass_nn {

// (out, h, rstd): h = input + residual (rounded to input's dtype; input itself when residual is
// nullptr), rstd = 1 / sqrt(mean(h^2, -1) + eps) in the statistics dtype (float32, float64 for
// float64 input), out = h * rstd * weight rounded once to input's dtype. No argument checks.
std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_forward_aten(const at::Tensor& input,
                                                                     const at::Tensor* residual,
                                                                     const at::Tensor& weight,
                                                                     double eps);

// (grad_h, grad_weight) of the forward above for output gradient grad_output, plus grad_h_in
// (the gradient reaching h from elsewhere; undefined = none). rstd undefined: recomputed from h
// with eps (so the result is differentiable in h through rstd too). grad_weight is in weight's
// dtype, or an empty [0] tensor without weight_grad.
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_aten(const at::Tensor& grad_output,
                                                          const at::Tensor& grad_h_in,
                                                          const at::Tensor& h,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& rstd, double eps,
                                                          bool weight_grad);

}  // namespace cutlass_nn
