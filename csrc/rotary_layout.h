// The output layout of rotary_embedding / rotary_embedding_backward, shared by the CPU and CUDA
// implementations (and spelled the same way by the fake in cutlass_nn/ops.py): each output takes
// the strides of the tensor it is computed from when that one is dense with a unit-stride last
// dim (a projection's output viewed as [batch, heads, seq, head_dim] keeps its [batch, seq,
// heads, head_dim] memory order, so the views around the operator stay free), else contiguous.
#pragma once

#include <ATen/core/Tensor.h>

namespace cutlass_nn {

inline bool rotary_keeps_layout(const at::Tensor& x) {
  return x.numel() > 0 && x.stride(-1) == 1 && x.is_non_overlapping_and_dense();
}

}  // namespace cutlass_nn
