#include "gated_act_aten.h"

#include <ATen/ATen.h>

namespace cutlass_nn {
namespace {

c10::ScalarType compute_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor act_aten(const at::Tensor& g, kernels::Activation act) {
  switch (act) {
    case kernels::Activation::kSilu: return at::silu(g);
    case kernels::Activation::kGelu: return at::gelu(g, "none");
    case kernels::Activation::kGeluTanh: return at::gelu(g, "tanh");
    default: TORCH_CHECK(false, "cutlass_nn: internal error: not a gated activation");
  }
}

// grad * act'(g) with differentiable ATen ops (the double backward of the gated MLP goes through
// it): gelu_backward has a derivative of its own in torch; silu_backward does not, so silu's
// s (1 + g (1 - s)), s = sigmoid(g), is spelled out.
at::Tensor act_backward_aten(const at::Tensor& grad, const at::Tensor& g,
                             kernels::Activation act) {
  switch (act) {
    case kernels::Activation::kSilu: {
      const at::Tensor s = at::sigmoid(g);
      return grad * (s * (1 + g * (1 - s)));
    }
    case kernels::Activation::kGelu: return at::gelu_backward(grad, g, "none");
    case kernels::Activation::kGeluTanh: return at::gelu_backward(grad, g, "tanh");
    default: TORCH_CHECK(false, "cutlass_nn: internal error: not a gated activation");
  }
}

}  // namespace

at::Tensor gated_act_forward_aten(const at::Tensor& gate_up, kernels::Activation act) {
  const at::Tensor x = gate_up.to(compute_dtype(gate_up));
  const int64_t n = x.size(-1) / 2;
  return (act_aten(x.narrow(-1, 0, n), act) * x.narrow(-1, n, n)).to(gate_up.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> gated_act_backward_aten(const at::Tensor& grad_output,
                                                           const at::Tensor& gate_up,
                                                           kernels::Activation act) {
  const auto compute = compute_dtype(gate_up);
  const at::Tensor x = gate_up.to(compute);
  const at::Tensor go = grad_output.to(compute);
  const int64_t n = x.size(-1) / 2;
  const at::Tensor g = x.narrow(-1, 0, n);
  const at::Tensor u = x.narrow(-1, n, n);
  const at::Tensor a = act_aten(g, act);
  const at::Tensor grad_g = act_backward_aten(go * u, g, act);
  const at::Tensor grad_u = go * a;
  const auto dtype = gate_up.scalar_type();
  return {at::cat({grad_g, grad_u}, -1).to(dtype), (a * u).to(dtype)};
}

}  // namespace cutlass_nn
