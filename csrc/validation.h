// Argument validation shared by every backend of the cutlass_nn operators.
//
// Every check names the operator and the argument and says what was expected and what was
// given, so that a user who passes a bad tensor learns which call and which argument to fix.
// All checks run before any output is allocated or any argument is written.
//
// Every check raises through TORCH_CHECK (a RuntimeError in Python, like torch.mm's own shape
// errors), and every message is built from strings only: numbers go through std::to_string and
// devices through Device::str(). On the GPU machine (torch 2.11, extension compiled by another
// GCC than torch) any error message that went through std::ostream inside this library (an
// integer in c10::str, or an ostringstream) crashed the process; all-string messages work.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <optional>
#include <string>

namespace cutlass_nn {

// "[2, 3, 4]"
std::string shape_string(c10::IntArrayRef sizes);

// "float32", "bfloat16", ... (the torch.<name> spelling users know)
std::string dtype_name(c10::ScalarType dtype);

// Fails unless `t` has one of the floating dtypes cutlass_nn computes in
// (float16, bfloat16, float32, float64).
void check_float_dtype(const char* op, const char* arg, const at::Tensor& t);

// Fails unless `t` has exactly `dim` dimensions (`what` describes the expected layout,
// e.g. "[out_features, in_features]").
void check_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim,
               const char* what);

// Fails unless `t` has at least `dim` dimensions.
void check_min_dim(const char* op, const char* arg, const at::Tensor& t, int64_t dim,
                   const char* what);

// Fails unless `t` has the dtype of `ref` (named `ref_arg`).
void check_same_dtype(const char* op, const char* arg, const at::Tensor& t,
                      const char* ref_arg, const at::Tensor& ref);

// Fails unless `t` is on the device of `ref` (named `ref_arg`).
void check_same_device(const char* op, const char* arg, const at::Tensor& t,
                       const char* ref_arg, const at::Tensor& ref);

// Fails unless t.size(dim) == expected; `what` explains where `expected` comes from.
void check_size(const char* op, const char* arg, const at::Tensor& t, int64_t dim,
                int64_t expected, const char* what);

// Fails unless `t` has exactly the shape of `ref`.
void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                      const at::Tensor& ref);

// Fails when two elements of `t`, which `op` writes in place, share memory (a dimension of
// size > 1 with stride 0: an expand()ed or as_strided view): the writes would race and the
// result would depend on their order. Tensors whose overlap cannot be decided cheaply pass (the
// other checks of the writing operators require contiguous outputs anyway).
void check_no_internal_overlap(const char* op, const char* arg, const at::Tensor& t);

// Fails while grad mode is on when `t`, which `op` writes in place, is a leaf tensor that
// requires grad or a view of one: what torch's own in-place operations refuse (autograd could
// not tell that the leaf changed), but with the operator and argument named instead of the
// message of whichever ATen operation inside the kernel tripped first.
void check_not_grad_leaf(const char* op, const char* arg, const at::Tensor& t);

// Both of the above: `t` can take `op`'s in-place writes.
void check_writable(const char* op, const char* arg, const at::Tensor& t);

// Fails when `t` (read by `op`) shares memory with `written` (written in place by `op`): the
// kernel would read values it has already overwritten.
void check_no_overlap(const char* op, const char* arg, const at::Tensor& t,
                      const char* written_arg, const at::Tensor& written);

}  // namespace cutlass_nn
