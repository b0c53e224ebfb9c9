// CUDA implementation of activation_grad, and the elementwise activation used by the CUDA
// linear_act / linear_act_aux (ops_cuda.cpp) where the GEMM epilogue does not fuse it. The
// kernels are csrc/kernels/activation.cu; the checks and messages are the CPU backend's
// (csrc/op_checks.cpp).
#include "activation_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <tuple>

#include "../op_checks.h"
#include "../validation.h"
#include "activation.h"
#include "device_info.h"
#include "empty_output.h"
#include "kernel_dtype.h"
#include "launch_check.h"

namespace cutlass_nn {
namespace cuda {
namespace {


void launch_forward(const char* op, const at::Tensor& z, const at::Tensor& out,
                    kernels::Activation act) {
  const int device = z.get_device();
  check_launch(op,
               kernels::launch_activation_forward(
                   kernel_dtype(z.scalar_type()), act, z.const_data_ptr(), out.data_ptr(),
                   z.numel(), device_info(device).multiprocessors,
                   c10::cuda::getCurrentCUDAStream(device).stream()),
               z);
}

std::tuple<at::Tensor, at::Tensor> activation_grad_cuda(const at::Tensor& grad_output,
                                                        const at::Tensor& preact,
                                                        c10::string_view activation,
                                                        bool bias_grad) {
  const char* op = "activation_grad";
  check_activation_grad_args(grad_output, preact);
  const kernels::Activation act = parse_activation(op, activation);
  c10::cuda::CUDAGuard guard(preact.device());
  const int device = preact.get_device();

  // The kernels read flat row-major buffers; `g` / `z` hold copies of strided inputs until the
  // launches are enqueued.
  const at::Tensor g = grad_output.contiguous();
  const at::Tensor z = preact.contiguous();
  const int64_t cols = preact.size(-1);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < preact.dim(); ++d) rows *= preact.size(d);

  at::Tensor grad_z =
      empty_output(preact.sizes(), preact.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor grad_bias = empty_output({bias_grad ? cols : 0}, preact.options());
  const kernels::DType dtype = kernel_dtype(preact.scalar_type());
  const int multiprocessors = device_info(device).multiprocessors;

  at::Tensor workspace;
  size_t workspace_bytes = 0;
  if (bias_grad) {
    workspace_bytes = kernels::activation_backward_workspace_size(dtype, rows, cols,
                                                                  multiprocessors);
    // The caching allocator's blocks are at least 512-byte aligned (the kernel needs 16).
    workspace = empty_output({static_cast<int64_t>(workspace_bytes)},
                          preact.options().dtype(at::kByte));
  }
  check_launch(op,
               kernels::launch_activation_backward(
                   dtype, act, g.const_data_ptr(), z.const_data_ptr(), grad_z.data_ptr(), rows,
                   cols, bias_grad ? grad_bias.data_ptr() : nullptr,
                   workspace_bytes > 0 ? workspace.data_ptr() : nullptr, workspace_bytes,
                   multiprocessors, c10::cuda::getCurrentCUDAStream(device).stream()),
               preact);
  return {grad_z, grad_bias};
}

}  // namespace

at::Tensor apply_activation_cuda(const char* op, const at::Tensor& preact,
                                 kernels::Activation act) {
  c10::cuda::CUDAGuard guard(preact.device());
  const at::Tensor z = preact.contiguous();
  at::Tensor out =
      empty_output(preact.sizes(), preact.options().memory_format(at::MemoryFormat::Contiguous));
  launch_forward(op, z, out, act);
  return out;
}

void apply_activation_cuda_(const char* op, const at::Tensor& t, kernels::Activation act) {
  TORCH_CHECK(t.is_contiguous(), "cutlass_nn.", op,
              ": internal error: in-place activation of a non-contiguous tensor (strides ",
              shape_string(t.strides()), ")");
  c10::cuda::CUDAGuard guard(t.device());
  launch_forward(op, t, t, act);
}

void apply_activation_cuda_out(const char* op, const at::Tensor& preact, const at::Tensor& out,
                               kernels::Activation act) {
  TORCH_CHECK(out.is_contiguous() && out.sizes() == preact.sizes() &&
                  out.scalar_type() == preact.scalar_type() && out.device() == preact.device(),
              "cutlass_nn.", op, ": internal error: activation output of shape ",
              shape_string(out.sizes()), " does not fit the input of shape ",
              shape_string(preact.sizes()));
  c10::cuda::CUDAGuard guard(preact.device());
  const at::Tensor z = preact.contiguous();
  launch_forward(op, z, out, act);
}

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  m.impl("activation_grad", &activation_grad_cuda);
}

}  // namespace cuda
}  // namespace cutlass_nn
