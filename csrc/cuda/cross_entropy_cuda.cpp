// CUDA implementation of cross_entropy_rows_ (kernel: csrc/kernels/cross_entropy.cu; checks and
// messages: the CPU backend's, csrc/op_checks.cpp).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../op_checks.h"
#include "cross_entropy.h"
#include "device_info.h"
#include "empty_output.h"
#include "kernel_dtype.h"
#include "launch_check.h"

namespace cutlass_nn {
namespace cuda {
namespace {

std::tuple<at::Tensor, at::Tensor> cross_entropy_rows_cuda(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& row_scale,
    int64_t ignore_index, double label_smoothing, bool write_grad) {
  const char* op = "cross_entropy_rows_";
  check_cross_entropy_rows_args(logits, target, row_scale, label_smoothing, write_grad);
  c10::cuda::CUDAGuard guard(logits.device());
  const bool has_scale = row_scale.has_value() && row_scale->defined();
  const at::Tensor target_c = target.contiguous();
  const at::Tensor scale_c = has_scale ? row_scale->contiguous() : at::Tensor();
  const auto stat = logits.options().dtype(rms_norm_stat_dtype(logits.scalar_type()));
  at::Tensor loss = empty_output({logits.size(0)}, stat);
  at::Tensor lse = empty_output({logits.size(0)}, stat);
  const int device = logits.get_device();
  check_launch(op,
               kernels::launch_cross_entropy_rows(
                   kernel_dtype(logits.scalar_type()), logits.data_ptr(),
                   target_c.const_data_ptr<int64_t>(),
                   has_scale ? scale_c.const_data_ptr() : nullptr, logits.size(0), logits.size(1),
                   ignore_index, label_smoothing, write_grad, loss.data_ptr(), lse.data_ptr(),
                   device_info(device).multiprocessors,
                   c10::cuda::getCurrentCUDAStream(device).stream()),
               logits);
  return {loss, lse};
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  m.impl("cross_entropy_rows_", &cross_entropy_rows_cuda);
}

}  // namespace cuda
}  // namespace cutlass_nn
