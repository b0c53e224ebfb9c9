// Per-operator argument checks, shared by the CPU and CUDA implementations so that both backends
// accept exactly the same inputs and fail with exactly the same messages.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "kernels/activation_math.h"

namespace cutlass_nn {

// linear(input [*, in], weight [out, in], bias [out]?)
void check_linear_args(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias);

// The same checks, with the messages naming operator `op` (e.g. "linear_act", "linear_act_aux").
void check_linear_args(const char* op, const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias);

// The activation names of linear_act / linear_act_aux / activation_grad: "none", "relu", "gelu",
// "gelu_tanh" (torch.nn.functional.relu, gelu(approximate="none"), gelu(approximate="tanh")).
// Anything else fails with
//   cutlass_nn.<op>: argument 'activation' must be one of "none", "relu", "gelu", "gelu_tanh",
//   got "<activation>"
kernels::Activation parse_activation(const char* op, c10::string_view activation);

// activation_grad(grad_output [*, features], preact [*, features]): same shape, dtype, device
void check_activation_grad_args(const at::Tensor& grad_output, const at::Tensor& preact);

// linear_dgrad(grad_output [*, out], weight [out, in])
void check_linear_dgrad_args(const at::Tensor& grad_output, const at::Tensor& weight);

// linear_wgrad(grad_output [*, out], input [*, in]) with the same leading dimensions
void check_linear_wgrad_args(const at::Tensor& grad_output, const at::Tensor& input);

// linear_wgrad_accumulate_(grad_weight [out, in], grad_output, input); grad_weight has the
// dtype of the inputs or float32 (an fp32 main gradient for 16-bit training)
void check_linear_wgrad_accumulate_args(const at::Tensor& grad_weight,
                                        const at::Tensor& grad_output, const at::Tensor& input);

// bias_grad(grad_output [*, out])
void check_bias_grad_args(const at::Tensor& grad_output);

// mm(a [n, m], b [m, p]); `op` is "mm" or "mm.out"
void check_mm_args(const char* op, const at::Tensor& a, const at::Tensor& b);

// mm.out: `out` must have the dtype and device of the inputs (it is resized like torch.mm's)
void check_mm_out_arg(const at::Tensor& a, const at::Tensor& out);

// add2(a, b): same shape, dtype and device
void check_add2_args(const at::Tensor& a, const at::Tensor& b);

}  // namespace cutlass_nn
