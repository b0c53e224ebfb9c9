// CPU implementations of gated_act and gated_act_backward (the shared checks, then the ATen
// formulation of csrc/gated_act_aten.h, the reference the CUDA kernels are tested against), and
// gated_mlp's CPU registration (the composite of csrc/gated_mlp.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "../gated_act_aten.h"
#include "../gated_mlp.h"
#include "../op_checks.h"

namespace cutlass_nn {
namespace {

at::Tensor gated_act_cpu(const at::Tensor& gate_up, c10::string_view activation) {
  check_gate_up_arg("gated_act", gate_up);
  return gated_act_forward_aten(gate_up, parse_gated_activation("gated_act", activation));
}

std::tuple<at::Tensor, at::Tensor> gated_act_backward_cpu(const at::Tensor& grad_output,
                                                          const at::Tensor& gate_up,
                                                          c10::string_view activation) {
  check_gated_act_backward_args(grad_output, gate_up);
  return gated_act_backward_aten(grad_output, gate_up,
                                 parse_gated_activation("gated_act_backward", activation));
}

at::Tensor gated_act_backward_inplace_cpu(const at::Tensor& grad_output, const at::Tensor& gate_up,
                                         c10::string_view activation) {
  const char* op = "gated_act_backward_";
  check_gated_act_backward_args(grad_output, gate_up, op);
  check_gate_up_writable(op, gate_up, grad_output);
  auto [grad_gate_up, out] =
      gated_act_backward_aten(grad_output, gate_up, parse_gated_activation(op, activation));
  gate_up.copy_(grad_gate_up);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CPU, m) {
  m.impl("gated_act", &gated_act_cpu);
  m.impl("gated_act_backward", &gated_act_backward_cpu);
  m.impl("gated_act_backward_", &gated_act_backward_inplace_cpu);
  m.impl("gated_mlp", &gated_mlp_composite);
  m.impl("_gate_up_linear", &gate_up_linear_kernel);
  m.impl("_gate_up_dgrad", &gate_up_dgrad_kernel);
  m.impl("_pack_gate_up", &pack_gate_up_kernel);
}

}  // namespace cutlass_nn
