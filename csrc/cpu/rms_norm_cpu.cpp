// CPU implementations of rms_norm, add_rms_norm and rms_norm_backward: the shared checks, then
// the ATen formulation (csrc/rms_norm_aten.h), which is the reference the CUDA kernels are
// tested against.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../op_checks.h"
#include "../rms_norm_aten.h"

namespace cutlass_nn {
namespace {

std::tuple<at::Tensor, at::Tensor> rms_norm_cpu(const at::Tensor& input, const at::Tensor& weight,
                                                double eps) {
  check_rms_norm_args("rms_norm", "input", input, nullptr, weight, eps);
  auto [out, h, rstd] = rms_norm_forward_aten(input, nullptr, weight, eps);
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& input,
                                                                const at::Tensor& residual,
                                                                const at::Tensor& weight,
                                                                double eps) {
  check_rms_norm_args("add_rms_norm", "x", input, &residual, weight, eps);
  return rms_norm_forward_aten(input, &residual, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad_output,
                                                         const std::optional<at::Tensor>& grad_h,
                                                         const at::Tensor& h,
                                                         const at::Tensor& weight,
                                                         const at::Tensor& rstd,
                                                         bool weight_grad) {
  check_rms_norm_backward_args(grad_output, grad_h, h, weight, rstd);
  return rms_norm_backward_aten(grad_output, grad_h.value_or(at::Tensor()), h, weight, rstd,
                                /*eps=*/0.0, weight_grad);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("add_rms_norm", &add_rms_norm_cpu);
  m.impl("rms_norm_backward", &rms_norm_backward_cpu);
}

}  // namespace cutlass_nn
