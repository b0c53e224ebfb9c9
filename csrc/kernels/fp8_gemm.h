// Torch-free interface of the FP8 GEMM kernels (Hopper, SM90): the three GEMMs of an FP8 linear
// layer, with the dequantization scales applied in the epilogue.
//
//   D[m, n] = a_scale[m] * b_scale[n] * sum_k A[m, k] * B[k, n]  (+ bias[n])
//
// A is [m, k] row-major (k contiguous) in e4m3 or e5m2, B is [k, n] column-major (k contiguous:
// an [n, k] row-major matrix read transposed, as nn.Linear stores its weight) in e4m3; both
// operands K-major is what Hopper's FP8 tensor cores (WGMMA) read from shared memory. The scales
// are float32: one per row of A (a_scale_per_row) or one for all of A, one per column of B
// (b_scale_per_col) or one for all of B. Accumulation in fp32, with the partial sums of the
// tensor cores promoted to separate fp32 registers every 128-deep block of K (WGMMA's FP8
// accumulation keeps fewer bits). D is row-major bf16 or float32; bias has D's dtype.
//
// The binding (csrc/cuda/fp8_cuda.cpp) checks tensors and alignment and calls run_fp8_gemm();
// problems outside what a kernel takes run elsewhere (fp8_gemm_kernel_name() returns "").
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gemm_params.h"  // DType, GemmStatus

namespace cutlass_nn {
namespace kernels {

enum class Fp8Format : int { kE4M3 = 0, kE5M2 = 1 };

struct Fp8GemmParams {
  int64_t m = 0, n = 0, k = 0;

  const void* a = nullptr;  // [m, k], element (i, j) at a[i * lda + j]
  int64_t lda = 0;
  Fp8Format format_a = Fp8Format::kE4M3;

  const void* b = nullptr;  // [k, n], element (i, j) at b[i + j * ldb]
  int64_t ldb = 0;
  Fp8Format format_b = Fp8Format::kE4M3;

  const float* a_scale = nullptr;  // [m] when a_scale_per_row, else [1]
  bool a_scale_per_row = false;
  const float* b_scale = nullptr;  // [n] when b_scale_per_col, else [1]
  bool b_scale_per_col = false;

  const void* bias = nullptr;  // [n] of dtype_d, or nullptr
  void* d = nullptr;           // [m, n], element (i, j) at d[i * ldd + j]
  int64_t ldd = 0;
  DType dtype_d = DType::kBFloat16;

  int sm = 0;               // compute capability of the device, major * 10 + minor
  int multiprocessors = 0;  // number of SMs

  // Fast accumulation allowed: the tensor cores' own FP8 accumulation without promotion to fp32
  // registers (faster, less accurate over a long K), where a kernel for it is compiled (config
  // 2: e4m3 A, bf16 D); elsewhere the promoted kernels run.
  bool fast_accum = false;

  // Tile configuration (Fp8TileConfig<N> of fp8_gemm_sm90.cuh): -1 = the per-shape rule of
  // fp8_gemm_dispatch.cu; N >= 0 forces one (tests, the benchmark's sweep).
  int config = -1;

  // Rasterization swizzle of the persistent tile scheduler (1 = none; 2, 4, 8: that many
  // neighbouring tiles share an operand block in L2): 0 = the rule's (choose_fp8_swizzle);
  // N > 0 forces one (tests, the benchmark's sweep).
  int swizzle = 0;
};

// Number of FP8 tile configurations and the name of one (nullptr past the end). Configs 0, 1, 3
// and 4 accumulate with promotion on CUTLASS's mainloop, 5, 6 and 7 (the tiles of 0, 1 and 3)
// with the same promotion overlapped with the next k-tile's WGMMAs, config 2 without promotion
// (fast accumulation).
constexpr int kFp8ConfigCount = 8;
const char* fp8_config_name(int config);

// The configuration the per-shape rule picks (ignores params.config; honours fast_accum).
int choose_fp8_config(const Fp8GemmParams& params);

// The swizzle the rule picks for a configuration (ignores params.swizzle).
int choose_fp8_swizzle(const Fp8GemmParams& params, int config);

// Resolves params->config and params->swizzle (the rule's where they are not forced) and returns
// the kernel that runs the problem ("" when none does, as fp8_gemm_kernel_name) and, through
// *workspace_bytes, the workspace it needs: the binding's one selection per call.
const char* plan_fp8_gemm(Fp8GemmParams* params, size_t* workspace_bytes);

// The name of the kernel that would run these params, "" when none does: not an SM90 device or
// build, a format / output dtype pair without a kernel, or a problem the kernels do not take
// (k or the leading dimensions not multiples of 16 bytes, unaligned pointers, m, n or k zero).
const char* fp8_gemm_kernel_name(const Fp8GemmParams& params);

// Device workspace the kernel needs (0 when none runs).
size_t fp8_gemm_workspace_size(const Fp8GemmParams& params);

// Runs the kernel on `stream`; kUnsupported when fp8_gemm_kernel_name() is "". On failure
// *detail (if not null) receives a static string naming the failing step.
GemmStatus run_fp8_gemm(const Fp8GemmParams& params, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream, const char** detail);

// One kernel: the launch of Fp8Gemm<A format, D dtype, config> (fp8_gemm_sm90.cuh), explicitly
// instantiated in fp8_gemm_sm90_<format>_<dtype>.cu. workspace_query != nullptr: only report the
// workspace size there.
template <Fp8Format A, DType D, int Config>
GemmStatus fp8_gemm_launch(const Fp8GemmParams& params, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, const char** detail, size_t* workspace_query);

}  // namespace kernels
}  // namespace cutlass_nn
