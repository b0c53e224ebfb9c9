// CPU implementations of rotary_embedding and rotary_embedding_backward: the shared checks, then
// the ATen formulation of csrc/rotary_aten.h (the reference the CUDA kernel is tested against,
// bitwise), written into outputs of the layout csrc/rotary_layout.h describes.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "../op_checks.h"
#include "../rotary_aten.h"
#include "../rotary_layout.h"

namespace cutlass_nn {
namespace {

at::Tensor rotated(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                   bool backward) {
  at::Tensor out = rotary_keeps_layout(x) ? at::empty_like(x) : at::empty(x.sizes(), x.options());
  out.copy_(rotary_aten(x, cos, sin, backward));
  return out;
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_cpu(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& cos,
                                                        const at::Tensor& sin) {
  check_rotary_args("rotary_embedding", "q", "k", q, k, cos, sin);
  return {rotated(q, cos, sin, false), rotated(k, cos, sin, false)};
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_cpu(const at::Tensor& grad_q,
                                                                 const at::Tensor& grad_k,
                                                                 const at::Tensor& cos,
                                                                 const at::Tensor& sin) {
  check_rotary_args("rotary_embedding_backward", "grad_q", "grad_k", grad_q, grad_k, cos, sin);
  return {rotated(grad_q, cos, sin, true), rotated(grad_k, cos, sin, true)};
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CPU, m) {
  m.impl("rotary_embedding", &rotary_embedding_cpu);
  m.impl("rotary_embedding_backward", &rotary_embedding_backward_cpu);
}

}  // namespace cutlass_nn
