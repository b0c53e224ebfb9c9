#include "fp8_aten.h"

#include <ATen/ATen.h>

#include <string>

#include "validation.h"

namespace cutlass_nn {
namespace {

constexpr const char* kOp = "fp8_scaled_mm";

bool is_float8(c10::ScalarType t) {
  return t == c10::kFloat8_e4m3fn || t == c10::kFloat8_e5m2;
}

std::string describe(const at::Tensor& t) {
  return "a " + dtype_name(t.scalar_type()) + " tensor of shape " + shape_string(t.sizes());
}

void check_operand(const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.dim() == 2 && is_float8(t.scalar_type()), "cutlass_nn.", kOp, ": argument '",
              arg, "' must be a 2-d float8_e4m3fn or float8_e5m2 tensor, got ", describe(t));
}

// A scale: one value ([] or [1]) or one per row ([rows, 1], per == "row") / column ([1, cols]).
void check_scale(const char* arg, const at::Tensor& scale, const at::Tensor& a, int64_t rows,
                 int64_t cols, bool per_row) {
  const std::string want = per_row ? "[" + std::to_string(rows) + ", 1]"
                                   : "[1, " + std::to_string(cols) + "]";
  const bool shape_ok =
      scale.dim() == 0 || (scale.dim() == 1 && scale.size(0) == 1) ||
      (scale.dim() == 2 && scale.size(0) == (per_row ? rows : 1) &&
       scale.size(1) == (per_row ? 1 : cols));
  TORCH_CHECK(scale.scalar_type() == c10::kFloat && shape_ok, "cutlass_nn.", kOp, ": argument '",
              arg, "' must be a float32 tensor of shape [] or [1] (one value) or ", want,
              " (one per ", per_row ? "row" : "column", "), got ", describe(scale));
  check_same_device(kOp, arg, scale, "a", a);
}

}  // namespace

void check_fp8_scaled_mm_args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale,
                              const at::Tensor& b_scale, const std::optional<at::Tensor>& bias,
                              c10::ScalarType out_dtype) {
  check_operand("a", a);
  check_operand("b", b);
  check_same_device(kOp, "b", b, "a", a);
  TORCH_CHECK(b.size(0) == a.size(1), "cutlass_nn.", kOp, ": argument 'b' must have ",
              std::to_string(a.size(1)), " rows (the columns of 'a'), got shape ",
              shape_string(b.sizes()));
  const int64_t m = a.size(0), n = b.size(1);
  check_scale("a_scale", a_scale, a, m, n, /*per_row=*/true);
  check_scale("b_scale", b_scale, a, m, n, /*per_row=*/false);
  TORCH_CHECK(out_dtype == c10::kBFloat16 || out_dtype == c10::kHalf || out_dtype == c10::kFloat,
              "cutlass_nn.", kOp, ": argument 'out_dtype' must be bfloat16, float16 or float32, "
              "got ", dtype_name(out_dtype));
  if (bias.has_value() && bias->defined()) {
    const at::Tensor& t = *bias;
    TORCH_CHECK(t.dim() == 1 && t.size(0) == n && t.scalar_type() == out_dtype, "cutlass_nn.",
                kOp, ": argument 'bias' must be a ", dtype_name(out_dtype), " tensor of shape [",
                std::to_string(n), "] (out_dtype, the columns of 'b'), got ", describe(t));
    check_same_device(kOp, "bias", t, "a", a);
  }
}

at::Tensor fp8_scaled_mm_aten(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale,
                              const at::Tensor& b_scale, const std::optional<at::Tensor>& bias,
                              c10::ScalarType out_dtype) {
  at::Tensor out = at::matmul(a.to(at::kFloat) * a_scale, b.to(at::kFloat) * b_scale);
  if (bias.has_value() && bias->defined()) out = out + bias->to(at::kFloat);
  return out.to(out_dtype);
}

std::tuple<c10::ScalarType, int> check_fp8_quantize_args(const at::Tensor& x,
                                                         c10::string_view format,
                                                         c10::string_view axis,
                                                         const char* op) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && (dtype == c10::kHalf || dtype == c10::kBFloat16 ||
                               dtype == c10::kFloat),
              "cutlass_nn.", op, ": argument 'x' must be a 2-d float16, bfloat16 or float32 "
              "tensor, got ", describe(x));
  TORCH_CHECK(format == "e4m3" || format == "e5m2", "cutlass_nn.", op,
              ": argument 'format' must be \"e4m3\" or \"e5m2\", got \"", std::string(format),
              "\"");
  TORCH_CHECK(axis == "tensor" || axis == "row" || axis == "column", "cutlass_nn.", op,
              ": argument 'axis' must be \"tensor\", \"row\" or \"column\", got \"",
              std::string(axis), "\"");
  const c10::ScalarType fp8 = format == "e4m3" ? c10::kFloat8_e4m3fn : c10::kFloat8_e5m2;
  return {fp8, axis == "tensor" ? 0 : axis == "row" ? 1 : 2};
}

std::tuple<at::Tensor, at::Tensor> fp8_quantize_aten(const at::Tensor& x, c10::ScalarType fp8,
                                                     int axis, bool transpose) {
  const double largest = fp8 == c10::kFloat8_e4m3fn ? 448.0 : 57344.0;
  const at::Tensor xf = x.to(at::kFloat);
  const int64_t rows = x.size(0), cols = x.size(1);
  at::Tensor amax;
  const auto f32 = x.options().dtype(at::kFloat);
  if (axis == 0) {
    amax = x.numel() == 0 ? at::zeros({}, f32) : xf.abs().amax();
  } else if (axis == 1) {
    amax = cols == 0 ? at::zeros({rows, 1}, f32) : xf.abs().amax({1}, /*keepdim=*/true);
  } else {
    amax = rows == 0 ? at::zeros({1, cols}, f32) : xf.abs().amax({0}, /*keepdim=*/true);
  }
  // The steps of fp8_reference.quantize_unchecked, each an ATen operation with its rounding.
  const at::Tensor qs = amax.clamp_min(1e-12).reciprocal().mul(largest);
  at::Tensor data = xf.mul(qs).clamp(-largest, largest).to(fp8);
  at::Tensor scale = qs.reciprocal();
  if (transpose) {
    data = data.t().contiguous();
    if (scale.dim() == 2) scale = scale.t();
  }
  return {data, scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fp8_quantize_both_aten(const at::Tensor& x,
                                                                      c10::ScalarType fp8, int axis) {
  auto [data, scale] = fp8_quantize_aten(x, fp8, axis, /*transpose=*/false);
  at::Tensor data_t = data.t().contiguous();
  return {data, data_t, scale};
}

std::tuple<c10::ScalarType, int> check_fp8_cast_args(const at::Tensor& x, const at::Tensor& scale,
                                                     c10::string_view format) {
  const char* op = "fp8_cast";
  const auto [fp8, unused] = check_fp8_quantize_args(x, format, "tensor", op);
  const int64_t rows = x.size(0), cols = x.size(1);
  const bool one = scale.dim() == 0 || (scale.dim() == 1 && scale.size(0) == 1);
  const bool per_row = scale.dim() == 2 && scale.size(0) == rows && scale.size(1) == 1;
  const bool per_col = scale.dim() == 2 && scale.size(0) == 1 && scale.size(1) == cols;
  TORCH_CHECK(scale.scalar_type() == c10::kFloat && (one || per_row || per_col), "cutlass_nn.", op,
              ": argument 'scale' must be a float32 tensor of shape [] or [1] (one value), [",
              std::to_string(rows), ", 1] (per row) or [1, ", std::to_string(cols),
              "] (per column), got ", describe(scale));
  check_same_device(op, "scale", scale, "x", x);
  return {fp8, one ? 0 : per_row ? 1 : 2};
}

at::Tensor fp8_cast_aten(const at::Tensor& x, const at::Tensor& scale, c10::ScalarType fp8,
                         bool transpose) {
  const double largest = fp8 == c10::kFloat8_e4m3fn ? 448.0 : 57344.0;
  const at::Tensor qs = scale.reciprocal();
  at::Tensor data = x.to(at::kFloat).mul(qs).clamp(-largest, largest).to(fp8);
  return transpose ? data.t().contiguous() : data;
}

}  // namespace cutlass_nn
