// C++ API of cutlass_nn for LibTorch programs: the cutlass_nn operators, called through the
// PyTorch dispatcher (so the CPU or CUDA implementation is picked from the inputs' device, and
// the calls are the same ones Python's torch.ops.cutlass_nn.* makes).
//
// Header-only: it needs libcutlass_nn_ops.so (csrc/CMakeLists.txt) to be loaded, which registers
// the operators. Link the CMake target cutlass_nn::ops (it keeps the library on the link line with
// -Wl,--no-as-needed), or dlopen it / torch::ops.load_library it before the first call; otherwise
// the first call throws c10::Error "Could not find schema for cutlass_nn::...".
//
//   #include <cutlass_nn/ops.h>
//   at::Tensor y = cutlass_nn::linear(x, w, b);   // x [*, in], w [out, in], b [out] or nullopt
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <tuple>

namespace cutlass_nn {

namespace detail {
// The typed handle of operator cutlass_nn::<name>, looked up once per call site.
template <class Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload).typed<Signature>();
}
}  // namespace detail

// Every call below goes through the whole dispatcher: autocast (torch::autocast / AMP), autograd
// (the operators' backward is registered in C++, so loss.backward() works from LibTorch too) and
// the CPU or CUDA kernel.

// y = input @ weight.T + bias; input [*, in], weight [out, in], bias [out] -> y [*, out]
// (torch::nn::functional::linear / torch::linear).
inline at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias = std::nullopt) {
  static const auto op = detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                    const std::optional<at::Tensor>&)>(
      "cutlass_nn::linear");
  return op.call(input, weight, bias);
}

// y = act(input @ weight.T + bias) with the activation fused into the GEMM epilogue where the
// GPU allows; activation: "none", "relu", "gelu", "gelu_tanh".
inline at::Tensor linear_act(const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, c10::string_view activation) {
  static const auto op =
      detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&, c10::string_view)>(
          "cutlass_nn::linear_act");
  return op.call(input, weight, bias, activation);
}

// (act(z), z) with the pre-activation z = input @ weight.T + bias.
inline std::tuple<at::Tensor, at::Tensor> linear_act_aux(const at::Tensor& input,
                                                         const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias,
                                                         c10::string_view activation) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view)>(
      "cutlass_nn::linear_act_aux");
  return op.call(input, weight, bias, activation);
}

// grad_input = grad_output @ weight; [*, out] x [out, in] -> [*, in].
inline at::Tensor linear_dgrad(const at::Tensor& grad_output, const at::Tensor& weight) {
  static const auto op = detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>(
      "cutlass_nn::linear_dgrad");
  return op.call(grad_output, weight);
}

// grad_weight = grad_output^T @ input over all leading dims; -> [out, in].
inline at::Tensor linear_wgrad(const at::Tensor& grad_output, const at::Tensor& input) {
  static const auto op = detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>(
      "cutlass_nn::linear_wgrad");
  return op.call(grad_output, input);
}

// grad_weight += grad_output^T @ input, in place (grad_weight may be float32 for 16-bit inputs).
inline void linear_wgrad_accumulate_(const at::Tensor& grad_weight, const at::Tensor& grad_output,
                                     const at::Tensor& input) {
  static const auto op =
      detail::find_op<void(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "cutlass_nn::linear_wgrad_accumulate_");
  op.call(grad_weight, grad_output, input);
}

// grad_bias = grad_output summed over all leading dims; [*, out] -> [out].
inline at::Tensor bias_grad(const at::Tensor& grad_output) {
  static const auto op =
      detail::find_op<at::Tensor(const at::Tensor&)>("cutlass_nn::bias_grad");
  return op.call(grad_output);
}

// (grad_output * act'(preact), bias gradient or an empty [0] tensor).
inline std::tuple<at::Tensor, at::Tensor> activation_grad(const at::Tensor& grad_output,
                                                          const at::Tensor& preact,
                                                          c10::string_view activation,
                                                          bool bias_grad) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, c10::string_view, bool)>(
      "cutlass_nn::activation_grad");
  return op.call(grad_output, preact, activation, bias_grad);
}

// a @ b for 2-D a [n, m], b [m, p] (torch::mm).
inline at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  static const auto op =
      detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("cutlass_nn::mm");
  return op.call(a, b);
}

// a + b for tensors of the same shape, dtype and device.
inline at::Tensor add2(const at::Tensor& a, const at::Tensor& b) {
  static const auto op =
      detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("cutlass_nn::add2");
  return op.call(a, b);
}

// RMSNorm over the last dim: (out, rstd), out = input * rstd * weight, rstd = 1 / sqrt(mean(
// input^2) + eps) in float32 (float64 for float64 input); weight [features] of input's dtype, or
// float32 beside 16-bit input.
inline std::tuple<at::Tensor, at::Tensor> rms_norm(const at::Tensor& input,
                                                   const at::Tensor& weight, double eps) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, double)>("cutlass_nn::rms_norm");
  return op.call(input, weight, eps);
}

// RMSNorm of h = input + residual: (out, h, rstd); h is the new residual stream.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input,
                                                                   const at::Tensor& residual,
                                                                   const at::Tensor& weight,
                                                                   double eps) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>(
      "cutlass_nn::add_rms_norm");
  return op.call(input, residual, weight, eps);
}

// The backward of rms_norm / add_rms_norm: (grad_h, grad_weight or an empty [0] tensor).
inline std::tuple<at::Tensor, at::Tensor> rms_norm_backward(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_h, const at::Tensor& h,
    const at::Tensor& weight, const at::Tensor& rstd, bool weight_grad) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&,
      const at::Tensor&, bool)>("cutlass_nn::rms_norm_backward");
  return op.call(grad_output, grad_h, h, weight, rstd, weight_grad);
}

// act(gate) * up for gate_up = [gate | up] [*, 2n] -> [*, n]; activation "silu", "gelu" or
// "gelu_tanh". Differentiable.
inline at::Tensor gated_act(const at::Tensor& gate_up, c10::string_view activation) {
  static const auto op =
      detail::find_op<at::Tensor(const at::Tensor&, c10::string_view)>("cutlass_nn::gated_act");
  return op.call(gate_up, activation);
}

// The backward of gated_act: (grad_gate_up, out) with out the recomputed forward.
inline std::tuple<at::Tensor, at::Tensor> gated_act_backward(const at::Tensor& grad_output,
                                                             const at::Tensor& gate_up,
                                                             c10::string_view activation) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, c10::string_view)>("cutlass_nn::gated_act_backward");
  return op.call(grad_output, gate_up, activation);
}

// gated_act_backward writing grad_gate_up over gate_up (contiguous); returns out.
inline at::Tensor gated_act_backward_(const at::Tensor& grad_output, const at::Tensor& gate_up,
                                      c10::string_view activation) {
  static const auto op = detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                    c10::string_view)>(
      "cutlass_nn::gated_act_backward_");
  return op.call(grad_output, gate_up, activation);
}

// x *= factor in place (x contiguous; factor a 0-dim float32 tensor, float64 for float64 x); on
// CUDA, factor == 1 costs a launch and no pass over x. See csrc/ops_registry.cpp.
inline void scale_(const at::Tensor& x, const at::Tensor& factor) {
  static const auto op =
      detail::find_op<void(const at::Tensor&, const at::Tensor&)>("cutlass_nn::scale_");
  op.call(x, factor);
}

// Rotary position embedding of q [B, Hq, S, D] and k [B, Hk, S, D] by cos, sin [B or 1, S, D]:
// (q * cos + rotate_half(q) * sin, the same of k). Differentiable (also in cos and sin). See
// csrc/ops_registry.cpp.
inline std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& q,
                                                           const at::Tensor& k,
                                                           const at::Tensor& cos,
                                                           const at::Tensor& sin) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
      "cutlass_nn::rotary_embedding");
  return op.call(q, k, cos, sin);
}

// Its backward: the transposed rotation of the output gradients (no gradients of cos, sin).
inline std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward(const at::Tensor& grad_q,
                                                                    const at::Tensor& grad_k,
                                                                    const at::Tensor& cos,
                                                                    const at::Tensor& sin) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
      "cutlass_nn::rotary_embedding_backward");
  return op.call(grad_q, grad_k, cos, sin);
}

// Cross-entropy rows of logits [rows, vocab] (contiguous) against target [rows] (int64):
// (loss, lse) in float32 (float64 for float64 logits); with write_grad, logits is overwritten
// with d loss / d logits times row_scale (1 when absent). See csrc/ops_registry.cpp.
inline std::tuple<at::Tensor, at::Tensor> cross_entropy_rows_(
    const at::Tensor& logits, const at::Tensor& target,
    const std::optional<at::Tensor>& row_scale = std::nullopt, int64_t ignore_index = -100,
    double label_smoothing = 0.0, bool write_grad = true) {
  static const auto op = detail::find_op<std::tuple<at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t, double,
      bool)>("cutlass_nn::cross_entropy_rows_");
  return op.call(logits, target, row_scale, ignore_index, label_smoothing, write_grad);
}

// down(act(gate(input)) * up(input)): gate_weight, up_weight [n, in], down_weight [out, n];
// biases optional (gate_bias and up_bias both or neither). Differentiable.
inline at::Tensor gated_mlp(const at::Tensor& input, const at::Tensor& gate_weight,
                            const at::Tensor& up_weight, const at::Tensor& down_weight,
                            const std::optional<at::Tensor>& gate_bias = std::nullopt,
                            const std::optional<at::Tensor>& up_bias = std::nullopt,
                            const std::optional<at::Tensor>& down_bias = std::nullopt,
                            c10::string_view activation = "silu") {
  static const auto op = detail::find_op<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&, c10::string_view)>("cutlass_nn::gated_mlp");
  return op.call(input, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias,
                 activation);
}

// What the loaded library was built with, as "key=value" lines (flavor=cpu|cuda, cuda_archs=,
// cutlass_version=, torch_version=).
inline std::string build_info() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlass_nn::build_info", "")
                             .typed<std::string()>();
  return op.call();
}

// Fused weight-gradient accumulation (process-wide, off by default): when on, the backward of
// linear / linear_act / gated_mlp adds each weight gradient into an existing weight.grad in the
// GEMM itself (see cutlass_nn/grad_accumulation.py for when it applies). Returns the previous
// setting.
inline bool set_fused_wgrad_accumulation(bool enable) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlass_nn::_fused_wgrad_accumulation", "")
                             .typed<bool(int64_t)>();
  return op.call(enable ? 1 : 0);
}

// Main-gradient buffer of a weight (what cutlass_nn.attach_main_grads registers): the backward of
// linear / linear_act / gated_mlp adds the weight's gradient into `buffer` (float32, or the
// weight's dtype) and hands autograd none; an undefined buffer removes the registration. Only the
// fused GEMMs write it: gradients that take the usual path still go to weight.grad (the Python
// API adds a hook that folds them in).
inline void set_main_grad(const at::Tensor& weight, const at::Tensor& buffer) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlass_nn::_set_main_grad", "")
                             .typed<void(const at::Tensor&, const std::optional<at::Tensor>&)>();
  op.call(weight, buffer.defined() ? std::optional<at::Tensor>(buffer) : std::nullopt);
}

// True when the operators are registered, i.e. libcutlass_nn_ops.so is loaded.
inline bool is_loaded() {
  return c10::Dispatcher::singleton().findSchema({"cutlass_nn::linear", ""}).has_value();
}

}  // namespace cutlass_nn
