// Torch-free interface of the cutlass_nn elementwise / reduction kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm_params.h"  // DType

namespace cutlass_nn {
namespace kernels {

// out[i] = a[i] + b[i] for 0 <= i < numel. All three buffers are contiguous and of `dtype`.
// 16-byte vectorized loads/stores where the three pointers allow it (one pack per thread), a
// scalar grid-stride loop sized from `multiprocessors` otherwise. Returns the launch status.
cudaError_t launch_add2(DType dtype, const void* a, const void* b, void* out, int64_t numel,
                        int multiprocessors, cudaStream_t stream);

// x[i] = x[i] * factor[0] for 0 <= i < numel, in place: x contiguous of `dtype`, factor one value
// in device memory (float; double for kFloat64), the product formed in that type and rounded
// once. The factor is read on the device, so a caller that does not know its value needs no
// host synchronization; when it is exactly 1 every block returns after reading it (x * 1 == x
// bitwise, NaN included), so the common "gradient times 1" costs a launch, not a pass over x.
cudaError_t launch_scale_inplace(DType dtype, void* x, const void* factor, int64_t numel,
                                 int multiprocessors, cudaStream_t stream);

// out[j] = sum_{i < rows} x[i * ld + j] for 0 <= j < cols (the column sum of a RowMajor matrix:
// the bias gradient of a linear layer). Accumulates in float (double for kFloat64 input) and
// writes `out_dtype` (x's dtype, or kFloat32 for 16-bit x). rows == 0 writes zeros.
cudaError_t launch_column_sum(DType dtype, const void* x, int64_t rows, int64_t cols, int64_t ld,
                              DType out_dtype, void* out, int multiprocessors,
                              cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
