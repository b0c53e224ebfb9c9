// The gated MLP down(act(gate(x)) * up(x)) as a composition of cutlass_nn operators, shared by the
// backend kernels of gated_mlp (CPU and CUDA register the same composite: its GEMMs and gated
// activation dispatch to the backend's own kernels) and by its autograd kernel.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>
#include <utility>

namespace cutlass_nn {

// The gate+up weight [2n, in] (gate rows first) as one tensor for the single gate+up GEMM:
// a view without a copy when up_weight directly follows gate_weight in one storage (both
// contiguous, same shape and dtype: the layout cutlass_nn.GatedMLP keeps), else their
// concatenation (a copy per call). Traced tensors (FakeTensor, functional wrappers) always take
// the concatenation, which tracing can express.
at::Tensor gate_up_weight(const at::Tensor& gate_weight, const at::Tensor& up_weight);

// Whether up_weight's rows directly follow gate_weight's in one storage (both contiguous, same
// shape, dtype and device; never for traced tensors): the case gate_up_weight serves as a view.
bool gate_up_adjacent(const at::Tensor& gate_weight, const at::Tensor& up_weight);

// gate_bias and up_bias concatenated ([2n]), or nullopt when there are none.
std::optional<at::Tensor> gate_up_bias(const std::optional<at::Tensor>& gate_bias,
                                       const std::optional<at::Tensor>& up_bias);

// The kernels of the internal operators _gate_up_linear and _gate_up_dgrad (CPU and CUDA register
// the same functions): linear(input, [gate; up], [gate_bias; up_bias]) -> [*, 2n] and
// linear_dgrad(grad_gate_up, [gate; up]) -> [*, in], the weights joined by gate_up_weight. Being
// operators of their own, they run on the real weights inside a traced graph too (torch.compile),
// where the view is then taken; traced through gated_mlp's autograd as linear over gate_up_weight,
// the concatenation of the weights was recorded into the graph (a copy of both weights per layer,
// which the backward kept for its input gradient).
at::Tensor gate_up_linear_kernel(const at::Tensor& input, const at::Tensor& gate_weight,
                                 const at::Tensor& up_weight,
                                 const std::optional<at::Tensor>& gate_bias,
                                 const std::optional<at::Tensor>& up_bias);
at::Tensor gate_up_dgrad_kernel(const at::Tensor& grad_gate_up, const at::Tensor& gate_weight,
                                const at::Tensor& up_weight);

// The kernel of the internal operator _pack_gate_up (CPU and CUDA): gate and up cast to `dtype`
// into the two halves of one new [2n, in] buffer.
at::Tensor pack_gate_up_kernel(const at::Tensor& gate, const at::Tensor& up,
                               at::ScalarType dtype);

// Calls of those operators through the dispatcher (below autograd, where gated_mlp uses them;
// pack_gate_up through autograd from the autocast kernel).
at::Tensor gate_up_linear(const at::Tensor& input, const at::Tensor& gate_weight,
                          const at::Tensor& up_weight, const std::optional<at::Tensor>& gate_bias,
                          const std::optional<at::Tensor>& up_bias);
at::Tensor gate_up_dgrad(const at::Tensor& grad_gate_up, const at::Tensor& gate_weight,
                         const at::Tensor& up_weight);
at::Tensor pack_gate_up(const at::Tensor& gate, const at::Tensor& up, at::ScalarType dtype);

// The autocast kernel's packing (csrc/autograd/autograd_kernels.cpp): gate and up cast into the
// two halves of one new [2n, in] buffer, returned as two [n, in] tensors; when gradients are
// recorded, one autograd node takes each half's gradient back to its weight without forming a
// [2n, in] gradient. Arguments as for _pack_gate_up.
std::pair<at::Tensor, at::Tensor> pack_gate_up_halves(const at::Tensor& gate,
                                                      const at::Tensor& up,
                                                      at::ScalarType dtype);

// (out, gate_up) with gate_up = linear(input, [gate; up], [gate_bias; up_bias]) the gate+up GEMM
// output [*, 2n] the backward needs. The arguments must have passed check_gated_mlp_args.
std::tuple<at::Tensor, at::Tensor> gated_mlp_forward(
    const at::Tensor& input, const at::Tensor& gate_weight, const at::Tensor& up_weight,
    const at::Tensor& down_weight, const std::optional<at::Tensor>& gate_bias,
    const std::optional<at::Tensor>& up_bias, const std::optional<at::Tensor>& down_bias,
    c10::string_view activation);

// The backend kernel of gated_mlp: the checks, then gated_mlp_forward's output.
at::Tensor gated_mlp_composite(const at::Tensor& input, const at::Tensor& gate_weight,
                               const at::Tensor& up_weight, const at::Tensor& down_weight,
                               const std::optional<at::Tensor>& gate_bias,
                               const std::optional<at::Tensor>& up_bias,
                               const std::optional<at::Tensor>& down_bias,
                               c10::string_view activation);

}  // namespace cutlass_nn
