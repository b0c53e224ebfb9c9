// CPU implementations of fp8_scaled_mm, fp8_quantize and fp8_quantize_both: the shared checks, then the ATen
// formulations of csrc/fp8_aten.h (the references the CUDA kernels are tested against). Fast
// accumulation is a property of the GPU kernels; the CPU sums in float32 either way.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../fp8_aten.h"

namespace cutlass_nn {
namespace {

at::Tensor fp8_scaled_mm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale,
                             const at::Tensor& b_scale, const std::optional<at::Tensor>& bias,
                             c10::ScalarType out_dtype, bool use_fast_accum) {
  (void)use_fast_accum;
  check_fp8_scaled_mm_args(a, b, a_scale, b_scale, bias, out_dtype);
  return fp8_scaled_mm_aten(a, b, a_scale, b_scale, bias, out_dtype);
}

std::tuple<at::Tensor, at::Tensor> fp8_quantize_cpu(const at::Tensor& x, c10::string_view format,
                                                    c10::string_view axis, bool transpose) {
  const auto [fp8, axis_code] = check_fp8_quantize_args(x, format, axis);
  return fp8_quantize_aten(x, fp8, axis_code, transpose);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fp8_quantize_both_cpu(const at::Tensor& x,
                                                                     c10::string_view format,
                                                                     c10::string_view axis) {
  const auto [fp8, axis_code] = check_fp8_quantize_args(x, format, axis, "fp8_quantize_both");
  return fp8_quantize_both_aten(x, fp8, axis_code);
}

at::Tensor fp8_cast_cpu(const at::Tensor& x, const at::Tensor& scale, c10::string_view format,
                        bool transpose) {
  const auto [fp8, axis_code] = check_fp8_cast_args(x, scale, format);
  (void)axis_code;
  return fp8_cast_aten(x, scale, fp8, transpose);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CPU, m) {
  m.impl("fp8_scaled_mm", &fp8_scaled_mm_cpu);
  m.impl("fp8_quantize", &fp8_quantize_cpu);
  m.impl("fp8_quantize_both", &fp8_quantize_both_cpu);
  m.impl("fp8_cast", &fp8_cast_cpu);
}

}  // namespace cutlass_nn
