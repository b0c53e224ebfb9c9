// The rotary position embedding written with ATen operators: the CPU kernels of
// rotary_embedding and rotary_embedding_backward, and the backward the autograd kernels use
// under create_graph or when cos / sin need gradients (every step is a differentiable ATen op).
//
// Layout (the one transformers' apply_rotary_pos_emb sees with unsqueeze_dim=1): q [B, Hq, S, D],
// k [B, Hk, S, D], cos and sin [B or 1, S, D], broadcast over the heads.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace cutlass_nn {

// x * cos + rotate_half(x) * sin with rotate_half(x) = [-x2, x1], computed in float (double for
// float64) as a product, a product and a sum, rounded once to x's dtype. `backward` applies the
// transposed rotation instead: g * cos + [g2 * s2, -(g1 * s1)]. No argument checks.
at::Tensor rotary_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       bool backward);

// The gradients of cos and sin of (q_out, k_out) = rotary_embedding(q, k, cos, sin) for output
// gradients grad_q, grad_k (either may be undefined): summed over the heads, and over the batch
// when cos has one row of batch. In cos's dtype.
std::tuple<at::Tensor, at::Tensor> rotary_table_grads_aten(const at::Tensor& grad_q,
                                                           const at::Tensor& grad_k,
                                                           const at::Tensor& q,
                                                           const at::Tensor& k,
                                                           const at::Tensor& cos);

}  // namespace cutlass_nn
