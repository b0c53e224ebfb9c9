// Test / benchmark hooks of the CUDA FP8 GEMM binding (csrc/cuda/fp8_cuda.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace cutlass_nn {
namespace cuda {

// Force one FP8 tile configuration (kernels::Fp8TileConfig; -1 = the per-shape rule); returns
// the previous setting. Process-wide.
int64_t set_fp8_config(int64_t config);

// Force one rasterization swizzle of the FP8 kernels' tile scheduler (1, 2, 4 or 8; 0 = the
// rule's); returns the previous setting. Process-wide.
int64_t set_fp8_swizzle(int64_t swizzle);

// The FP8 tile configuration names, one per line, in index order.
std::string fp8_config_names();

}  // namespace cuda
}  // namespace cutlass_nn
