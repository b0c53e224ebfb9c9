#include "validation.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/grad_mode.h>

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

void check_no_internal_overlap(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "cutlass_nn.", op,
              ": argument '", arg,
              "' must not have elements that share memory (it is written in place), got shape ",
              shape_string(t.sizes()), " with strides ", shape_string(t.strides()),
              " (an expand()ed or stride-0 view; pass a copy, e.g. .contiguous())");
}

void check_not_grad_leaf(const char* op, const char* arg, const at::Tensor& t) {
  if (!t.requires_grad() || !at::GradMode::is_enabled()) return;
  const bool leaf = t.is_leaf();
  // a view of a leaf is not a leaf itself (it has a view node), but writing it writes the leaf
  const bool view_of_leaf = !leaf && t.is_view() && t._base().is_leaf();
  TORCH_CHECK(!leaf && !view_of_leaf, "cutlass_nn.", op, ": argument '", arg,
              "' must not be a leaf tensor that requires grad, nor a view of one, while grad "
              "mode is on (it is written in place, which autograd cannot record), got ",
              leaf ? "a leaf" : "a view of a leaf",
              " with requires_grad=True; pass a tensor that does not require grad (e.g. "
              ".detach()) or call under torch.no_grad()");
}

void check_writable(const char* op, const char* arg, const at::Tensor& t) {
  check_no_internal_overlap(op, arg, t);
  check_not_grad_leaf(op, arg, t);
}

void check_no_overlap(const char* op, const char* arg, const at::Tensor& t,
                      const char* written_arg, const at::Tensor& written) {
  const auto overlap = at::get_overlap_status(written, t);
  TORCH_CHECK(overlap != at::MemOverlapStatus::Full && overlap != at::MemOverlapStatus::Partial,
              "cutlass_nn.", op, ": argument '", arg, "' must not share memory with '",
              written_arg, "' (which is written in place)");
}

}  // namespace cutlass_nn
