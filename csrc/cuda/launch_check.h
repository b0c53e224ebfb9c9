// check_launch: the error check after a torch-free kernel launch (csrc/kernels/*.cu return the
// cudaError_t of cudaGetLastError()), shared by the CUDA bindings (ops_cuda.cpp,
// activation_cuda.cpp) so that every operator reports a failed launch with the same message:
// "cutlass_nn.<op>: kernel launch failed on <device> for shape [...]: <CUDA error string>".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

#include "../validation.h"  // shape_string

namespace cutlass_nn {
namespace cuda {

// Raises (TORCH_CHECK) when `err` is not cudaSuccess, naming the operator `op` and the device and
// shape of the tensor `t` the kernel worked on.
inline void check_launch(const char* op, cudaError_t err, const at::Tensor& t) {
  TORCH_CHECK(err == cudaSuccess, "cutlass_nn.", op, ": kernel launch failed on ", t.device().str(),
              " for shape ", shape_string(t.sizes()), ": ", cudaGetErrorString(err));
}

}  // namespace cuda
}  // namespace cutlass_nn
