// Shape helpers shared by the CPU and CUDA implementations of the linear operators.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace cutlass_nn {

// [*, features] -> [prod(*), features]; a view where possible. The row count is spelled out
// (not -1) so that a zero-size feature dimension still flattens.
inline at::Tensor flatten_leading(const at::Tensor& t) {
  const int64_t features = t.size(-1);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return t.reshape({rows, features});
}

// The sizes of `t` with the last dimension replaced by `last`: [*, in] -> [*, last].
inline std::vector<int64_t> with_last_dim(const at::Tensor& t, int64_t last) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes.back() = last;
  return sizes;
}

}  // namespace cutlass_nn
