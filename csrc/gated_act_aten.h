// The gated activation act(gate) * up written with ATen operators: the CPU kernels of gated_act
// and gated_act_backward, and the backward the autograd kernels use under create_graph (every
// step is a differentiable ATen op, so second-order gradients flow through it).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "kernels/activation_math.h"  // Activation

namespace cutlass_nn {

// out [*, n] = act(gate_up[..., :n]) * gate_up[..., n:], computed in float (double for float64)
// and rounded once to gate_up's dtype. act is kSilu, kGelu or kGeluTanh. No argument checks.
at::Tensor gated_act_forward_aten(const at::Tensor& gate_up, kernels::Activation act);

// (grad_gate_up [*, 2n], out [*, n]) for output gradient grad_output [*, n]: the gate half is
// grad_output * up * act'(gate), the up half grad_output * act(gate); out is the forward.
std::tuple<at::Tensor, at::Tensor> gated_act_backward_aten(const at::Tensor& grad_output,
                                                           const at::Tensor& gate_up,
                                                           kernels::Activation act);

}  // namespace cutlass_nn
