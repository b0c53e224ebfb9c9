#include "gated_mlp.h"

#include <ATen/ATen.h>
#include <ATen/TensorSubclassLikeUtils.h>

#include "include/cutlass_nn/ops.h"
#include "op_checks.h"

namespace cutlass_nn {
namespace {

bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

}  // namespace

bool gate_up_adjacent(const at::Tensor& gate, const at::Tensor& up) {
  if (at::isTensorSubclassLike(gate) || at::isTensorSubclassLike(up)) return false;
  if (!gate.has_storage() || !up.has_storage()) return false;
  return gate.dim() == 2 && gate.sizes() == up.sizes() && gate.dtype() == up.dtype() &&
         gate.device() == up.device() && gate.is_contiguous() && up.is_contiguous() &&
         gate.storage().is_alias_of(up.storage()) &&
         up.storage_offset() == gate.storage_offset() + gate.numel();
}

at::Tensor gate_up_weight(const at::Tensor& gate_weight, const at::Tensor& up_weight) {
  if (gate_up_adjacent(gate_weight, up_weight)) {
    return gate_weight.as_strided({2 * gate_weight.size(0), gate_weight.size(1)},
                                  {gate_weight.size(1), 1}, gate_weight.storage_offset());
  }
  return at::cat({gate_weight, up_weight}, 0);
}

std::optional<at::Tensor> gate_up_bias(const std::optional<at::Tensor>& gate_bias,
                                       const std::optional<at::Tensor>& up_bias) {
  if (!defined(gate_bias)) return std::nullopt;
  return at::cat({*gate_bias, *up_bias}, 0);
}

at::Tensor gate_up_linear_kernel(const at::Tensor& input, const at::Tensor& gate_weight,
                                 const at::Tensor& up_weight,
                                 const std::optional<at::Tensor>& gate_bias,
                                 const std::optional<at::Tensor>& up_bias) {
  check_gate_up_linear_args(input, gate_weight, up_weight, gate_bias, up_bias);
  return cutlass_nn::linear(input, gate_up_weight(gate_weight, up_weight),
                            gate_up_bias(gate_bias, up_bias));
}

at::Tensor gate_up_dgrad_kernel(const at::Tensor& grad_gate_up, const at::Tensor& gate_weight,
                                const at::Tensor& up_weight) {
  check_gate_up_dgrad_args(grad_gate_up, gate_weight, up_weight);
  return cutlass_nn::linear_dgrad(grad_gate_up, gate_up_weight(gate_weight, up_weight));
}

at::Tensor pack_gate_up_kernel(const at::Tensor& gate, const at::Tensor& up,
                               at::ScalarType dtype) {
  check_pack_gate_up_args(gate, up, dtype);
  const int64_t n = gate.size(0);
  at::Tensor packed = at::empty({2 * n, gate.size(1)}, gate.options().dtype(dtype));
  packed.narrow(0, 0, n).copy_(gate);
  packed.narrow(0, n, n).copy_(up);
  return packed;
}

at::Tensor pack_gate_up(const at::Tensor& gate, const at::Tensor& up, at::ScalarType dtype) {
  static const auto op =
      detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&, at::ScalarType)>(
          "cutlass_nn::_pack_gate_up");
  return op.call(gate, up, dtype);
}

at::Tensor gate_up_linear(const at::Tensor& input, const at::Tensor& gate_weight,
                          const at::Tensor& up_weight, const std::optional<at::Tensor>& gate_bias,
                          const std::optional<at::Tensor>& up_bias) {
  static const auto op = detail::find_op<at::Tensor(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
      const std::optional<at::Tensor>&)>("cutlass_nn::_gate_up_linear");
  return op.call(input, gate_weight, up_weight, gate_bias, up_bias);
}

at::Tensor gate_up_dgrad(const at::Tensor& grad_gate_up, const at::Tensor& gate_weight,
                         const at::Tensor& up_weight) {
  static const auto op =
      detail::find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
          "cutlass_nn::_gate_up_dgrad");
  return op.call(grad_gate_up, gate_weight, up_weight);
}

std::tuple<at::Tensor, at::Tensor> gated_mlp_forward(
    const at::Tensor& input, const at::Tensor& gate_weight, const at::Tensor& up_weight,
    const at::Tensor& down_weight, const std::optional<at::Tensor>& gate_bias,
    const std::optional<at::Tensor>& up_bias, const std::optional<at::Tensor>& down_bias,
    c10::string_view activation) {
  const at::Tensor gate_up = gate_up_linear(input, gate_weight, up_weight, gate_bias, up_bias);
  const at::Tensor hidden = cutlass_nn::gated_act(gate_up, activation);
  return {cutlass_nn::linear(hidden, down_weight,
                             defined(down_bias) ? down_bias : std::nullopt),
          gate_up};
}

at::Tensor gated_mlp_composite(const at::Tensor& input, const at::Tensor& gate_weight,
                               const at::Tensor& up_weight, const at::Tensor& down_weight,
                               const std::optional<at::Tensor>& gate_bias,
                               const std::optional<at::Tensor>& up_bias,
                               const std::optional<at::Tensor>& down_bias,
                               c10::string_view activation) {
  check_gated_mlp_args(input, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias);
  parse_gated_activation("gated_mlp", activation);
  return std::get<0>(gated_mlp_forward(input, gate_weight, up_weight, down_weight, gate_bias,
                                       up_bias, down_bias, activation));
}

}  // namespace cutlass_nn
