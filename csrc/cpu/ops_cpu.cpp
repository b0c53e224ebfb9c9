// CPU implementations of the cutlass_nn operators.
//
// They are the reference and the fallback, not the speed path: each one validates with the
// shared checks (so errors match the CUDA backend) and then calls ATen's own CPU routines.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../op_checks.h"
#include "../tensor_shapes.h"

namespace cutlass_nn {
namespace {

// The outputs are allocated in their final [*, features] shape and the 2-D GEMM writes through a
// view of them, so the returned tensor is not itself a view (in-place ops on it, such as a
// following ReLU(inplace=True), must work as they do after nn.Linear).
at::Tensor linear_cpu(const at::Tensor& input, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias) {
  check_linear_args(input, weight, bias);
  const at::Tensor x = flatten_leading(input);
  at::Tensor y = at::empty(with_last_dim(input, weight.size(0)), input.options());
  at::Tensor y2d = y.view({x.size(0), weight.size(0)});
  if (bias.has_value()) {
    at::addmm_out(y2d, *bias, x, weight.t());
  } else {
    at::mm_out(y2d, x, weight.t());
  }
  return y;
}

at::Tensor linear_dgrad_cpu(const at::Tensor& grad_output, const at::Tensor& weight) {
  check_linear_dgrad_args(grad_output, weight);
  const at::Tensor dy = flatten_leading(grad_output);
  at::Tensor dx = at::empty(with_last_dim(grad_output, weight.size(1)), grad_output.options());
  at::Tensor dx2d = dx.view({dy.size(0), weight.size(1)});
  at::mm_out(dx2d, dy, weight);
  return dx;
}

at::Tensor linear_wgrad_cpu(const at::Tensor& grad_output, const at::Tensor& input) {
  check_linear_wgrad_args(grad_output, input);
  return at::mm(flatten_leading(grad_output).t(), flatten_leading(input));
}

void linear_wgrad_accumulate_cpu(const at::Tensor& grad_weight, const at::Tensor& grad_output,
                                 const at::Tensor& input) {
  check_linear_wgrad_accumulate_args(grad_weight, grad_output, input);
  const auto acc_dtype = grad_weight.scalar_type();
  // Upcast the operands when accumulating 16-bit products into a float32 gradient, so that the
  // products are formed and summed in float32, as the CUDA kernel does with beta = 1.
  at::Tensor dy = flatten_leading(grad_output).to(acc_dtype);
  at::Tensor x = flatten_leading(input).to(acc_dtype);
  auto& gw = const_cast<at::Tensor&>(grad_weight);
  if (gw.is_alias_of(dy) || gw.is_alias_of(x)) {
    // One storage whose overlap the checks could not decide (non-dense views): as on CUDA, the
    // product is formed in a buffer of its own before it is added.
    gw.add_(at::mm(dy.t(), x));
  } else {
    gw.addmm_(dy.t(), x);
  }
}

at::Tensor bias_grad_cpu(const at::Tensor& grad_output) {
  check_bias_grad_args(grad_output);
  return flatten_leading(grad_output).sum(0);
}

at::Tensor mm_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_mm_args("mm", a, b);
  return at::mm(a, b);
}

void mm_out_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  check_mm_args("mm.out", a, b);
  check_mm_out_arg(a, b, out);
  // Compute first, then resize and copy: `out` is untouched if anything above fails, `out` may
  // alias an input, and a non-contiguous `out` receives the result by copy-back. (The warning
  // torch gives when resizing a non-empty `out` is raised by the Python wrapper.)
  at::Tensor result = at::mm(a, b);
  if (out.sizes() != result.sizes()) out.resize_(result.sizes());
  out.copy_(result);
}

at::Tensor add2_cpu(const at::Tensor& a, const at::Tensor& b) {
  check_add2_args(a, b);
  return at::add(a, b);
}

// The product in the statistics dtype (the factor's), rounded once to x's dtype, as on CUDA;
// a factor of 1 leaves x untouched, as on CUDA (bitwise: a NaN's payload is kept too).
void scale_cpu(const at::Tensor& x, const at::Tensor& factor) {
  check_scale_args(x, factor);
  if (factor.item<double>() == 1.0) return;
  if (x.scalar_type() == factor.scalar_type()) {
    x.mul_(factor);
  } else {
    x.copy_(x.to(factor.scalar_type()).mul_(factor));
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CPU, m) {
  m.impl("linear", &linear_cpu);
  m.impl("linear_dgrad", &linear_dgrad_cpu);
  m.impl("linear_wgrad", &linear_wgrad_cpu);
  m.impl("linear_wgrad_accumulate_", &linear_wgrad_accumulate_cpu);
  m.impl("bias_grad", &bias_grad_cpu);
  m.impl("mm", &mm_cpu);
  m.impl("mm.out", &mm_out_cpu);
  m.impl("add2", &add2_cpu);
  m.impl("scale_", &scale_cpu);
}

}  // namespace cutlass_nn
