// CUDA implementations of the cutlass_nn operators.
//
// Each one validates with the shared checks (the same messages as the CPU backend), shapes the
// problem as GEMMs in nn.Linear's natural layouts -- forward y = x W^T reads W as a column-major
// [K, N] operand, dgrad dX = dY W reads both row-major, wgrad dW = dY^T X reads dY as a
// column-major [N, M] operand -- so no transposed copies are made, and launches on the current
// stream of the inputs' device (see gemm_binding.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "../op_checks.h"
#include "../tensor_shapes.h"
#include "../validation.h"
#include "activation_cuda.h"
#include "device_info.h"
#include "empty_output.h"
#include "elementwise.h"
#include "gemm_binding.h"
#include "kernel_dtype.h"
#include "launch_check.h"

namespace cutlass_nn {
namespace cuda {
namespace {


// The outputs are allocated in their final [*, features] shape and the 2-D GEMM writes through a
// view of them, so the returned tensor is not itself a view (in-place ops on it must work).
at::Tensor linear_cuda(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias) {
  check_linear_args(input, weight, bias);
  const at::Tensor x = flatten_leading(input);
  at::Tensor y = empty_output(with_last_dim(input, weight.size(0)), input.options());
  gemm("linear", x, weight.t(), y.view({x.size(0), weight.size(0)}), bias, /*accumulate=*/false);
  return y;
}

// out = act(x W^T + b) and, with want_preact, also z = x W^T + b. One GEMM with the bias and the
// activation in its epilogue where a kernel fuses them (SM90, 16-bit, 16-byte aligned operands);
// otherwise the GEMM with the bias fused, then one elementwise pass for the activation (which
// then reads z rounded to the tensor dtype: for 16-bit outputs act(round(z)) instead of the
// fused epilogue's act(z), a difference within one rounding of the output).
std::tuple<at::Tensor, at::Tensor> linear_act_impl(const char* op, const at::Tensor& input,
                                                   const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias,
                                                   c10::string_view activation,
                                                   bool want_preact) {
  check_linear_args(op, input, weight, bias);
  const kernels::Activation act = parse_activation(op, activation);
  const at::Tensor x = flatten_leading(input);
  const int64_t rows = x.size(0), n = weight.size(0);
  const auto shape = with_last_dim(input, n);
  at::Tensor out = empty_output(shape, input.options());
  at::Tensor preact = want_preact ? empty_output(shape, input.options()) : at::Tensor();
  if (act != kernels::Activation::kIdentity) {
    at::Tensor preact2d = want_preact ? preact.view({rows, n}) : at::Tensor();
    if (gemm_fused_activation(op, x, weight.t(), out.view({rows, n}), bias, act,
                              want_preact ? &preact2d : nullptr)) {
      return {out, preact};
    }
    if (want_preact) {
      gemm(op, x, weight.t(), preact.view({rows, n}), bias, /*accumulate=*/false);
      apply_activation_cuda_out(op, preact, out, act);
      return {out, preact};
    }
    gemm(op, x, weight.t(), out.view({rows, n}), bias, /*accumulate=*/false);
    apply_activation_cuda_(op, out, act);
    return {out, preact};
  }
  gemm(op, x, weight.t(), out.view({rows, n}), bias, /*accumulate=*/false);
  if (want_preact) preact.copy_(out);
  return {out, preact};
}

at::Tensor linear_act_cuda(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias, c10::string_view activation) {
  return std::get<0>(linear_act_impl("linear_act", input, weight, bias, activation, false));
}

std::tuple<at::Tensor, at::Tensor> linear_act_aux_cuda(const at::Tensor& input,
                                                       const at::Tensor& weight,
                                                       const std::optional<at::Tensor>& bias,
                                                       c10::string_view activation) {
  return linear_act_impl("linear_act_aux", input, weight, bias, activation, true);
}

at::Tensor linear_dgrad_cuda(const at::Tensor& grad_output, const at::Tensor& weight) {
  check_linear_dgrad_args(grad_output, weight);
  const at::Tensor dy = flatten_leading(grad_output);
  at::Tensor dx = empty_output(with_last_dim(grad_output, weight.size(1)), grad_output.options());
  gemm("linear_dgrad", dy, weight, dx.view({dy.size(0), weight.size(1)}), std::nullopt,
       /*accumulate=*/false);
  return dx;
}

at::Tensor linear_wgrad_cuda(const at::Tensor& grad_output, const at::Tensor& input) {
  check_linear_wgrad_args(grad_output, input);
  const at::Tensor dy = flatten_leading(grad_output);
  const at::Tensor x = flatten_leading(input);
  at::Tensor dw = empty_row_major(grad_output, dy.size(1), x.size(1));
  gemm("linear_wgrad", dy.t(), x, dw, std::nullopt, /*accumulate=*/false);
  return dw;
}

void linear_wgrad_accumulate_cuda(const at::Tensor& grad_weight, const at::Tensor& grad_output,
                                  const at::Tensor& input) {
  check_linear_wgrad_accumulate_args(grad_weight, grad_output, input);
  const at::Tensor dy = flatten_leading(grad_output);
  const at::Tensor x = flatten_leading(input);
  const bool overlaps = grad_weight.is_alias_of(grad_output) || grad_weight.is_alias_of(input);
  if (is_row_major_output(grad_weight) && !overlaps) {
    // beta = 1 with C == D: the kernel adds its fp32 accumulators to the existing gradient.
    gemm("linear_wgrad_accumulate_", dy.t(), x, grad_weight, std::nullopt, /*accumulate=*/true);
  } else {
    at::Tensor partial = empty_output(grad_weight.sizes(), grad_weight.options());
    gemm("linear_wgrad_accumulate_", dy.t(), x, partial, std::nullopt, /*accumulate=*/false);
    const_cast<at::Tensor&>(grad_weight).add_(partial);
  }
}

at::Tensor bias_grad_cuda(const at::Tensor& grad_output) {
  check_bias_grad_args(grad_output);
  c10::cuda::CUDAGuard guard(grad_output.device());
  at::Tensor dy = flatten_leading(grad_output);
  if (!is_row_major_output(dy)) dy = dy.contiguous();
  const int64_t rows = dy.size(0), cols = dy.size(1);
  at::Tensor out = empty_output({cols}, grad_output.options());
  const kernels::DType dtype = kernel_dtype(dy.scalar_type());
  const int64_t ld = rows > 1 ? dy.stride(0) : cols;
  check_launch("bias_grad",
               kernels::launch_column_sum(
                   dtype, dy.data_ptr(), rows, cols, ld, dtype, out.data_ptr(),
                   device_info(dy.get_device()).multiprocessors,
                   c10::cuda::getCurrentCUDAStream(dy.get_device()).stream()),
               grad_output);
  return out;
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_mm_args("mm", a, b);
  at::Tensor out = empty_row_major(a, a.size(0), b.size(1));
  gemm("mm", a, b, out, std::nullopt, /*accumulate=*/false);
  return out;
}

void mm_out_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  check_mm_args("mm.out", a, b);
  check_mm_out_arg(a, b, out);
  const bool right_shape = out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(1);
  const bool overlaps = out.is_alias_of(a) || out.is_alias_of(b);
  if (right_shape && is_row_major_output(out) && !overlaps) {
    gemm("mm.out", a, b, out, std::nullopt, /*accumulate=*/false);
    return;
  }
  // Like torch.mm(out=): compute, then resize `out` and copy back, which also serves
  // non-contiguous and aliasing `out` tensors.
  at::Tensor result = mm_cuda(a, b);
  if (out.sizes() != result.sizes()) out.resize_(result.sizes());
  out.copy_(result);
}

at::Tensor add2_cuda(const at::Tensor& a, const at::Tensor& b) {
  check_add2_args(a, b);
  c10::cuda::CUDAGuard guard(a.device());
  // The kernel reads flat contiguous buffers; `ac` / `bc` hold copies of strided inputs until the
  // launch is enqueued.
  const at::Tensor ac = a.contiguous();
  const at::Tensor bc = b.contiguous();
  at::Tensor out = empty_output(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
  check_launch("add2",
               kernels::launch_add2(kernel_dtype(a.scalar_type()), ac.data_ptr(),
                                    bc.data_ptr(), out.data_ptr(), a.numel(),
                                    device_info(a.get_device()).multiprocessors,
                                    c10::cuda::getCurrentCUDAStream(a.get_device()).stream()),
               a);
  return out;
}

// x *= factor in place; the kernel reads the factor on the device (no host synchronization) and
// skips the pass when it is 1.
void scale_cuda(const at::Tensor& x, const at::Tensor& factor) {
  check_scale_args(x, factor);
  c10::cuda::CUDAGuard guard(x.device());
  check_launch("scale_",
               kernels::launch_scale_inplace(kernel_dtype(x.scalar_type()), x.data_ptr(),
                                             factor.const_data_ptr(), x.numel(),
                                             device_info(x.get_device()).multiprocessors,
                                             c10::cuda::getCurrentCUDAStream(x.get_device()).stream()),
               x);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  m.impl("linear", &linear_cuda);
  m.impl("linear_act", &linear_act_cuda);
  m.impl("linear_act_aux", &linear_act_aux_cuda);
  m.impl("linear_dgrad", &linear_dgrad_cuda);
  m.impl("linear_wgrad", &linear_wgrad_cuda);
  m.impl("linear_wgrad_accumulate_", &linear_wgrad_accumulate_cuda);
  m.impl("bias_grad", &bias_grad_cuda);
  m.impl("mm", &mm_cuda);
  m.impl("mm.out", &mm_out_cuda);
  m.impl("add2", &add2_cuda);
  m.impl("scale_", &scale_cuda);
}

}  // namespace cuda
}  // namespace cutlass_nn
