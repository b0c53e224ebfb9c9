// What the torch-free timing drivers (gated_act_timing.cu, gemm_variant_timing.cu) share: a
// CUDA-call check that exits with the call's text, and a fill of bfloat16 buffers with a hashed
// pseudo-random pattern (deterministic per seed, uniform in [-scale / 2, scale / 2]).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(call)                                                        \
  do {                                                                          \
    const cudaError_t err_ = (call);                                            \
    if (err_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

namespace cutlass_nn {
namespace timing {

static __global__ void fill_bf16_kernel(__nv_bfloat16* p, int64_t count, unsigned seed,
                                        float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16((static_cast<float>(h & 0xffff) / 65535.0f - 0.5f) * scale);
  }
}

// Launches the fill on the default stream (the caller synchronizes).
static void fill_bf16(__nv_bfloat16* p, int64_t count, unsigned seed, float scale) {
  fill_bf16_kernel<<<1024, 256>>>(p, count, seed, scale);
  CHECK_CUDA(cudaGetLastError());
}

}  // namespace timing
}  // namespace cutlass_nn
