// kernel_dtype: the torch-free kernels' DType of a torch dtype, shared by every CUDA binding.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "../validation.h"  // dtype_name
#include "gemm_params.h"    // DType

namespace cutlass_nn {
namespace cuda {

// The argument checks admit only the four floating dtypes; anything else here is a bug.
inline kernels::DType kernel_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kHalf: return kernels::DType::kFloat16;
    case c10::kBFloat16: return kernels::DType::kBFloat16;
    case c10::kFloat: return kernels::DType::kFloat32;
    case c10::kDouble: return kernels::DType::kFloat64;
    default:
      TORCH_CHECK(false, "cutlass_nn: internal error: no kernel dtype for ", dtype_name(dtype));
  }
}

}  // namespace cuda
}  // namespace cutlass_nn
