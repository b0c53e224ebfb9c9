#include "validation.h"

#include <string>

namespace cutlass_nn {

std::string shape_string(c10::IntArrayRef sizes) {
  // Plain concatenation (no iostreams): formatting must not be able to fail inside an error path.
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(sizes[i]);
  }
  out += "]";
  return out;
}

std::string dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kBool: return "bool";
    case c10::kFloat8_e4m3fn: return "float8_e4m3fn";
    case c10::kFloat8_e5m2: return "float8_e5m2";
    default: return c10::toString(dtype);
  }
}

void check_float_dtype(const char* op, const char* arg, const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == c10::kHalf || dtype == c10::kBFloat16 || dtype == c10::kFloat ||
                       dtype == c10::kDouble,
                   "cutlass_nn.", op, ": argument '", arg,
                   "' must have a floating dtype (float16, bfloat16, float32 or float64), got ",
                   dtype_name(dtype));
}

void check_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim,
               const char* what) {
  TORCH_CHECK(t.dim() == dim, "cutlass_nn.", op, ": argument '", arg, "' must be a ", std::to_string(dim),
                    "-D tensor ", what, ", got a ", std::to_string(t.dim()), "-D tensor of shape ",
                    shape_string(t.sizes()));
}

void check_min_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim,
                   const char* what) {
  TORCH_CHECK(t.dim() >= dim, "cutlass_nn.", op, ": argument '", arg,
                    "' must have at least ", std::to_string(dim), " dimension(s) ", what,
              ", got a ", std::to_string(t.dim()),
                    "-D tensor of shape ", shape_string(t.sizes()));
}

void check_same_dtype(const char* op, const char* arg, const at::Tensor& t,
                      const char* ref_arg, const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "cutlass_nn.", op, ": argument '", arg,
                   "' must have dtype ", dtype_name(ref.scalar_type()), " (the dtype of '",
                   ref_arg, "'), got ", dtype_name(t.scalar_type()));
}

void check_same_device(const char* op, const char* arg, const at::Tensor& t,
                       const char* ref_arg, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), "cutlass_nn.", op, ": argument '", arg,
              "' must be on device ", ref.device().str(), " (the device of '", ref_arg, "'), got ",
              t.device().str());
}

void check_size(const char* op, const char* arg, const at::Tensor& t, int64_t dim,
                int64_t expected, const char* what) {
  TORCH_CHECK(t.size(dim) == expected, "cutlass_nn.", op, ": argument '", arg,
                    "' must have size ", std::to_string(expected), " in dimension ",
              std::to_string(dim), " (", what,
                    "), got shape ", shape_string(t.sizes()));
}

void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                      const at::Tensor& ref) {
  TORCH_CHECK(t.sizes() == ref.sizes(), "cutlass_nn.", op, ": argument '", arg,
                    "' must have the shape of '", ref_arg, "' ", shape_string(ref.sizes()),
                    ", got ", shape_string(t.sizes()));
}

}  // namespace cutlass_nn
