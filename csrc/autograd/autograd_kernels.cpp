// Autograd of the cutlass_nn operators, in C++ (the Autograd dispatch key, for every backend).
//
// One torch::autograd::Function per differentiable operator pairs its forward kernel with its
// backward kernels; every backward formula calls other cutlass_nn operators through the
// dispatcher, so gradients run on cutlass_nn's kernels, LibTorch programs get backward too, and
// double backward composes: with create_graph the backward's own calls record their nodes, and
// without it (grad mode off inside backward) they run below autograd and record nothing.
//
//   linear(X, W, b)           dX = linear_dgrad(dY, W), dW = linear_wgrad(dY, X), db = bias_grad(dY)
//                             (with fused weight-gradient accumulation on and W.grad present:
//                             linear_wgrad_accumulate_(W.grad, dY, X) and no dW; see
//                             accumulate_wgrad_in_place)
//   linear_dgrad(g, W)        dg = linear(G, W), dW = linear_wgrad(g, G)
//   linear_wgrad(g, X)        dg = linear(X, G), dX = linear_dgrad(g, G)
//   bias_grad(g)              dg = G broadcast over g's leading dims (a view)
//   mm(a, b)                  da = mm(G, b^T), db = mm(a^T, G)
//   add2(a, b)                da = db = G
//   linear_act_aux(X, W, b)   -> (Y, Z): dZ, db = activation_grad(dY, Z, act, true) (plus the
//                             incoming gradient of Z, if any), dX, dW from dZ as for linear
//   linear_act(X, W, b)       as linear_act_aux; when it records a node, the forward runs
//                             linear_act_aux below autograd and keeps Z for the backward
//   activation_grad(g, Z)     with G the total gradient of its output: dg = activation_grad(G,
//                             Z, act, false), dZ = G * g * act''(Z) (torch elementwise ops; only
//                             second-order gradients reach it)
//   rms_norm(X, w)            -> (Y, rstd): dX, dw = rms_norm_backward(dY, None, X, w, rstd)
//   add_rms_norm(X, R, w)     -> (Y, H, rstd): dH, dw = rms_norm_backward(dY, dH_in, H, w,
//                             rstd) with dH_in the incoming gradient of H; dX = dR = dH
//                             (rstd is not differentiable; under create_graph the backward is
//                             the differentiable ATen formulation of csrc/rms_norm_aten.h,
//                             with rstd recomputed from H, so second-order gradients are exact)
//   gated_act(GU)             dGU = gated_act_backward(dY, GU)[0] (create_graph: the ATen form
//                             of csrc/gated_act_aten.h)
//   rotary_embedding(Q, K, cos, sin)
//                             dQ, dK = rotary_embedding_backward(dQo, dKo, cos, sin) (a missing
//                             output gradient becomes a zero-head operand); dcos, dsin (only
//                             when they require grad; Q, K are saved for them then) and the
//                             create_graph backward: the ATen forms of csrc/rotary_aten.h
//   gated_mlp(X, Wg, Wu, Wd, bg, bu, bd)
//                             with GU = linear(X, [Wg; Wu], [bg; bu]) kept from the forward (the
//                             only activation kept besides X): dH = linear_dgrad(dY, Wd);
//                             (dGU, H) = gated_act_backward(dH, GU) recomputes H; dWd =
//                             linear_wgrad(dY, H), dbd = bias_grad(dY); dX = linear_dgrad(dGU,
//                             [Wg; Wu]); [dWg; dWu] = linear_wgrad(dGU, X) and [dbg; dbu] =
//                             bias_grad(dGU), split by rows. Under create_graph GU is recomputed
//                             with the differentiable linear and the ATen gated backward.
//                             (with fused weight-gradient accumulation on and the .grad
//                             tensors present: dWd, and dWg / dWu together, are added into
//                             them; see accumulate_gate_up_wgrad_in_place)
//
// The operators without an autograd formula (linear_wgrad_accumulate_, mm.out,
// rms_norm_backward, rotary_embedding_backward) keep torch's default for custom operators.
//
// A call that records no node (grad mode off, or no input requires grad) is redispatched
// straight to the kernel below autograd, so inference and the backward's own calls pay for no
// Function object.
#include <ATen/ATen.h>
#include <ATen/SavedTensorHooks.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <atomic>
#include <initializer_list>
#include <string>
#include <tuple>

#include "../gated_act_aten.h"
#include "../gated_mlp.h"
#include "../include/cutlass_nn/ops.h"
#include "../op_checks.h"
#include "../rms_norm_aten.h"
#include "../rotary_aten.h"
#include "main_grad_registry.h"
#include "wgrad_accumulation.h"

namespace cutlass_nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool needs_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

bool needs_grad(const std::optional<at::Tensor>& t) { return t.has_value() && needs_grad(*t); }

// Whether an optional tensor argument is an autograd input (an edge): present and defined.
bool has_tensor(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// Whether a call with these inputs records an autograd node.
template <class... Ts>
bool records_node(const Ts&... inputs) {
  return at::GradMode::is_enabled() && (needs_grad(inputs) || ...);
}

at::Tensor undefined() { return at::Tensor(); }

std::atomic<bool> g_fused_wgrad_accumulation{false};

// Whether a buffer can take dW = grad_z^T X of `weight` by an in-place GEMM, and which one:
// the weight's registered main-gradient buffer (cutlass_nn.attach_main_grads), else, with fused
// weight-gradient accumulation on, its existing .grad (a later micro-batch: the first one hands
// autograd a new tensor, as usual). Only when no graph of the gradient is being built
// (create_graph), the backward is a plain backward() (not autograd.grad, no `inputs=`), the
// weight is a plain leaf, the buffer has the weight's shape and device, is
// contiguous, with the weight's dtype (or float32 for a 16-bit weight's main gradient), and
// nothing would see the gradient before it is accumulated (no tensor hooks, no retain_grad on
// the weight). Autograd then receives no gradient for the weight: its AccumulateGrad node still
// runs and fires its post hooks (DDP's reducer, register_post_accumulate_grad_hook), which find
// the accumulated .grad. Returns the buffer when all of this holds, else an undefined tensor.
at::Tensor grad_to_accumulate_into(const at::Tensor& weight) {
  const bool fused_switch = g_fused_wgrad_accumulation.load(std::memory_order_relaxed);
  const bool main_grads = any_main_grads();
  if ((!fused_switch && !main_grads) || at::GradMode::is_enabled() || !weight.is_leaf() ||
      !weight.requires_grad() || at::isTensorSubclassLike(weight)) {
    return at::Tensor();
  }
  // torch.autograd.grad / backward(inputs=...): the gradient is returned to the caller (or goes
  // only where `inputs` says), never into .grad or a main-gradient buffer behind its back.
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  if (exec_info != nullptr && !exec_info->empty()) return at::Tensor();
  at::Tensor buffer = main_grads ? main_grad_of(weight) : at::Tensor();
  const bool is_main = buffer.defined();
  if (!is_main) {
    if (!fused_switch) return at::Tensor();
    buffer = weight.grad();
  }
  const auto w_dtype = weight.scalar_type();
  const bool dtype_ok =
      buffer.defined() &&
      (buffer.scalar_type() == w_dtype ||
       (is_main && buffer.scalar_type() == c10::kFloat &&
        (w_dtype == c10::kHalf || w_dtype == c10::kBFloat16)));
  if (!dtype_ok || at::isTensorSubclassLike(buffer) || buffer.sizes() != weight.sizes() ||
      buffer.device() != weight.device() || !buffer.is_contiguous() || buffer.requires_grad()) {
    return at::Tensor();
  }
  if (!torch::autograd::impl::hooks(weight).empty()) return at::Tensor();
  const auto acc = torch::autograd::impl::try_get_grad_accumulator(weight);
  if (acc == nullptr || !acc->pre_hooks().empty() || !acc->tensor_pre_hooks().empty() ||
      !acc->retains_grad_hooks().empty()) {
    return at::Tensor();
  }
  return buffer;
}

// Whether `buffer` shares a storage with an operand of its weight-gradient GEMM (a .grad or main
// gradient set to a view of the layer's input, say). linear_wgrad_accumulate_ refuses operands
// that overlap what it writes; here the usual path (a new gradient that autograd then adds)
// gives the right sum instead of an error in the middle of backward().
// `later_reads`: tensors the rest of the backward reads after this accumulation (the gated MLP's
// block input, read by the gate+up weight gradient after the down projection's): a buffer that
// shares their storage would change them first.
bool shares_memory_with(const at::Tensor& buffer, const at::Tensor& a, const at::Tensor& b,
                        std::initializer_list<at::Tensor> later_reads = {}) {
  if (buffer.is_alias_of(a) || buffer.is_alias_of(b)) return true;
  for (const at::Tensor& t : later_reads) {
    if (t.defined() && buffer.is_alias_of(t)) return true;
  }
  return false;
}

bool accumulate_wgrad_in_place(const at::Tensor& grad_z, const at::Tensor& input,
                               const at::Tensor& weight,
                               std::initializer_list<at::Tensor> later_reads = {}) {
  const at::Tensor grad = grad_to_accumulate_into(weight);
  if (!grad.defined() || shares_memory_with(grad, grad_z, input, later_reads)) return false;
  cutlass_nn::linear_wgrad_accumulate_(grad, grad_z, input);
  return true;
}

// The gate and up weights of gated_mlp share one weight-gradient GEMM, dW_gu = dGU^T X with
// dGU = [dG, dU] of shape [*, 2n]. With both .grad tensors open to in-place accumulation: one
// accumulating GEMM when up's gradient directly follows gate's in one storage (what autograd
// leaves after a first micro-batch, whose gradients are the two halves of one [2n, in] result),
// else one per weight on its half of dGU's columns.
bool accumulate_gate_up_wgrad_in_place(const at::Tensor& grad_gate_up, const at::Tensor& input,
                                       const at::Tensor& gate_weight,
                                       const at::Tensor& up_weight) {
  const at::Tensor gate_grad = grad_to_accumulate_into(gate_weight);
  if (!gate_grad.defined()) return false;
  const at::Tensor up_grad = grad_to_accumulate_into(up_weight);
  if (!up_grad.defined() || shares_memory_with(gate_grad, grad_gate_up, input) ||
      shares_memory_with(up_grad, grad_gate_up, input)) {
    return false;
  }
  const int64_t n = gate_grad.size(0);
  const bool adjacent =
      gate_grad.numel() > 0 && up_grad.sizes() == gate_grad.sizes() &&
      up_grad.scalar_type() == gate_grad.scalar_type() &&
      up_grad.storage().is_alias_of(gate_grad.storage()) &&
      up_grad.storage_offset() == gate_grad.storage_offset() + gate_grad.numel();
  if (adjacent) {
    const at::Tensor both =
        gate_grad.as_strided({2 * n, gate_grad.size(1)}, {gate_grad.size(1), 1});
    cutlass_nn::linear_wgrad_accumulate_(both, grad_gate_up, input);
  } else {
    cutlass_nn::linear_wgrad_accumulate_(gate_grad, grad_gate_up.narrow(-1, 0, n), input);
    cutlass_nn::linear_wgrad_accumulate_(up_grad, grad_gate_up.narrow(-1, n, n), input);
  }
  return true;
}

// linear's gradients from the output gradient dZ of z = X W^T + b.
void linear_input_grads(AutogradContext* ctx, const at::Tensor& grad_z, const at::Tensor& input,
                        const at::Tensor& weight, bool has_bias, variable_list& grads) {
  if (ctx->needs_input_grad(0)) grads[0] = cutlass_nn::linear_dgrad(grad_z, weight);
  if (ctx->needs_input_grad(1) && !accumulate_wgrad_in_place(grad_z, input, weight)) {
    grads[1] = cutlass_nn::linear_wgrad(grad_z, input);
  }
  if (has_bias && !grads[2].defined() && ctx->needs_input_grad(2)) {
    grads[2] = cutlass_nn::bias_grad(grad_z);
  }
}

class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["has_bias"] = has_tensor(bias);
    at::AutoDispatchBelowADInplaceOrView below;
    return {cutlass_nn::linear(input, weight, bias)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    variable_list grads(3);
    linear_input_grads(ctx, grads_out[0], saved[0], saved[1],
                       ctx->saved_data["has_bias"].toBool(), grads);
    return grads;
  }
};

class LinearDgradFunction : public torch::autograd::Function<LinearDgradFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_output,
                               const at::Tensor& weight) {
    ctx->save_for_backward({grad_output, weight});
    at::AutoDispatchBelowADInplaceOrView below;
    return {cutlass_nn::linear_dgrad(grad_output, weight)};
  }

  // out = g @ W  =>  dg = G @ W^T = linear(G, W);  dW = g^T @ G = linear_wgrad(g, G)
  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& grad = grads_out[0];
    return {ctx->needs_input_grad(0) ? cutlass_nn::linear(grad, saved[1]) : undefined(),
            ctx->needs_input_grad(1) ? cutlass_nn::linear_wgrad(saved[0], grad) : undefined()};
  }
};

class LinearWgradFunction : public torch::autograd::Function<LinearWgradFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_output,
                               const at::Tensor& input) {
    ctx->save_for_backward({grad_output, input});
    at::AutoDispatchBelowADInplaceOrView below;
    return {cutlass_nn::linear_wgrad(grad_output, input)};
  }

  // out = g^T @ X  =>  dg = X @ G^T = linear(X, G);  dX = g @ G = linear_dgrad(g, G)
  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& grad = grads_out[0];
    return {ctx->needs_input_grad(0) ? cutlass_nn::linear(saved[1], grad) : undefined(),
            ctx->needs_input_grad(1) ? cutlass_nn::linear_dgrad(saved[0], grad) : undefined()};
  }
};

class BiasGradFunction : public torch::autograd::Function<BiasGradFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_output) {
    // sym_sizes: under torch.compile(dynamic=True) the sizes are symbolic.
    ctx->saved_data["shape"] = c10::IValue(grad_output.sym_sizes());
    at::AutoDispatchBelowADInplaceOrView below;
    return {cutlass_nn::bias_grad(grad_output)};
  }

  // out[j] = sum_i g[i, j]  =>  dg[i, j] = G[j]: a broadcast view, no arithmetic
  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto shape = ctx->saved_data["shape"].toSymIntVector();
    return {grads_out[0].expand_symint(shape)};
  }
};

class MmFunction : public torch::autograd::Function<MmFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    at::AutoDispatchBelowADInplaceOrView below;
    return {cutlass_nn::mm(a, b)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& grad = grads_out[0];
    return {ctx->needs_input_grad(0) ? cutlass_nn::mm(grad, saved[1].t()) : undefined(),
            ctx->needs_input_grad(1) ? cutlass_nn::mm(saved[0].t(), grad) : undefined()};
  }
};

class Add2Function : public torch::autograd::Function<Add2Function> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView below;
    return {cutlass_nn::add2(a, b)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    return {grads_out[0], grads_out[0]};
  }
};

// Gradients of (act(z), z), z = input @ weight.T + bias, for incoming gradients grad_out (of
// act(z)) and grad_preact (of z), either of which may be undefined; grads has 4 slots.
variable_list act_linear_backward(AutogradContext* ctx, const at::Tensor& input,
                                  const at::Tensor& weight, const at::Tensor& preact,
                                  const at::Tensor& grad_out, const at::Tensor& grad_preact) {
  variable_list grads(4);
  if (!grad_out.defined() && !grad_preact.defined()) return grads;
  const bool has_bias = ctx->saved_data["has_bias"].toBool();
  const bool need_bias = has_bias && ctx->needs_input_grad(2);
  at::Tensor grad_z;
  if (!grad_out.defined()) {
    grad_z = grad_preact;
  } else {
    // The bias gradient comes out of the activation-gradient pass when nothing else adds to dZ.
    const bool fuse_bias = need_bias && !grad_preact.defined();
    auto [dz, db] = cutlass_nn::activation_grad(grad_out, preact,
                                                ctx->saved_data["activation"].toStringRef(),
                                                fuse_bias);
    grad_z = grad_preact.defined() ? cutlass_nn::add2(dz, grad_preact) : dz;
    if (fuse_bias) grads[2] = db;
  }
  linear_input_grads(ctx, grad_z, input, weight, has_bias, grads);
  return grads;
}

class LinearActAuxFunction : public torch::autograd::Function<LinearActAuxFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               c10::string_view activation) {
    ctx->saved_data["has_bias"] = has_tensor(bias);
    ctx->saved_data["activation"] = std::string(activation);
    // The pre-activation output is usually unused (its gradient would be zeros): undefined
    // gradients reach the backward instead of materialized zeros.
    ctx->set_materialize_grads(false);
    at::Tensor out, preact;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, preact) = cutlass_nn::linear_act_aux(input, weight, bias, activation);
    }
    ctx->save_for_backward({input, weight, preact});  // preact: saved as an output
    return {out, preact};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    return act_linear_backward(ctx, saved[0], saved[1], saved[2], grads_out[0], grads_out[1]);
  }
};

class LinearActFunction : public torch::autograd::Function<LinearActFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               c10::string_view activation) {
    ctx->saved_data["has_bias"] = has_tensor(bias);
    ctx->saved_data["activation"] = std::string(activation);
    // One fused GEMM that also stores the pre-activation z, which the backward needs.
    at::Tensor out, preact;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, preact) = cutlass_nn::linear_act_aux(input, weight, bias, activation);
    }
    ctx->save_for_backward({input, weight, has_tensor(bias) ? *bias : at::Tensor(), preact});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor preact = saved[3];
    const std::string& activation = ctx->saved_data["activation"].toStringRef();
    if (at::GradMode::is_enabled() && activation != "none" && activation != "relu") {
      // create_graph: the saved z has no history; recompute it with the (differentiable)
      // linear operator so that second-order gradients flow through act'(z). (For "none" and
      // "relu" act'' is 0: the saved z serves, and a recomputed one could flip relu's mask.)
      preact = cutlass_nn::linear(saved[0], saved[1],
                                  saved[2].defined() ? std::optional<at::Tensor>(saved[2])
                                                     : std::nullopt);
    }
    return act_linear_backward(ctx, saved[0], saved[1], preact, grads_out[0], at::Tensor());
  }
};

// act''(z) in the compute dtype (float32, float64 for float64 z), with torch ops.
at::Tensor activation_second_derivative(const std::string& activation, const at::Tensor& preact) {
  const at::Tensor z =
      preact.to(preact.scalar_type() == at::kDouble ? at::kDouble : at::kFloat);
  if (activation == "gelu") {
    // act = z Phi(z): act'' = phi(z) (2 - z^2), phi(z) = exp(-z^2 / 2) / sqrt(2 pi)
    const at::Tensor phi = at::exp(-0.5 * z * z) * 0.3989422804014327;
    return phi * (2.0 - z * z);
  }
  if (activation == "gelu_tanh") {
    // act = z (1 + t) / 2, t = tanh(u), u = c (z + k z^3):
    // act'' = (1 - t^2) (u' - z t u'^2 + z u'' / 2), u' = c (1 + 3 k z^2), u'' = 6 c k z
    constexpr double c = 0.7978845608028654, k = 0.044715;
    const at::Tensor t = at::tanh(c * (z + k * z * z * z));
    const at::Tensor du = c * (1.0 + 3.0 * k * z * z);
    const at::Tensor ddu = 6.0 * c * k * z;
    return (1.0 - t * t) * (du - z * t * du * du + 0.5 * z * ddu);
  }
  return at::zeros_like(z);  // "none", "relu" (0 almost everywhere)
}

class ActivationGradFunction : public torch::autograd::Function<ActivationGradFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_output,
                               const at::Tensor& preact, c10::string_view activation,
                               bool bias_grad) {
    ctx->save_for_backward({grad_output, preact});
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["bias_grad"] = bias_grad;
    ctx->set_materialize_grads(false);
    at::AutoDispatchBelowADInplaceOrView below;
    auto [grad_preact, grad_bias] =
        cutlass_nn::activation_grad(grad_output, preact, activation, bias_grad);
    return {grad_preact, grad_bias};
  }

  // out = g * act'(z), bias = sum over the leading dims of out. With G the total gradient of
  // out (its own plus the bias's, broadcast): dg = G * act'(z), dz = G * g * act''(z).
  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& grad_output = saved[0];
    const at::Tensor& preact = saved[1];
    const std::string activation = ctx->saved_data["activation"].toStringRef();
    at::Tensor big_g = grads_out[0];
    if (ctx->saved_data["bias_grad"].toBool() && grads_out[1].defined()) {
      const at::Tensor expanded = grads_out[1].expand_symint(preact.sym_sizes());
      big_g = big_g.defined() ? cutlass_nn::add2(big_g.contiguous(), expanded.contiguous())
                              : expanded;
    }
    variable_list grads(4);
    if (!big_g.defined()) return grads;
    if (ctx->needs_input_grad(0)) {
      grads[0] = std::get<0>(cutlass_nn::activation_grad(big_g, preact, activation, false));
    }
    if (ctx->needs_input_grad(1) && activation != "none" && activation != "relu") {
      const at::Tensor second = activation_second_derivative(activation, preact);
      grads[1] = (big_g.to(second.scalar_type()) * grad_output.to(second.scalar_type()) * second)
                     .to(preact.scalar_type());
    }
    return grads;
  }
};

// (grad_h, grad_weight) of an RMSNorm of h for the output gradient grad_out and the gradient
// grad_h_in reaching h directly (either may be undefined); grad slot weight_slot gets dw.
void rms_norm_grads(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& grad_h_in,
                    int weight_slot, at::Tensor& grad_h, at::Tensor& grad_weight) {
  if (!grad_out.defined()) {
    grad_h = grad_h_in;  // only the residual path carries a gradient
    return;
  }
  const auto saved = ctx->get_saved_variables();  // h, weight, rstd
  const bool need_weight = ctx->needs_input_grad(weight_slot);
  if (at::GradMode::is_enabled()) {
    std::tie(grad_h, grad_weight) =
        rms_norm_backward_aten(grad_out, grad_h_in, saved[0], saved[1], at::Tensor(),
                               ctx->saved_data["eps"].toDouble(), need_weight);
  } else {
    std::tie(grad_h, grad_weight) = cutlass_nn::rms_norm_backward(
        grad_out, grad_h_in.defined() ? std::optional<at::Tensor>(grad_h_in) : std::nullopt,
        saved[0], saved[1], saved[2], need_weight);
  }
  if (!need_weight) grad_weight = at::Tensor();
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& weight, double eps) {
    ctx->saved_data["eps"] = eps;
    ctx->set_materialize_grads(false);
    at::Tensor out, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, rstd) = cutlass_nn::rms_norm(input, weight, eps);
    }
    ctx->save_for_backward({input, weight, rstd});
    ctx->mark_non_differentiable({rstd});
    return {out, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    variable_list grads(3);
    rms_norm_grads(ctx, grads_out[0], at::Tensor(), 1, grads[0], grads[1]);
    return grads;
  }
};

class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& residual, const at::Tensor& weight, double eps) {
    ctx->saved_data["eps"] = eps;
    ctx->set_materialize_grads(false);
    at::Tensor out, h, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, h, rstd) = cutlass_nn::add_rms_norm(input, residual, weight, eps);
    }
    ctx->save_for_backward({h, weight, rstd});  // h: saved as an output
    ctx->mark_non_differentiable({rstd});
    return {out, h, rstd};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    variable_list grads(4);
    at::Tensor grad_h;
    rms_norm_grads(ctx, grads_out[0], grads_out[1], 2, grad_h, grads[2]);
    if (ctx->needs_input_grad(0)) grads[0] = grad_h;
    if (ctx->needs_input_grad(1)) grads[1] = grad_h;
    return grads;
  }
};

class GatedActFunction : public torch::autograd::Function<GatedActFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& gate_up,
                               c10::string_view activation) {
    ctx->saved_data["activation"] = std::string(activation);
    ctx->save_for_backward({gate_up});
    at::AutoDispatchBelowADInplaceOrView below;
    return {cutlass_nn::gated_act(gate_up, activation)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    const std::string& activation = ctx->saved_data["activation"].toStringRef();
    if (at::GradMode::is_enabled()) {
      return {std::get<0>(gated_act_backward_aten(
                  grads_out[0], saved[0], parse_gated_activation("gated_act", activation))),
              at::Tensor()};
    }
    return {std::get<0>(cutlass_nn::gated_act_backward(grads_out[0], saved[0], activation)),
            at::Tensor()};
  }
};

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin) {
    ctx->set_materialize_grads(false);
    // q and k are needed only for the gradients of cos and sin (usually constants)
    const bool table_grads = needs_grad(cos) || needs_grad(sin);
    ctx->save_for_backward({cos, sin, table_grads ? q : at::Tensor(), table_grads ? k : at::Tensor()});
    at::AutoDispatchBelowADInplaceOrView below;
    auto [q_out, k_out] = cutlass_nn::rotary_embedding(q, k, cos, sin);
    return {q_out, k_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& cos = saved[0];
    const at::Tensor& sin = saved[1];
    const at::Tensor& grad_q = grads_out[0];
    const at::Tensor& grad_k = grads_out[1];
    variable_list grads(4);
    if (!grad_q.defined() && !grad_k.defined()) return grads;
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      if (at::GradMode::is_enabled()) {  // create_graph: differentiable ATen form
        if (grad_q.defined()) grads[0] = rotary_aten(grad_q, cos, sin, true);
        if (grad_k.defined()) grads[1] = rotary_aten(grad_k, cos, sin, true);
      } else {
        // A missing output gradient (that output unused) is passed as an operand of no heads:
        // q and k share batch, sequence and head size, so the present gradient gives its shape.
        const at::Tensor& present = grad_q.defined() ? grad_q : grad_k;
        auto no_heads = [&]() {
          auto shape = present.sym_sizes().vec();
          shape[1] = 0;
          return at::empty_symint(shape, present.options());
        };
        auto [gq, gk] = cutlass_nn::rotary_embedding_backward(
            grad_q.defined() ? grad_q : no_heads(), grad_k.defined() ? grad_k : no_heads(), cos,
            sin);
        if (grad_q.defined()) grads[0] = gq;
        if (grad_k.defined()) grads[1] = gk;
      }
    }
    if (ctx->needs_input_grad(2) || ctx->needs_input_grad(3)) {
      auto [grad_cos, grad_sin] = rotary_table_grads_aten(grad_q, grad_k, saved[2], saved[3], cos);
      if (ctx->needs_input_grad(2)) grads[2] = grad_cos;
      if (ctx->needs_input_grad(3)) grads[3] = grad_sin;
    }
    return grads;
  }
};

class GatedMlpFunction : public torch::autograd::Function<GatedMlpFunction> {
 public:
  // Inputs 0..6: input, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               const at::Tensor& gate_weight, const at::Tensor& up_weight,
                               const at::Tensor& down_weight,
                               const std::optional<at::Tensor>& gate_bias,
                               const std::optional<at::Tensor>& up_bias,
                               const std::optional<at::Tensor>& down_bias,
                               c10::string_view activation) {
    ctx->saved_data["activation"] = std::string(activation);
    // Saved-tensor hooks (save_on_cpu, user pack hooks) may keep their own reference to the
    // saved gate+up output: the backward must then not write over it.
    ctx->saved_data["saved_tensor_hooks"] = at::SavedTensorDefaultHooks::get_hooks().has_value();
    at::Tensor out, gate_up;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, gate_up) = gated_mlp_forward(input, gate_weight, up_weight, down_weight,
                                                 gate_bias, up_bias, down_bias, activation);
    }
    const auto or_undefined = [](const std::optional<at::Tensor>& t) {
      return has_tensor(t) ? *t : at::Tensor();
    };
    // The weights, not their [gate; up] concatenation: that is rebuilt in the backward (a view,
    // or a short-lived copy) rather than kept alive between forward and backward.
    ctx->save_for_backward({input, gate_weight, up_weight, down_weight, or_undefined(gate_bias),
                            or_undefined(up_bias), or_undefined(down_bias), gate_up});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& input = saved[0];
    const at::Tensor& down_weight = saved[3];
    const bool has_gate_up_bias = saved[4].defined();
    const bool has_down_bias = saved[6].defined();
    const std::string& activation = ctx->saved_data["activation"].toStringRef();
    const at::Tensor& grad_out = grads_out[0];
    variable_list grads(8);
    // needs_input_grad counts only the tensors given (a None bias is no autograd input), while
    // grads is indexed by argument position: map one to the other.
    const auto need = [&](int position) {
      if (position < 4) return ctx->needs_input_grad(position);
      if (position < 6) return has_gate_up_bias && ctx->needs_input_grad(position);
      return has_down_bias && ctx->needs_input_grad(has_gate_up_bias ? 6 : 4);
    };
    const bool need_gate_up_side = need(0) || need(1) || need(2) || need(4) || need(5);
    if (!need_gate_up_side && !need(3) && !need(6)) return grads;

    // create_graph: rebuild everything the gradients depend on with differentiable operators
    // (the saved gate_up has no history), so that second-order gradients are exact.
    const bool create_graph = at::GradMode::is_enabled();
    // create_graph only: [gate; up] as a differentiable concatenation, built where needed so
    // that the copy is not held through the rest of the backward (without create_graph the
    // gate+up operators read the weights themselves).
    const auto joined_gate_up_weight = [&]() { return at::cat({saved[1], saved[2]}, 0); };
    at::Tensor gate_up = saved[7];
    if (create_graph) {
      const std::optional<at::Tensor> bias =
          has_gate_up_bias ? std::optional<at::Tensor>(at::cat({saved[4], saved[5]}, 0))
                           : std::nullopt;
      gate_up = cutlass_nn::linear(input, joined_gate_up_weight(), bias);
    }

    at::Tensor grad_gate_up, hidden;
    if (need_gate_up_side) {
      const at::Tensor grad_hidden = cutlass_nn::linear_dgrad(grad_out, down_weight);
      if (create_graph) {
        std::tie(grad_gate_up, hidden) = gated_act_backward_aten(
            grad_hidden, gate_up, parse_gated_activation("gated_mlp", activation));
      } else if (!torch::autograd::get_current_graph_task_keep_graph() &&
                 !ctx->saved_data["saved_tensor_hooks"].toBool() &&
                 !at::isTensorSubclassLike(gate_up) && gate_up.is_contiguous()) {
        // This backward reads the saved gate+up output for the last time, and no later
        // backward can (the graph is not kept, and no saved-tensor hook holds it): its
        // gradient is written over it, so the backward holds one [*, 2n] buffer instead of
        // two. (Traced tensors take the out-of-place form, which tracing expresses without a
        // mutation.)
        hidden = cutlass_nn::gated_act_backward_(grad_hidden, gate_up, activation);
        grad_gate_up = gate_up;
      } else {
        std::tie(grad_gate_up, hidden) =
            cutlass_nn::gated_act_backward(grad_hidden, gate_up, activation);
      }
    } else {
      hidden = cutlass_nn::gated_act(gate_up, activation);
    }
    // The gate+up side reads the block input, dGU and the gate / up weights after this.
    if (need(3) && !accumulate_wgrad_in_place(grad_out, hidden, down_weight,
                                              {input, grad_gate_up, saved[1], saved[2]})) {
      grads[3] = cutlass_nn::linear_wgrad(grad_out, hidden);
    }
    hidden.reset();  // no longer needed: free it before the gate+up GEMMs allocate theirs
    if (has_down_bias && need(6)) grads[6] = cutlass_nn::bias_grad(grad_out);
    if (!need_gate_up_side) return grads;

    const int64_t n = saved[1].size(0);
    if (need(0)) {
      grads[0] = create_graph
                     ? cutlass_nn::linear_dgrad(grad_gate_up, joined_gate_up_weight())
                     : gate_up_dgrad(grad_gate_up, saved[1], saved[2]);
    }
    const bool accumulated = need(1) && need(2) &&
                             accumulate_gate_up_wgrad_in_place(grad_gate_up, input, saved[1],
                                                               saved[2]);
    if ((need(1) || need(2)) && !accumulated) {
      const at::Tensor grad_weight = cutlass_nn::linear_wgrad(grad_gate_up, input);
      if (need(1)) grads[1] = grad_weight.narrow(0, 0, n);
      if (need(2)) grads[2] = grad_weight.narrow(0, n, n);
    }
    if (has_gate_up_bias && (need(4) || need(5))) {
      const at::Tensor grad_bias = cutlass_nn::bias_grad(grad_gate_up);
      if (need(4)) grads[4] = grad_bias.narrow(0, 0, n);
      if (need(5)) grads[5] = grad_bias.narrow(0, n, n);
    }
    return grads;
  }
};

// ---- the Autograd-key kernels: record a node only when one is needed -----------------------
//
// A call that records no node is redispatched straight to the keys below autograd with the key
// set the dispatcher handed in (one dispatcher hop, as torch's own generated autograd kernels do).

// The typed handle of cutlass_nn::<name>, looked up once.
#define CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, name, Signature, ...)                         \
  do {                                                                                       \
    static const auto op = detail::find_op<Signature>("cutlass_nn::" name);                  \
    return op.redispatch((ks) & c10::after_autograd_keyset, __VA_ARGS__);                    \
  } while (false)

using LinearSig = at::Tensor(const at::Tensor&, const at::Tensor&,
                             const std::optional<at::Tensor>&);
using BinarySig = at::Tensor(const at::Tensor&, const at::Tensor&);
using LinearActSig = at::Tensor(const at::Tensor&, const at::Tensor&,
                                const std::optional<at::Tensor>&, c10::string_view);
using LinearActAuxSig = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view);
using ActivationGradSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                             const at::Tensor&,
                                                             c10::string_view, bool);

at::Tensor linear_autograd(c10::DispatchKeySet ks, const at::Tensor& input,
                           const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!records_node(input, weight, bias)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "linear", LinearSig, input, weight, bias);
  }
  return LinearFunction::apply(input, weight, bias)[0];
}

at::Tensor linear_dgrad_autograd(c10::DispatchKeySet ks, const at::Tensor& grad_output,
                                 const at::Tensor& weight) {
  if (!records_node(grad_output, weight)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "linear_dgrad", BinarySig, grad_output, weight);
  }
  return LinearDgradFunction::apply(grad_output, weight)[0];
}

at::Tensor linear_wgrad_autograd(c10::DispatchKeySet ks, const at::Tensor& grad_output,
                                 const at::Tensor& input) {
  if (!records_node(grad_output, input)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "linear_wgrad", BinarySig, grad_output, input);
  }
  return LinearWgradFunction::apply(grad_output, input)[0];
}

at::Tensor bias_grad_autograd(c10::DispatchKeySet ks, const at::Tensor& grad_output) {
  if (!records_node(grad_output)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "bias_grad", at::Tensor(const at::Tensor&),
                                         grad_output);
  }
  return BiasGradFunction::apply(grad_output)[0];
}

at::Tensor mm_autograd(c10::DispatchKeySet ks, const at::Tensor& a, const at::Tensor& b) {
  if (!records_node(a, b)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "mm", BinarySig, a, b);
  }
  return MmFunction::apply(a, b)[0];
}

at::Tensor add2_autograd(c10::DispatchKeySet ks, const at::Tensor& a, const at::Tensor& b) {
  if (!records_node(a, b)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "add2", BinarySig, a, b);
  }
  return Add2Function::apply(a, b)[0];
}

at::Tensor linear_act_autograd(c10::DispatchKeySet ks, const at::Tensor& input,
                               const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               c10::string_view activation) {
  if (!records_node(input, weight, bias)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "linear_act", LinearActSig, input, weight, bias,
                                         activation);
  }
  return LinearActFunction::apply(input, weight, bias, activation)[0];
}

std::tuple<at::Tensor, at::Tensor> linear_act_aux_autograd(c10::DispatchKeySet ks,
                                                           const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const std::optional<at::Tensor>& bias,
                                                           c10::string_view activation) {
  if (!records_node(input, weight, bias)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "linear_act_aux", LinearActAuxSig, input, weight,
                                         bias, activation);
  }
  const auto out = LinearActAuxFunction::apply(input, weight, bias, activation);
  return {out[0], out[1]};
}

std::tuple<at::Tensor, at::Tensor> activation_grad_autograd(c10::DispatchKeySet ks,
                                                            const at::Tensor& grad_output,
                                                            const at::Tensor& preact,
                                                            c10::string_view activation,
                                                            bool bias_grad) {
  if (!records_node(grad_output, preact)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "activation_grad", ActivationGradSig, grad_output,
                                         preact, activation, bias_grad);
  }
  const auto out = ActivationGradFunction::apply(grad_output, preact, activation, bias_grad);
  return {out[0], out[1]};
}

using RmsNormSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       double);

std::tuple<at::Tensor, at::Tensor> rms_norm_autograd(c10::DispatchKeySet ks,
                                                     const at::Tensor& input,
                                                     const at::Tensor& weight, double eps) {
  if (!records_node(input, weight)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "rms_norm", RmsNormSig, input, weight, eps);
  }
  const auto out = RmsNormFunction::apply(input, weight, eps);
  return {out[0], out[1]};
}

using AddRmsNormSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, double);

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_autograd(c10::DispatchKeySet ks,
                                                                     const at::Tensor& input,
                                                                     const at::Tensor& residual,
                                                                     const at::Tensor& weight,
                                                                     double eps) {
  if (!records_node(input, residual, weight)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "add_rms_norm", AddRmsNormSig, input, residual,
                                         weight, eps);
  }
  const auto out = AddRmsNormFunction::apply(input, residual, weight, eps);
  return {out[0], out[1], out[2]};
}

at::Tensor gated_act_autograd(c10::DispatchKeySet ks, const at::Tensor& gate_up,
                              c10::string_view activation) {
  if (!records_node(gate_up)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "gated_act",
                                         at::Tensor(const at::Tensor&, c10::string_view),
                                         gate_up, activation);
  }
  return GatedActFunction::apply(gate_up, activation)[0];
}

using RotarySig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                      const at::Tensor&, const at::Tensor&);

std::tuple<at::Tensor, at::Tensor> rotary_embedding_autograd(c10::DispatchKeySet ks,
                                                             const at::Tensor& q,
                                                             const at::Tensor& k,
                                                             const at::Tensor& cos,
                                                             const at::Tensor& sin) {
  if (!records_node(q, k, cos, sin)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "rotary_embedding", RotarySig, q, k, cos, sin);
  }
  check_rotary_args("rotary_embedding", "q", "k", q, k, cos, sin);
  const auto out = RotaryFunction::apply(q, k, cos, sin);
  return {out[0], out[1]};
}

using GatedMlpSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&, c10::string_view);

at::Tensor gated_mlp_autograd(c10::DispatchKeySet ks, const at::Tensor& input,
                              const at::Tensor& gate_weight, const at::Tensor& up_weight,
                              const at::Tensor& down_weight,
                              const std::optional<at::Tensor>& gate_bias,
                              const std::optional<at::Tensor>& up_bias,
                              const std::optional<at::Tensor>& down_bias,
                              c10::string_view activation) {
  if (!records_node(input, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "gated_mlp", GatedMlpSig, input, gate_weight,
                                         up_weight, down_weight, gate_bias, up_bias, down_bias,
                                         activation);
  }
  // Checked before the node is built, so that bad input fails with the operator's message and
  // nothing of the autograd graph is left half-made.
  check_gated_mlp_args(input, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias);
  parse_gated_activation("gated_mlp", activation);
  return GatedMlpFunction::apply(input, gate_weight, up_weight, down_weight, gate_bias, up_bias,
                                 down_bias, activation)[0];
}

// The internal gate+up GEMM operators have no backward of their own (gated_mlp's autograd
// differentiates its calls of them): a call that would record a node is refused with a named
// error, where the dispatcher's fallback would differentiate the kernel's inner operations
// (a view of packed weights recorded on gate_weight alone: up_weight without a gradient).
using GateUpLinearSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const std::optional<at::Tensor>&,
                                   const std::optional<at::Tensor>&);
using GateUpDgradSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);

void refuse_gradients(bool records, const char* op) {
  TORCH_CHECK(!records, "cutlass_nn.", op,
              ": an internal operator of gated_mlp, not differentiable; with grad mode on, its "
              "arguments must not require grad (cutlass_nn.functional.gated_mlp and "
              "cutlass_nn.functional.linear are the differentiable forms)");
}

at::Tensor gate_up_linear_autograd(c10::DispatchKeySet ks, const at::Tensor& input,
                                   const at::Tensor& gate_weight, const at::Tensor& up_weight,
                                   const std::optional<at::Tensor>& gate_bias,
                                   const std::optional<at::Tensor>& up_bias) {
  refuse_gradients(records_node(input, gate_weight, up_weight, gate_bias, up_bias),
                   "_gate_up_linear");
  CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "_gate_up_linear", GateUpLinearSig, input,
                                       gate_weight, up_weight, gate_bias, up_bias);
}

at::Tensor gate_up_dgrad_autograd(c10::DispatchKeySet ks, const at::Tensor& grad_gate_up,
                                  const at::Tensor& gate_weight, const at::Tensor& up_weight) {
  refuse_gradients(records_node(grad_gate_up, gate_weight, up_weight), "_gate_up_dgrad");
  CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "_gate_up_dgrad", GateUpDgradSig, grad_gate_up,
                                       gate_weight, up_weight);
}

// The packing's forward and backward, shared by its two autograd forms below: gate and up cast
// into the two halves of one new buffer (below autograd); each half's gradient goes back to its
// weight in the weight's dtype (differentiable ops: double backward works).
at::Tensor pack_and_save_dtypes(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                                at::ScalarType dtype) {
  ctx->saved_data["gate_dtype"] = gate.scalar_type();
  ctx->saved_data["up_dtype"] = up.scalar_type();
  at::AutoDispatchBelowADInplaceOrView below;
  return pack_gate_up(gate, up, dtype);
}

variable_list half_grads_to_weights(AutogradContext* ctx, const at::Tensor& grad_gate,
                                    const at::Tensor& grad_up) {
  // a frozen weight gets no gradient: no cast of its half (a full [n, in] pass) is made for it
  const auto to_weight = [ctx](size_t input, const at::Tensor& grad, const char* dtype_key) {
    return ctx->needs_input_grad(input) ? grad.to(ctx->saved_data[dtype_key].toScalarType())
                                        : at::Tensor();
  };
  return {to_weight(0, grad_gate, "gate_dtype"), to_weight(1, grad_up, "up_dtype"), at::Tensor()};
}

// _pack_gate_up: the packed [2n, in] buffer as one output.
class PackGateUpFunction : public torch::autograd::Function<PackGateUpFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& gate,
                               const at::Tensor& up, at::ScalarType dtype) {
    return {pack_and_save_dtypes(ctx, gate, up, dtype)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    const at::Tensor& grad = grads_out[0];
    const int64_t n = grad.size(0) / 2;
    return half_grads_to_weights(ctx, grad.narrow(0, 0, n), grad.narrow(0, n, n));
  }
};

// The autocast kernel's form of _pack_gate_up: the two halves of the packed buffer as the two
// outputs of one node (views of one new buffer made below autograd, so gated_mlp still reads
// them as one GEMM operand). Each half's gradient arrives as a tensor of its own and goes
// straight to its weight; through narrow views of one packed output, autograd would have made a
// zero-filled [2n, in] gradient per half and summed the two before the backward split them
// again (about 1.3 GB read and written per step for bfloat16 copies of two 11008 x 4096
// weights).
class PackGateUpHalvesFunction : public torch::autograd::Function<PackGateUpHalvesFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& gate,
                               const at::Tensor& up, at::ScalarType dtype) {
    const at::Tensor packed = pack_and_save_dtypes(ctx, gate, up, dtype);
    const int64_t n = gate.size(0);
    at::AutoDispatchBelowADInplaceOrView below;  // plain tensors for autograd, not views
    return {packed.narrow(0, 0, n), packed.narrow(0, n, n)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads_out) {
    // an undefined gradient arrives as zeros (materialized): each weight that needs a gradient
    // gets one
    return half_grads_to_weights(ctx, grads_out[0], grads_out[1]);
  }
};

using PackGateUpSig = at::Tensor(const at::Tensor&, const at::Tensor&, at::ScalarType);

at::Tensor pack_gate_up_autograd(c10::DispatchKeySet ks, const at::Tensor& gate,
                                 const at::Tensor& up, at::ScalarType dtype) {
  if (!records_node(gate, up)) {
    CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD(ks, "_pack_gate_up", PackGateUpSig, gate, up, dtype);
  }
  check_pack_gate_up_args(gate, up, dtype);
  return PackGateUpFunction::apply(gate, up, dtype)[0];
}

#undef CUTLASS_NN_REDISPATCH_BELOW_AUTOGRAD

}  // namespace

std::pair<at::Tensor, at::Tensor> pack_gate_up_halves(const at::Tensor& gate,
                                                      const at::Tensor& up,
                                                      at::ScalarType dtype) {
  if (!records_node(gate, up)) {
    const int64_t n = gate.size(0);
    const at::Tensor packed = pack_gate_up(gate, up, dtype);
    return {packed.narrow(0, 0, n), packed.narrow(0, n, n)};
  }
  check_pack_gate_up_args(gate, up, dtype);
  const auto halves = PackGateUpHalvesFunction::apply(gate, up, dtype);
  return {halves[0], halves[1]};
}

bool set_fused_wgrad_accumulation_flag(bool enable) {
  return g_fused_wgrad_accumulation.exchange(enable);
}

bool fused_wgrad_accumulation_flag() { return g_fused_wgrad_accumulation.load(); }

TORCH_LIBRARY_IMPL(cutlass_nn, Autograd, m) {
  m.impl("linear", &linear_autograd);
  m.impl("linear_dgrad", &linear_dgrad_autograd);
  m.impl("linear_wgrad", &linear_wgrad_autograd);
  m.impl("bias_grad", &bias_grad_autograd);
  m.impl("mm", &mm_autograd);
  m.impl("add2", &add2_autograd);
  m.impl("linear_act", &linear_act_autograd);
  m.impl("linear_act_aux", &linear_act_aux_autograd);
  m.impl("activation_grad", &activation_grad_autograd);
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
  m.impl("gated_act", &gated_act_autograd);
  m.impl("gated_mlp", &gated_mlp_autograd);
  m.impl("_gate_up_linear", &gate_up_linear_autograd);
  m.impl("_gate_up_dgrad", &gate_up_dgrad_autograd);
  m.impl("_pack_gate_up", &pack_gate_up_autograd);
  m.impl("rotary_embedding", &rotary_embedding_autograd);
}

}  // namespace cutlass_nn
