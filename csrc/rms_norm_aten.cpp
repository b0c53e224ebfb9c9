#include "rms_norm_aten.h"

#include <ATen/ATen.h>

#include "op_checks.h"  // rms_norm_stat_dtype

namespace cutlass_nn {

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_forward_aten(const at::Tensor& input,
                                                                     const at::Tensor* residual,
                                                                     const at::Tensor& weight,
                                                                     double eps) {
  const at::Tensor h = residual != nullptr ? at::add(input, *residual) : input;
  const auto stat = rms_norm_stat_dtype(h.scalar_type());
  const at::Tensor hf = h.to(stat);
  const at::Tensor rstd = at::rsqrt(hf.square().mean(-1) + eps);
  const at::Tensor out = (hf * rstd.unsqueeze(-1) * weight.to(stat)).to(h.scalar_type());
  return {out, h, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_aten(const at::Tensor& grad_output,
                                                          const at::Tensor& grad_h_in,
                                                          const at::Tensor& h,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& rstd, double eps,
                                                          bool weight_grad) {
  const auto stat = rms_norm_stat_dtype(h.scalar_type());
  const at::Tensor hf = h.to(stat);
  const at::Tensor r =
      (rstd.defined() ? rstd.to(stat) : at::rsqrt(hf.square().mean(-1) + eps)).unsqueeze(-1);
  const at::Tensor n = hf * r;
  const at::Tensor g = grad_output.to(stat);
  const at::Tensor dn = g * weight.to(stat);
  at::Tensor grad_h = r * (dn - n * (dn * n).mean(-1, /*keepdim=*/true));
  if (grad_h_in.defined()) grad_h = grad_h + grad_h_in.to(stat);
  grad_h = grad_h.to(h.scalar_type());
  at::Tensor grad_weight;
  if (weight_grad) {
    grad_weight = (g * n).reshape({-1, h.size(-1)}).sum(0).to(weight.scalar_type());
  } else {
    grad_weight = at::empty({0}, weight.options());
  }
  return {grad_h, grad_weight};
}

}  // namespace cutlass_nn
