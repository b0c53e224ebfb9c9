// empty_output: the allocation of every output and workspace of the CUDA operators.
//
// at::empty goes through the dispatcher (a full dispatch per tensor, seen as aten::empty in a
// profile); the CUDA operators know their device and dtype, so they take memory from the caching
// allocator directly, as ATen's own CUDA kernels allocate their outputs. Stream-ordered reuse and
// CUDA-graph private pools behave as with at::empty.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/cuda/EmptyTensor.h>

namespace cutlass_nn {
namespace cuda {

// A new uninitialized CUDA tensor of `sizes` with `options` (dtype, device, memory format).
inline at::Tensor empty_output(c10::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::Tensor(at::detail::empty_cuda(sizes, options));
}

}  // namespace cuda
}  // namespace cutlass_nn
