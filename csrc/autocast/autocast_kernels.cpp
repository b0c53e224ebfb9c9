// Autocast (torch.autocast / AMP) of the cutlass_nn matrix operators, in C++.
//
// linear, linear_act, linear_act_aux, mm and gated_mlp follow the policy torch applies to nn.Linear and
// torch.mm: under autocast, floating inputs other than float64 are cast to the autocast dtype
// (bfloat16 or float16 by the context) and the operator runs in it. The casts are ordinary
// differentiable ops recorded before the operator's own autograd node, so gradients reach float32
// parameters in float32; at::autocast::cached_cast reuses the cast of a weight within one autocast
// region, as nn.Linear does. The gradient operators and add2 have no autocast kernel: the
// dispatcher falls through to their autograd and backend kernels.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <tuple>
#include <utility>

#include "../gated_mlp.h"
#include "../include/cutlass_nn/ops.h"

namespace cutlass_nn {
namespace {

template <c10::DeviceType Device>
struct AutocastScope {
  static constexpr c10::DispatchKey key = Device == c10::DeviceType::CUDA
                                              ? c10::DispatchKey::AutocastCUDA
                                              : c10::DispatchKey::AutocastCPU;
  // The operator below runs with this device's autocast key excluded (no second cast).
  c10::impl::ExcludeDispatchKeyGuard no_autocast{key};
  const at::ScalarType dtype = at::autocast::get_lower_precision_fp_from_device_type(Device);

  at::Tensor cast(const at::Tensor& t) const { return at::autocast::cached_cast(dtype, t, Device); }
  std::optional<at::Tensor> cast(const std::optional<at::Tensor>& t) const {
    return at::autocast::cached_cast(dtype, t, Device);
  }
};

template <c10::DeviceType Device>
at::Tensor linear_autocast(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias) {
  AutocastScope<Device> scope;
  return cutlass_nn::linear(scope.cast(input), scope.cast(weight), scope.cast(bias));
}

template <c10::DeviceType Device>
at::Tensor linear_act_autocast(const at::Tensor& input, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias,
                               c10::string_view activation) {
  AutocastScope<Device> scope;
  return cutlass_nn::linear_act(scope.cast(input), scope.cast(weight), scope.cast(bias),
                                activation);
}

template <c10::DeviceType Device>
std::tuple<at::Tensor, at::Tensor> linear_act_aux_autocast(const at::Tensor& input,
                                                           const at::Tensor& weight,
                                                           const std::optional<at::Tensor>& bias,
                                                           c10::string_view activation) {
  AutocastScope<Device> scope;
  return cutlass_nn::linear_act_aux(scope.cast(input), scope.cast(weight), scope.cast(bias),
                                    activation);
}

template <c10::DeviceType Device>
at::Tensor mm_autocast(const at::Tensor& a, const at::Tensor& b) {
  AutocastScope<Device> scope;
  return cutlass_nn::mm(scope.cast(a), scope.cast(b));
}

// The autocast copies of the gate and up weights: cast together into the two halves of one
// low-precision buffer (pack_gate_up_halves: one autograd node hands each half's gradient back to
// its float32 weight), so the gated_mlp kernel reads them as one GEMM operand without a
// concatenation, also inside a compiled graph (where separate casts reached the gate+up
// operators as two buffers, each then concatenated in the forward and again in the backward).
// Anything else (not a cast autocast would make, or up not of gate's shape, dtype and device):
// cached_cast each.
template <c10::DeviceType Device>
std::pair<at::Tensor, at::Tensor> cast_gate_up(const AutocastScope<Device>& scope,
                                               const at::Tensor& gate, const at::Tensor& up) {
  const bool castable = gate.is_floating_point() && gate.scalar_type() != at::kDouble &&
                        gate.scalar_type() != scope.dtype && gate.device().type() == Device &&
                        gate.dim() == 2 && up.sizes() == gate.sizes() &&
                        up.scalar_type() == gate.scalar_type() && up.device() == gate.device();
  if (!castable) return {scope.cast(gate), scope.cast(up)};
  return pack_gate_up_halves(gate, up, scope.dtype);
}

template <c10::DeviceType Device>
at::Tensor gated_mlp_autocast(const at::Tensor& input, const at::Tensor& gate_weight,
                              const at::Tensor& up_weight, const at::Tensor& down_weight,
                              const std::optional<at::Tensor>& gate_bias,
                              const std::optional<at::Tensor>& up_bias,
                              const std::optional<at::Tensor>& down_bias,
                              c10::string_view activation) {
  AutocastScope<Device> scope;
  const auto [gate, up] = cast_gate_up(scope, gate_weight, up_weight);
  return cutlass_nn::gated_mlp(scope.cast(input), gate, up,
                               scope.cast(down_weight), scope.cast(gate_bias),
                               scope.cast(up_bias), scope.cast(down_bias), activation);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, AutocastCUDA, m) {
  m.impl("linear", &linear_autocast<c10::DeviceType::CUDA>);
  m.impl("linear_act", &linear_act_autocast<c10::DeviceType::CUDA>);
  m.impl("linear_act_aux", &linear_act_aux_autocast<c10::DeviceType::CUDA>);
  m.impl("mm", &mm_autocast<c10::DeviceType::CUDA>);
  m.impl("gated_mlp", &gated_mlp_autocast<c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(cutlass_nn, AutocastCPU, m) {
  m.impl("linear", &linear_autocast<c10::DeviceType::CPU>);
  m.impl("linear_act", &linear_act_autocast<c10::DeviceType::CPU>);
  m.impl("linear_act_aux", &linear_act_aux_autocast<c10::DeviceType::CPU>);
  m.impl("mm", &mm_autocast<c10::DeviceType::CPU>);
  m.impl("gated_mlp", &gated_mlp_autocast<c10::DeviceType::CPU>);
}

}  // namespace cutlass_nn
