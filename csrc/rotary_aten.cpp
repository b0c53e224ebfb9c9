#include "rotary_aten.h"

#include <ATen/ATen.h>

namespace cutlass_nn {
namespace {

c10::ScalarType compute_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// [-x2, x1] over the last dim.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

at::Tensor rotary_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       bool backward) {
  const auto compute = compute_dtype(x);
  const at::Tensor xf = x.to(compute);
  const at::Tensor c = cos.to(compute).unsqueeze(1);
  const at::Tensor s = sin.to(compute).unsqueeze(1);
  at::Tensor out;
  if (backward) {
    // [g1 c1 + g2 s2, g2 c2 - g1 s1]: g * cos + [y2, -y1] with y = g * sin
    const at::Tensor y = xf * s;
    const int64_t half = x.size(-1) / 2;
    out = xf * c + at::cat({y.narrow(-1, half, half), -y.narrow(-1, 0, half)}, -1);
  } else {
    out = xf * c + rotate_half(xf) * s;
  }
  return out.to(x.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> rotary_table_grads_aten(const at::Tensor& grad_q,
                                                           const at::Tensor& grad_k,
                                                           const at::Tensor& q,
                                                           const at::Tensor& k,
                                                           const at::Tensor& cos) {
  const auto compute = compute_dtype(cos);
  at::Tensor grad_cos = at::zeros({q.size(0), cos.size(1), cos.size(2)},
                                  cos.options().dtype(compute));
  at::Tensor grad_sin = at::zeros_like(grad_cos);
  auto add = [&](const at::Tensor& g, const at::Tensor& x) {
    if (!g.defined()) return;
    const at::Tensor gf = g.to(compute);
    const at::Tensor xf = x.to(compute);
    grad_cos = grad_cos + (gf * xf).sum(1);
    grad_sin = grad_sin + (gf * rotate_half(xf)).sum(1);
  };
  add(grad_q, q);
  add(grad_k, k);
  if (cos.size(0) == 1 && q.size(0) != 1) {
    grad_cos = grad_cos.sum(0, true);
    grad_sin = grad_sin.sum(0, true);
  }
  return {grad_cos.to(cos.scalar_type()), grad_sin.to(cos.scalar_type())};
}

}  // namespace cutlass_nn
