// Torch-free interface of the FP8 quantization kernels: dynamic scaling of a 2-D operand in two
// passes (the absolute maximum, then the scaled cast), optionally writing the float8 data
// transposed, which is how the backward GEMMs of an FP8 linear layer get their K-major operands
// without a separate transpose.
//
// For amax over the tensor, each row or each column of x [rows, cols]:
//   qs = (1 / max(amax, 1e-12)) * largest       (largest = 448 for e4m3, 57344 for e5m2)
//   data = cast(clamp(x * qs, -largest, largest)) (round to nearest even)
//   scale = 1 / qs                              (the dequantization factor, float32)
// each step rounded to float32: bitwise what cutlass_nn.fp8_reference.quantize_unchecked computes with torch
// operations. A NaN or infinite element makes its slice's scale non-finite and its data NaN.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fp8_gemm.h"     // Fp8Format
#include "gemm_params.h"  // DType

namespace cutlass_nn {
namespace kernels {

enum class Fp8Axis : int {
  kTensor = 0,  // one scale
  kRow = 1,     // one scale per row of x (scale[rows])
  kColumn = 2,  // one scale per column of x (scale[cols])
};

// Number of scales (and of amax words) for an axis.
inline int64_t fp8_scale_count(Fp8Axis axis, int64_t rows, int64_t cols) {
  return axis == Fp8Axis::kTensor ? 1 : axis == Fp8Axis::kRow ? rows : cols;
}

struct Fp8QuantizeParams {
  const void* x = nullptr;  // [rows, cols], row-major, contiguous
  DType dtype_x = DType::kBFloat16;  // kFloat16, kBFloat16 or kFloat32
  int64_t rows = 0, cols = 0;
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Axis axis = Fp8Axis::kTensor;
  bool transpose = false;   // write data as [cols, rows] (row-major) instead of [rows, cols]
  void* data = nullptr;     // float8 output, rows * cols bytes
  // With transpose: also write the data untransposed ([rows, cols]) here, from the same cast
  // (both layouts of one quantization in one pass; nullptr: only `data`).
  void* data_rows = nullptr;
  float* scale = nullptr;   // fp8_scale_count() float32 outputs
  uint32_t* amax = nullptr;  // fp8_scale_count() words of workspace
  // A cast with known dequantization scales instead (fp8_scale_count() of them for the axis):
  // qs = 1 / given_scale[j] rounded to float32, no maximum pass; `scale` and `amax` unused.
  const float* given_scale = nullptr;
  int multiprocessors = 0;
};

// Enqueues the passes on `stream`; returns the first launch error (cudaSuccess otherwise).
cudaError_t launch_fp8_quantize(const Fp8QuantizeParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
