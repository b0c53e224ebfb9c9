// Tensor-level front of the GEMM kernels: turns torch tensors into a kernels::GemmParams, picks
// the device / stream / workspace, and reports failures with the operator's name and the
// problem shape. Used by every GEMM-based operator in ops_cuda.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "activation_math.h"

namespace cutlass_nn {
namespace cuda {

// D = A @ B (+ bias broadcast over rows) (+ beta * D when accumulate).
//
// a: [m, k], b: [k, n], any strides (a transposed view is read in place; other strides are
// copied to a contiguous buffer that lives until the kernel has been enqueued).
// d: [m, n], written; must have unit stride in dim 1 and stride(0) >= n (row-major).
// bias: optional [n], added to every row. accumulate: D += A @ B instead of D = A @ B.
// `op` names the calling operator in error messages.
void gemm(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& d,
          const std::optional<at::Tensor>& bias, bool accumulate);

// D = act(A @ B + bias) with the activation fused into the GEMM epilogue, and, when `aux` is
// given, aux = A @ B + bias (the pre-activation). d and aux: [m, n] row-major. Returns false,
// doing nothing, when no kernel on this device fuses it (not an SM90 GPU, float32/64, or an
// operand that is not 16-byte aligned); the caller then runs gemm() and the activation apart.
bool gemm_fused_activation(const char* op, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& d, const std::optional<at::Tensor>& bias,
                           kernels::Activation activation, const at::Tensor* aux);

// Force an SM90 tile configuration (-1: the per-shape rule), scheduler swizzle and split-K
// factor of the stream-K configurations (0: the rule's choice); returns the previous
// [config, swizzle, splits]. Process-wide. For the benchmark sweep and tests.
std::vector<int64_t> set_gemm_config(int64_t config, int64_t swizzle, int64_t splits);
// Whether plain products may run on the kernels without a C operand (default true); returns the
// previous setting. For A/B timing (bench --what step-sweep) and the dispatch tests.
bool set_epilogue_without_c(bool enabled);

// The SM90 tile configuration names, one per line, in index order.
std::string gemm_config_names();

// A row-major buffer [m, n] of `a`'s dtype (or `dtype`) on `a`'s device, for gemm() outputs.
at::Tensor empty_row_major(const at::Tensor& like, int64_t m, int64_t n);

// True when `t` can be gemm()'s `d` directly (2-D, unit column stride, rows far enough apart).
bool is_row_major_output(const at::Tensor& t);

// Force the CUTLASS 2.x (SM80) kernels even on Hopper; returns the previous setting.
bool set_force_sm80(bool enable);

// Launch the SM90 GEMMs (16-bit, TF32 and FP8) with programmatic dependent launch
// (kernels/launch_settings.h); returns the previous setting.
bool set_programmatic_launch(bool enable);
// The current setting of the above.
bool programmatic_launch_enabled();

// Name of the kernel the last gemm() on this thread ran ("" if none): for tests of dispatch.
const char* last_kernel_name();

// Records the kernel an operator outside gemm() ran (fp8_scaled_mm), for last_kernel_name().
// `name` must outlive the process (a string literal or a registry name).
void set_last_kernel_name(const char* name);

}  // namespace cuda
}  // namespace cutlass_nn
