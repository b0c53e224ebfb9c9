// CUDA implementations of fp8_scaled_mm -- the SM90 FP8 kernels (csrc/kernels/fp8_gemm.h) where
// one takes the problem, else the ATen formulation of csrc/fp8_aten.h (the same arithmetic, which
// the CPU backend runs too) -- and of fp8_quantize (csrc/kernels/fp8_quantize.h, bitwise the ATen
// formulation). Checks and messages: csrc/fp8_aten.cpp, shared with the CPU backend.
#include "fp8_cuda.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../fp8_aten.h"
#include "../validation.h"
#include "device_info.h"
#include "empty_output.h"
#include "fp8_gemm.h"
#include "fp8_quantize.h"
#include "gemm_binding.h"
#include "kernel_dtype.h"
#include "launch_check.h"

namespace cutlass_nn {
namespace cuda {
namespace {

std::atomic<int> g_fp8_config{-1};
std::atomic<int> g_fp8_swizzle{0};

kernels::Fp8Format format_of(const at::Tensor& t) {
  return t.scalar_type() == c10::kFloat8_e5m2 ? kernels::Fp8Format::kE5M2
                                              : kernels::Fp8Format::kE4M3;
}

// A with unit column stride and rows at least K apart, as the kernels read it; else a copy.
at::Tensor k_major_rows(const at::Tensor& a) {
  const int64_t k = a.size(1);
  const bool fits = (a.stride(1) == 1 || k == 1) && (a.size(0) <= 1 || a.stride(0) >= k);
  return fits ? a : a.contiguous();
}

// B [K, N] column-major (unit row stride, columns at least K apart); else a column-major copy.
at::Tensor k_major_columns(const at::Tensor& b) {
  const int64_t k = b.size(0);
  const bool fits = (b.stride(0) == 1 || k == 1) && (b.size(1) <= 1 || b.stride(1) >= k);
  return fits ? b : b.t().contiguous().t();
}

const char* const kAtenFallback = "aten_fp8_dequantize_matmul";

at::Tensor fp8_scaled_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& a_scale,
                              const at::Tensor& b_scale, const std::optional<at::Tensor>& bias,
                              c10::ScalarType out_dtype, bool use_fast_accum) {
  check_fp8_scaled_mm_args(a, b, a_scale, b_scale, bias, out_dtype);
  c10::cuda::CUDAGuard guard(a.device());
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const DeviceInfo& info = device_info(a.get_device());

  // What no kernel takes whatever the layout (float16 out, an empty dimension, not Hopper, an
  // e5m2 B, K not a multiple of 16 bytes) goes to the ATen formulation before any copy is made.
  const bool no_kernel = out_dtype == c10::kHalf || m == 0 || n == 0 || k == 0 || info.sm != 90 ||
                         b.scalar_type() == c10::kFloat8_e5m2 || k % 16 != 0;
  if (no_kernel) {
    set_last_kernel_name(kAtenFallback);
    return fp8_scaled_mm_aten(a, b, a_scale, b_scale, bias, out_dtype);
  }
  const at::Tensor a_k = k_major_rows(a);
  const at::Tensor b_k = k_major_columns(b);
  const at::Tensor a_scale_c = a_scale.contiguous();
  const at::Tensor b_scale_c = b_scale.contiguous();
  std::optional<at::Tensor> bias_c;
  if (bias.has_value() && bias->defined()) bias_c = bias->contiguous();

  kernels::Fp8GemmParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a_k.data_ptr();
  p.lda = m > 1 ? a_k.stride(0) : k;
  p.format_a = format_of(a);
  p.b = b_k.data_ptr();
  p.ldb = n > 1 ? b_k.stride(1) : k;
  p.format_b = format_of(b);
  p.a_scale = a_scale_c.data_ptr<float>();
  p.a_scale_per_row = fp8_scale_is_vector(a_scale);
  p.b_scale = b_scale_c.data_ptr<float>();
  p.b_scale_per_col = fp8_scale_is_vector(b_scale);
  p.bias = bias_c.has_value() ? bias_c->data_ptr() : nullptr;
  p.ldd = n;
  p.dtype_d = out_dtype == c10::kFloat ? kernels::DType::kFloat32 : kernels::DType::kBFloat16;
  p.sm = info.sm;
  p.multiprocessors = info.multiprocessors;
  p.fast_accum = use_fast_accum;
  p.config = g_fp8_config.load();
  p.swizzle = g_fp8_swizzle.load();
  // The output is 16-byte aligned by the allocator; the kernels' other conditions (strides,
  // operand alignment) are checked on the K-major operands, once, with the kernel choice.
  p.d = reinterpret_cast<void*>(uintptr_t{256});
  size_t workspace_bytes = 0;
  const char* name = kernels::plan_fp8_gemm(&p, &workspace_bytes);
  if (*name == '\0') {
    // No FP8 kernel for this problem (an operand pointer or leading dimension not 16-byte
    // aligned, a size past the kernels' int range): the same arithmetic in ATen operations.
    set_last_kernel_name(kAtenFallback);
    return fp8_scaled_mm_aten(a, b, a_scale, b_scale, bias, out_dtype);
  }
  at::Tensor out = empty_output({m, n}, a.options().dtype(out_dtype));
  p.d = out.data_ptr();
  at::Tensor workspace;
  if (workspace_bytes > 0) {
    workspace = empty_output({static_cast<int64_t>(workspace_bytes)}, a.options().dtype(at::kByte));
  }
  const char* detail = nullptr;
  const kernels::GemmStatus status = kernels::run_fp8_gemm(
      p, workspace_bytes > 0 ? workspace.data_ptr() : nullptr, workspace_bytes,
      c10::cuda::getCurrentCUDAStream(a.get_device()).stream(), &detail);
  set_last_kernel_name(name);
  const bool has_detail = detail != nullptr && *detail != '\0';
  TORCH_CHECK(status == kernels::GemmStatus::kSuccess, "cutlass_nn.fp8_scaled_mm: GEMM failed (",
              kernels::gemm_status_string(status), has_detail ? ": " : "",
              has_detail ? detail : "", ") for M=", std::to_string(m), " N=", std::to_string(n),
              " K=", std::to_string(k), ", a ", dtype_name(a.scalar_type()), ", b ",
              dtype_name(b.scalar_type()), ", output dtype ", dtype_name(out_dtype), ", kernel '",
              name, "', device ", a.device().str());
  return out;
}

// What every cast of the contiguous 2-D x into `data` shares (fp8_quantize, fp8_quantize_both,
// fp8_cast); the callers add the scale (computed or given) and the second layout.
kernels::Fp8QuantizeParams cast_params(const at::Tensor& x, c10::ScalarType fp8,
                                       kernels::Fp8Axis axis, bool transpose, const at::Tensor& data) {
  kernels::Fp8QuantizeParams p;
  p.x = x.data_ptr();
  p.dtype_x = kernel_dtype(x.scalar_type());
  p.rows = x.size(0);
  p.cols = x.size(1);
  p.format = fp8 == c10::kFloat8_e4m3fn ? kernels::Fp8Format::kE4M3 : kernels::Fp8Format::kE5M2;
  p.axis = axis;
  p.transpose = transpose;
  p.data = data.data_ptr();
  p.multiprocessors = device_info(x.get_device()).multiprocessors;
  return p;
}

// One quantization of x; `data` laid out [cols, rows] with transpose, and with both also
// `data_rows` [rows, cols] from the same cast (scale then untransposed).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize(const at::Tensor& x_in, c10::string_view format,
                                                        c10::string_view axis, bool transpose,
                                                        bool both) {
  const auto [fp8, axis_code] =
      check_fp8_quantize_args(x_in, format, axis, both ? "fp8_quantize_both" : "fp8_quantize");
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0), cols = x.size(1);
  const auto kaxis = static_cast<kernels::Fp8Axis>(axis_code);
  const int64_t count = kernels::fp8_scale_count(kaxis, rows, cols);
  at::Tensor data = empty_output(transpose ? c10::IntArrayRef{cols, rows}
                                           : c10::IntArrayRef{rows, cols},
                                 x.options().dtype(fp8));
  at::Tensor data_rows;
  if (both) data_rows = empty_output({rows, cols}, x.options().dtype(fp8));
  // scale: [] / [rows, 1] / [1, cols] (transposed alike with the data; as x's with both)
  const bool scale_t = transpose && !both;
  std::vector<int64_t> scale_shape;
  if (kaxis == kernels::Fp8Axis::kRow) scale_shape = scale_t ? std::vector<int64_t>{1, rows}
                                                             : std::vector<int64_t>{rows, 1};
  if (kaxis == kernels::Fp8Axis::kColumn) scale_shape = scale_t ? std::vector<int64_t>{cols, 1}
                                                                : std::vector<int64_t>{1, cols};
  at::Tensor scale = empty_output(scale_shape, x.options().dtype(at::kFloat));
  at::Tensor amax = empty_output({std::max<int64_t>(count, 1)}, x.options().dtype(at::kInt));
  kernels::Fp8QuantizeParams p = cast_params(x, fp8, kaxis, transpose, data);
  p.data_rows = both ? data_rows.data_ptr() : nullptr;
  p.scale = scale.data_ptr<float>();
  p.amax = reinterpret_cast<uint32_t*>(amax.data_ptr<int32_t>());
  check_launch(both ? "fp8_quantize_both" : "fp8_quantize",
               kernels::launch_fp8_quantize(p, c10::cuda::getCurrentCUDAStream(x.get_device()).stream()),
               x);
  return {data, scale, data_rows};
}

std::tuple<at::Tensor, at::Tensor> fp8_quantize_cuda(const at::Tensor& x, c10::string_view format,
                                                     c10::string_view axis, bool transpose) {
  auto [data, scale, unused] = quantize(x, format, axis, transpose, false);
  return {data, scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fp8_quantize_both_cuda(const at::Tensor& x,
                                                                      c10::string_view format,
                                                                      c10::string_view axis) {
  auto [data_t, scale, data] = quantize(x, format, axis, true, true);
  return {data, data_t, scale};
}

at::Tensor fp8_cast_cuda(const at::Tensor& x_in, const at::Tensor& scale_in,
                         c10::string_view format, bool transpose) {
  const auto [fp8, axis_code] = check_fp8_cast_args(x_in, scale_in, format);
  c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor scale = scale_in.contiguous();
  const int64_t rows = x.size(0), cols = x.size(1);
  at::Tensor data = empty_output(transpose ? c10::IntArrayRef{cols, rows}
                                           : c10::IntArrayRef{rows, cols},
                                 x.options().dtype(fp8));
  // Nothing to cast; and an empty per-row scale has no storage, so the kernels (which take a
  // null given_scale for "compute the maximum first") must not see it.
  if (x.numel() == 0) return data;
  kernels::Fp8QuantizeParams p =
      cast_params(x, fp8, static_cast<kernels::Fp8Axis>(axis_code), transpose, data);
  p.given_scale = scale.data_ptr<float>();
  check_launch("fp8_cast",
               kernels::launch_fp8_quantize(p, c10::cuda::getCurrentCUDAStream(x.get_device()).stream()),
               x);
  return data;
}

}  // namespace

int64_t set_fp8_config(int64_t config) {
  TORCH_CHECK(config >= -1 && config < kernels::kFp8ConfigCount,
              "cutlass_nn._set_fp8_config: argument 'config' must be -1 (the per-shape rule) or "
              "an FP8 configuration index 0..", std::to_string(kernels::kFp8ConfigCount - 1),
              ", got ", std::to_string(config));
  return g_fp8_config.exchange(static_cast<int>(config));
}

int64_t set_fp8_swizzle(int64_t swizzle) {
  TORCH_CHECK(swizzle == 0 || swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8,
              "cutlass_nn._set_fp8_swizzle: argument 'swizzle' must be 0 (the rule's), 1, 2, 4 "
              "or 8, got ", std::to_string(swizzle));
  return g_fp8_swizzle.exchange(static_cast<int>(swizzle));
}

std::string fp8_config_names() {
  std::string names;
  for (int i = 0; i < kernels::kFp8ConfigCount; ++i) {
    names += kernels::fp8_config_name(i);
    names += "\n";
  }
  return names;
}

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  m.impl("fp8_scaled_mm", &fp8_scaled_mm_cuda);
  m.impl("fp8_quantize", &fp8_quantize_cuda);
  m.impl("fp8_quantize_both", &fp8_quantize_both_cuda);
  m.impl("fp8_cast", &fp8_cast_cuda);
}

}  // namespace cuda
}  // namespace cutlass_nn
