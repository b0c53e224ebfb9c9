// CUDA implementations of gated_act and gated_act_backward (kernels: csrc/kernels/gated_act.cu;
// checks and messages: the CPU backend's, csrc/op_checks.cpp), and gated_mlp's CUDA registration
// (the composite of csrc/gated_mlp.h, whose GEMMs and gated activation land on the CUDA kernels).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "../gated_mlp.h"
#include "../op_checks.h"
#include "device_info.h"
#include "empty_output.h"
#include "gated_act.h"
#include "kernel_dtype.h"
#include "launch_check.h"

namespace cutlass_nn {
namespace cuda {
namespace {

std::vector<int64_t> halved_last(const at::Tensor& gate_up) {
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() /= 2;
  return shape;
}

at::Tensor gated_act_cuda(const at::Tensor& gate_up, c10::string_view activation) {
  const char* op = "gated_act";
  check_gate_up_arg(op, gate_up);
  const kernels::Activation act = parse_gated_activation(op, activation);
  c10::cuda::CUDAGuard guard(gate_up.device());
  const at::Tensor gate_up_c = gate_up.contiguous();  // the kernel reads flat rows
  at::Tensor out = empty_output(halved_last(gate_up), gate_up.options());
  const int64_t n = out.size(-1);
  const int64_t rows = n == 0 ? 0 : out.numel() / n;
  const int device = gate_up.get_device();
  check_launch(op,
               kernels::launch_gated_act_forward(
                   kernel_dtype(gate_up.scalar_type()), act, gate_up_c.const_data_ptr(),
                   out.data_ptr(), rows, n, device_info(device).multiprocessors,
                   c10::cuda::getCurrentCUDAStream(device).stream()),
               gate_up);
  return out;
}

std::tuple<at::Tensor, at::Tensor> gated_act_backward_cuda(const at::Tensor& grad_output,
                                                           const at::Tensor& gate_up,
                                                           c10::string_view activation) {
  const char* op = "gated_act_backward";
  check_gated_act_backward_args(grad_output, gate_up);
  const kernels::Activation act = parse_gated_activation(op, activation);
  c10::cuda::CUDAGuard guard(gate_up.device());
  const at::Tensor grad_output_c = grad_output.contiguous();
  const at::Tensor gate_up_c = gate_up.contiguous();
  at::Tensor grad_gate_up = empty_output(gate_up.sizes(), gate_up.options().memory_format(
                                                              at::MemoryFormat::Contiguous));
  at::Tensor out = empty_output(halved_last(gate_up), gate_up.options());
  const int64_t n = out.size(-1);
  const int64_t rows = n == 0 ? 0 : out.numel() / n;
  const int device = gate_up.get_device();
  check_launch(op,
               kernels::launch_gated_act_backward(
                   kernel_dtype(gate_up.scalar_type()), act, grad_output_c.const_data_ptr(),
                   gate_up_c.const_data_ptr(), grad_gate_up.data_ptr(), out.data_ptr(), rows, n,
                   device_info(device).multiprocessors,
                   c10::cuda::getCurrentCUDAStream(device).stream()),
               gate_up);
  return {grad_gate_up, out};
}

at::Tensor gated_act_backward_inplace_cuda(const at::Tensor& grad_output, const at::Tensor& gate_up,
                                          c10::string_view activation) {
  const char* op = "gated_act_backward_";
  check_gated_act_backward_args(grad_output, gate_up, op);
  check_gate_up_writable(op, gate_up, grad_output);
  const kernels::Activation act = parse_gated_activation(op, activation);
  c10::cuda::CUDAGuard guard(gate_up.device());
  const at::Tensor grad_output_c = grad_output.contiguous();
  at::Tensor out = empty_output(halved_last(gate_up), gate_up.options());
  const int64_t n = out.size(-1);
  const int64_t rows = n == 0 ? 0 : out.numel() / n;
  const int device = gate_up.get_device();
  check_launch(op,
               kernels::launch_gated_act_backward(
                   kernel_dtype(gate_up.scalar_type()), act, grad_output_c.const_data_ptr(),
                   gate_up.const_data_ptr(), gate_up.data_ptr(), out.data_ptr(), rows, n,
                   device_info(device).multiprocessors,
                   c10::cuda::getCurrentCUDAStream(device).stream()),
               gate_up);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  m.impl("gated_act", &gated_act_cuda);
  m.impl("gated_act_backward", &gated_act_backward_cuda);
  m.impl("gated_act_backward_", &gated_act_backward_inplace_cuda);
  m.impl("gated_mlp", &gated_mlp_composite);
  m.impl("_gate_up_linear", &gate_up_linear_kernel);
  m.impl("_gate_up_dgrad", &gate_up_dgrad_kernel);
  m.impl("_pack_gate_up", &pack_gate_up_kernel);
}

}  // namespace cuda
}  // namespace cutlass_nn
