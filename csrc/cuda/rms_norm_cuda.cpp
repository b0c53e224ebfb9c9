// CUDA implementations of rms_norm, add_rms_norm and rms_norm_backward (kernels:
// csrc/kernels/rms_norm.cu; checks and messages: the CPU backend's, csrc/op_checks.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../op_checks.h"
#include "../tensor_shapes.h"
#include "device_info.h"
#include "elementwise.h"
#include "empty_output.h"
#include "kernel_dtype.h"
#include "launch_check.h"
#include "rms_norm.h"

namespace cutlass_nn {
namespace cuda {
namespace {


at::Tensor leading_shape_empty(const at::Tensor& t, c10::ScalarType dtype) {
  return empty_output(t.sizes().slice(0, t.dim() - 1), t.options().dtype(dtype));
}

// (out, h, rstd); h is undefined without a residual. The kernels read flat contiguous rows:
// strided inputs are copied first (`*_c` keep the copies alive until the launch is enqueued).
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const char* op, const at::Tensor& input,
                                                       const at::Tensor* residual,
                                                       const at::Tensor& weight, double eps) {
  // add_rms_norm's schema names its activations "x" (cutlass_nn.add_rms_norm(x, residual, ...))
  check_rms_norm_args(op, residual != nullptr ? "x" : "input", input, residual, weight, eps);
  c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor input_c = input.contiguous();
  const at::Tensor residual_c = residual != nullptr ? residual->contiguous() : at::Tensor();
  const at::Tensor weight_c = weight.contiguous();
  const auto contiguous = input.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor out = empty_output(input.sizes(), contiguous);
  at::Tensor h = residual != nullptr ? empty_output(input.sizes(), contiguous) : at::Tensor();
  at::Tensor rstd = leading_shape_empty(input, rms_norm_stat_dtype(input.scalar_type()));
  const int64_t cols = input.size(-1);
  const int64_t rows = rstd.numel();  // the product of the leading dims
  const int device = input.get_device();
  check_launch(op,
               kernels::launch_rms_norm_forward(
                   kernel_dtype(input.scalar_type()), kernel_dtype(weight.scalar_type()),
                   input_c.const_data_ptr(),
                   residual != nullptr ? residual_c.const_data_ptr() : nullptr,
                   weight_c.const_data_ptr(), rows, cols, eps, out.data_ptr(),
                   residual != nullptr ? h.data_ptr() : nullptr, rstd.data_ptr(),
                   device_info(device).multiprocessors,
                   c10::cuda::getCurrentCUDAStream(device).stream()),
               input);
  return {out, h, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_cuda(const at::Tensor& input,
                                                 const at::Tensor& weight, double eps) {
  auto [out, h, rstd] = forward("rms_norm", input, nullptr, weight, eps);
  return {out, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_cuda(const at::Tensor& input,
                                                                 const at::Tensor& residual,
                                                                 const at::Tensor& weight,
                                                                 double eps) {
  return forward("add_rms_norm", input, &residual, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cuda(const at::Tensor& grad_output,
                                                          const std::optional<at::Tensor>& grad_h,
                                                          const at::Tensor& h,
                                                          const at::Tensor& weight,
                                                          const at::Tensor& rstd,
                                                          bool weight_grad) {
  const char* op = "rms_norm_backward";
  check_rms_norm_backward_args(grad_output, grad_h, h, weight, rstd);
  c10::cuda::CUDAGuard guard(h.device());
  const bool has_grad_h = grad_h.has_value() && grad_h->defined();
  const at::Tensor grad_output_c = grad_output.contiguous();
  const at::Tensor grad_h_c = has_grad_h ? grad_h->contiguous() : at::Tensor();
  const at::Tensor h_c = h.contiguous();
  const at::Tensor weight_c = weight.contiguous();
  const at::Tensor rstd_c = rstd.contiguous();
  at::Tensor grad_input =
      empty_output(h.sizes(), h.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t cols = h.size(-1);
  const int64_t rows = rstd.numel();
  const int device = h.get_device();
  const int multiprocessors = device_info(device).multiprocessors;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  const kernels::DType dtype = kernel_dtype(h.scalar_type());
  const auto stat = rms_norm_stat_dtype(h.scalar_type());

  at::Tensor partials;
  const int64_t partial_rows =
      weight_grad ? kernels::rms_norm_backward_partial_rows(dtype, rows, cols, multiprocessors)
                  : 0;
  if (partial_rows > 0) partials = empty_output({partial_rows, cols}, h.options().dtype(stat));
  check_launch(op,
               kernels::launch_rms_norm_backward(
                   dtype, kernel_dtype(weight.scalar_type()), grad_output_c.const_data_ptr(),
                   has_grad_h ? grad_h_c.const_data_ptr() : nullptr, h_c.const_data_ptr(),
                   weight_c.const_data_ptr(), rstd_c.const_data_ptr(), rows, cols,
                   grad_input.data_ptr(), partial_rows > 0 ? partials.data_ptr() : nullptr,
                   multiprocessors, stream),
               h);
  if (!weight_grad) return {grad_input, empty_output({0}, weight.options())};
  if (partial_rows == 0) return {grad_input, at::zeros({cols}, weight.options())};
  // The weight gradient: the column sums of the per-block partials (fixed order), in the
  // statistics dtype, then rounded once to weight's dtype.
  at::Tensor grad_weight = empty_output({cols}, h.options().dtype(stat));
  const kernels::DType stat_dtype = kernel_dtype(stat);
  check_launch(op,
               kernels::launch_column_sum(stat_dtype, partials.const_data_ptr(), partial_rows,
                                          cols, cols, stat_dtype, grad_weight.data_ptr(),
                                          multiprocessors, stream),
               h);
  if (weight.scalar_type() != stat) grad_weight = grad_weight.to(weight.scalar_type());
  return {grad_input, grad_weight};
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("add_rms_norm", &add_rms_norm_cuda);
  m.impl("rms_norm_backward", &rms_norm_backward_cuda);
}

}  // namespace cuda
}  // namespace cutlass_nn
