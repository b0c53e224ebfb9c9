// CUDA implementations of rotary_embedding and rotary_embedding_backward (kernel:
// csrc/kernels/rotary.cu; checks and messages: the CPU backend's, csrc/op_checks.cpp; output
// layout: csrc/rotary_layout.h). Strided inputs are read where they lie (only a last dim of
// non-unit stride is copied first), so the [batch, heads, seq, head_dim] views of a projection's
// output cost no copy.
#include <ATen/ATen.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <tuple>

#include "../op_checks.h"
#include "../rotary_layout.h"
#include "device_info.h"
#include "empty_output.h"
#include "kernel_dtype.h"
#include "launch_check.h"
#include "rotary.h"

namespace cutlass_nn {
namespace cuda {
namespace {

at::Tensor unit_last_stride(const at::Tensor& t) {
  return t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

at::Tensor output_for(const at::Tensor& x) {
  if (rotary_keeps_layout(x)) {
    return at::Tensor(at::detail::empty_strided_cuda(x.sizes(), x.strides(), x.options()));
  }
  return empty_output(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

kernels::RotaryOperand operand(const at::Tensor& in, const at::Tensor& out) {
  kernels::RotaryOperand op;
  op.in = in.const_data_ptr();
  op.out = out.data_ptr();
  op.heads = in.size(1);
  for (int dim = 0; dim < 3; ++dim) {  // batch, head, sequence
    op.in_stride[dim] = in.stride(dim);
    op.out_stride[dim] = out.stride(dim);
  }
  return op;
}

kernels::RotaryTable table(const at::Tensor& t) {
  kernels::RotaryTable tab;
  tab.data = t.const_data_ptr();
  tab.stride[0] = t.size(0) == 1 ? 0 : t.stride(0);
  tab.stride[1] = t.stride(1);
  return tab;
}

std::tuple<at::Tensor, at::Tensor> rotary_cuda(const char* op, const at::Tensor& q,
                                               const at::Tensor& k, const at::Tensor& cos,
                                               const at::Tensor& sin, bool backward) {
  c10::cuda::CUDAGuard guard(q.device());
  at::Tensor q_out = output_for(q);
  at::Tensor k_out = output_for(k);
  const at::Tensor q_in = unit_last_stride(q);
  const at::Tensor k_in = unit_last_stride(k);
  const at::Tensor cos_in = unit_last_stride(cos);
  const at::Tensor sin_in = unit_last_stride(sin);
  const int device = q.get_device();
  check_launch(op,
               kernels::launch_rotary(kernel_dtype(q.scalar_type()), backward,
                                      operand(q_in, q_out), operand(k_in, k_out), table(cos_in),
                                      table(sin_in), q.size(0), q.size(2), q.size(3),
                                      device_info(device).multiprocessors,
                                      c10::cuda::getCurrentCUDAStream(device).stream()),
               q);
  return {q_out, k_out};
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_cuda(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos,
                                                         const at::Tensor& sin) {
  check_rotary_args("rotary_embedding", "q", "k", q, k, cos, sin);
  return rotary_cuda("rotary_embedding", q, k, cos, sin, false);
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding_backward_cuda(const at::Tensor& grad_q,
                                                                  const at::Tensor& grad_k,
                                                                  const at::Tensor& cos,
                                                                  const at::Tensor& sin) {
  check_rotary_args("rotary_embedding_backward", "grad_q", "grad_k", grad_q, grad_k, cos, sin);
  return rotary_cuda("rotary_embedding_backward", grad_q, grad_k, cos, sin, true);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  m.impl("rotary_embedding", &rotary_embedding_cuda);
  m.impl("rotary_embedding_backward", &rotary_embedding_backward_cuda);
}

}  // namespace cuda
}  // namespace cutlass_nn
