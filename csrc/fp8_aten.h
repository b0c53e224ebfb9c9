// fp8_scaled_mm: the argument checks every backend shares, and the operator's arithmetic written
// with ATen operations (the CPU implementation, and the CUDA path for problems no FP8 kernel
// takes). cutlass_nn/fp8_reference.py's scaled_mm is the same formula in Python.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

#include <c10/util/string_view.h>

namespace cutlass_nn {

// fp8_scaled_mm(a [M, K], b [K, N], a_scale, b_scale, bias [N]?, out_dtype): a and b float8
// (float8_e4m3fn or float8_e5m2) on one device; a_scale float32 of shape [] or [1] (one value)
// or [M, 1] (one per row of a); b_scale float32 of shape [] or [1] or [1, N] (one per column of
// b); both on a's device; out_dtype float16, bfloat16 or float32; bias of out_dtype. Fails with
// a message naming the argument, what was expected and what was given.
void check_fp8_scaled_mm_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale,
                              const at::Tensor& b_scale, const std::optional<at::Tensor>& bias,
                              c10::ScalarType out_dtype);

// (a.float() * a_scale) @ (b.float() * b_scale) (+ bias.float()) in float32, rounded to
// out_dtype: float32 products and sums of the dequantized operands. Arguments as checked above.
at::Tensor fp8_scaled_mm_aten(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale,
                              const at::Tensor& b_scale, const std::optional<at::Tensor>& bias,
                              c10::ScalarType out_dtype);

// Whether a scale checked above holds one value per row (a_scale [M, 1]) or column (b_scale
// [1, N]) rather than one value. A [1, 1] scale of a one-row / one-column operand counts as per
// row / column, which is the same arithmetic.
inline bool fp8_scale_is_vector(const at::Tensor& scale) { return scale.dim() == 2; }

// fp8_quantize(x [R, C], format, axis, transpose): x a 2-d float16 / bfloat16 / float32 tensor,
// format "e4m3" or "e5m2", axis "tensor", "row" or "column". Returns the float8 dtype and the
// axis code (0 tensor, 1 row, 2 column, as kernels::Fp8Axis). `op` names the operator in the
// messages (fp8_quantize_both takes the same arguments).
std::tuple<c10::ScalarType, int> check_fp8_quantize_args(const at::Tensor& x,
                                                         c10::string_view format,
                                                         c10::string_view axis,
                                                         const char* op = "fp8_quantize");

// (data, scale) of cutlass_nn.fp8_reference.quantize_unchecked(x, format, dim) with dim None /
// 1 / 0 for axis tensor / row / column: scale [] / [R, 1] / [1, C]; with transpose, data is
// [C, R] (contiguous) and scale transposed alike ([1, R] / [C, 1]).
std::tuple<at::Tensor, at::Tensor> fp8_quantize_aten(const at::Tensor& x, c10::ScalarType fp8,
                                                     int axis, bool transpose);

// fp8_quantize_both(x, format, axis) -> (data [R, C], data_t [C, R], scale): one quantization
// in both layouts (the data of fp8_quantize with transpose false and true, bitwise; scale as
// with transpose false).
std::tuple<at::Tensor, at::Tensor, at::Tensor> fp8_quantize_both_aten(const at::Tensor& x,
                                                                      c10::ScalarType fp8, int axis);

// fp8_cast(x [R, C], scale, format, transpose): x as for fp8_quantize; scale float32 on x's
// device, of shape [] or [1] (one value), [R, 1] (per row) or [1, C] (per column). Returns the
// float8 dtype and the axis code the scale's shape gives (a [1, 1] scale of a one-row x is per
// row, of a one-column x per column).
std::tuple<c10::ScalarType, int> check_fp8_cast_args(const at::Tensor& x, const at::Tensor& scale,
                                                     c10::string_view format);

// data = cast(clamp(x * (1 / scale), -largest, largest)), the reciprocal rounded to float32 (as
// fp8_reference.cast_with_scale): x quantized with known dequantization scales, no maximum.
// With transpose, data is [C, R] (contiguous).
at::Tensor fp8_cast_aten(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType fp8,
                         bool transpose);

}  // namespace cutlass_nn
