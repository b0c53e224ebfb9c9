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

// The activation names of the gated operators (gated_act, gated_act_backward, gated_mlp):
// "silu", "gelu", "gelu_tanh"; anything else fails like parse_activation.
kernels::Activation parse_gated_activation(const char* op, c10::string_view activation);

// gated_act / gated_act_backward's gate_up [*, 2n]: a floating tensor with an even last dim.
void check_gate_up_arg(const char* op, const at::Tensor& gate_up);

// gated_act_backward / gated_act_backward_ (`op`)(grad_output [*, n], gate_up [*, 2n]): same
// dtype and device.
void check_gated_act_backward_args(const at::Tensor& grad_output, const at::Tensor& gate_up,
                                   const char* op = "gated_act_backward");

// gated_act_backward_ writes over gate_up: it must be writable (check_writable), contiguous and
// must not overlap grad_output.
void check_gate_up_writable(const char* op, const at::Tensor& gate_up,
                            const at::Tensor& grad_output);

// gated_mlp(input [*, in], gate_weight [n, in], up_weight [n, in], down_weight [out, n],
// gate_bias [n]?, up_bias [n]? (both or neither), down_bias [out]?): one dtype, one device.
void check_gated_mlp_args(const at::Tensor& input, const at::Tensor& gate_weight,
                          const at::Tensor& up_weight, const at::Tensor& down_weight,
                          const std::optional<at::Tensor>& gate_bias,
                          const std::optional<at::Tensor>& up_bias,
                          const std::optional<at::Tensor>& down_bias);

// _gate_up_linear(input [*, in], gate_weight [n, in], up_weight [n, in], gate_bias [n]?,
// up_bias [n]? (both or neither)): one dtype, one device.
void check_gate_up_linear_args(const at::Tensor& input, const at::Tensor& gate_weight,
                               const at::Tensor& up_weight,
                               const std::optional<at::Tensor>& gate_bias,
                               const std::optional<at::Tensor>& up_bias);

// _gate_up_dgrad(grad_gate_up [*, 2n], gate_weight [n, in], up_weight [n, in]): one dtype, one
// device.
void check_gate_up_dgrad_args(const at::Tensor& grad_gate_up, const at::Tensor& gate_weight,
                              const at::Tensor& up_weight);

// _pack_gate_up(gate [n, in], up [n, in], dtype): floating, one shape, dtype and device; a
// floating target dtype.
void check_pack_gate_up_args(const at::Tensor& gate, const at::Tensor& up, at::ScalarType dtype);

// activation_grad(grad_output [*, features], preact [*, features]): same shape, dtype, device
void check_activation_grad_args(const at::Tensor& grad_output, const at::Tensor& preact);

// linear_dgrad(grad_output [*, out], weight [out, in])
void check_linear_dgrad_args(const at::Tensor& grad_output, const at::Tensor& weight);

// linear_wgrad(grad_output [*, out], input [*, in]) with the same leading dimensions
void check_linear_wgrad_args(const at::Tensor& grad_output, const at::Tensor& input);

// linear_wgrad_accumulate_(grad_weight [out, in], grad_output, input); grad_weight has the
// dtype of the inputs or float32 (an fp32 main gradient for 16-bit training), is writable
// (check_writable) and shares no memory with grad_output or input
void check_linear_wgrad_accumulate_args(const at::Tensor& grad_weight,
                                        const at::Tensor& grad_output, const at::Tensor& input);

// bias_grad(grad_output [*, out])
void check_bias_grad_args(const at::Tensor& grad_output);

// mm(a [n, m], b [m, p]); `op` is "mm" or "mm.out"
void check_mm_args(const char* op, const at::Tensor& a, const at::Tensor& b);

// mm.out: `out` must have the dtype and device of the inputs (it is resized like torch.mm's),
// must not be a leaf that requires grad and, when it already has the result's shape [n, p],
// must not have elements sharing memory
void check_mm_out_arg(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out);

// add2(a, b): same shape, dtype and device
void check_add2_args(const at::Tensor& a, const at::Tensor& b);

// rotary_embedding / rotary_embedding_backward (`op`)(q [B, Hq, S, D], k [B, Hk, S, D],
// cos [B or 1, S, D], sin like cos), the first two named `q_name` / `k_name` ("q", "k" or
// "grad_q", "grad_k"): one floating dtype, one device, D even.
void check_rotary_args(const char* op, const char* q_name, const char* k_name, const at::Tensor& q,
                       const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin);

// scale_(x, factor): x a writable, contiguous floating tensor (written in place); factor a 0-dim
// tensor in x's statistics dtype (float32; float64 for float64 x) on x's device, not inside x.
void check_scale_args(const at::Tensor& x, const at::Tensor& factor);

// cross_entropy_rows_(logits [rows, vocab], target [rows], row_scale [rows]?, ...): logits a
// contiguous floating tensor with vocab >= 1, writable (check_writable) when write_grad
// writes the gradient over it; target int64 on logits' device; row_scale in the statistics
// dtype (float32; float64 for float64 logits) on logits' device; label_smoothing finite in
// [0, 1]; logits and row_scale must not overlap.
void check_cross_entropy_rows_args(const at::Tensor& logits, const at::Tensor& target,
                                   const std::optional<at::Tensor>& row_scale,
                                   double label_smoothing, bool write_grad);

// rms_norm(input, weight, eps) / add_rms_norm(x, residual, weight, eps): the activations
// [*, features] (named `input_arg`: "input" or "x", the schema's name), residual (add_rms_norm:
// their shape, dtype and device), weight [features] of their dtype, or float32 for 16-bit
// activations; eps finite and >= 0. `residual` may be nullptr (rms_norm).
void check_rms_norm_args(const char* op, const char* input_arg, const at::Tensor& input,
                         const at::Tensor* residual, const at::Tensor& weight, double eps);

// rms_norm_backward(grad_output, grad_h?, h, weight, rstd): grad_output (and grad_h) with h's
// shape, dtype and device; weight as for rms_norm; rstd [*] (h's leading dims) in the statistics
// dtype (float32, float64 for float64 h).
void check_rms_norm_backward_args(const at::Tensor& grad_output,
                                  const std::optional<at::Tensor>& grad_h, const at::Tensor& h,
                                  const at::Tensor& weight, const at::Tensor& rstd);

// _set_main_grad(weight, buffer) with a buffer (not None): buffer of the weight's shape, on its
// device, contiguous, with the weight's dtype or float32 beside a 16-bit weight -- the buffers
// the weight-gradient GEMMs add into (csrc/autograd/main_grad_registry.h).
void check_main_grad_args(const at::Tensor& weight, const at::Tensor& buffer);

// The dtype of rms_norm's rstd (its float statistics) for input dtype `dtype`.
c10::ScalarType rms_norm_stat_dtype(c10::ScalarType dtype);

}  // namespace cutlass_nn
