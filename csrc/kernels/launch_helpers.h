// Host-side launch helpers shared by the torch-free elementwise kernels (elementwise.cu,
// activation.cu, rms_norm.cu): the SM count a grid is sized from, and the 16-byte alignment test
// that picks vectorized accesses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cutlass_nn {
namespace kernels {

// The bindings pass their cached count; <= 0 asks the current device.
inline int resolve_multiprocessors(int multiprocessors) {
  if (multiprocessors > 0) return multiprocessors;
  int device = 0, count = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      count > 0) {
    return count;
  }
  (void)cudaGetLastError();  // do not leave a sticky-looking error for the launch check
  return 132;                // H100 SXM
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace kernels
}  // namespace cutlass_nn
