#include "gemm_binding.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "../validation.h"
#include "device_info.h"
#include "gemm_params.h"

namespace cutlass_nn {
namespace cuda {
namespace {

std::atomic<bool> g_force_sm80{false};
thread_local const char* g_last_kernel = "";

kernels::DType to_kernel_dtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kHalf: return kernels::DType::kFloat16;
    case c10::kBFloat16: return kernels::DType::kBFloat16;
    case c10::kFloat: return kernels::DType::kFloat32;
    case c10::kDouble: return kernels::DType::kFloat64;
    default:
      TORCH_CHECK(false, "cutlass_nn: internal error: no GEMM kernel dtype for ",
                  dtype_name(dtype));
  }
}

// A matrix operand as the kernels see it. `holder` keeps a contiguous copy alive (when one was
// needed) until the kernel has been enqueued; the caching allocator then keeps its memory
// stream-ordered, so releasing it right after the launch is safe.
struct Operand {
  at::Tensor holder;
  const char* ptr;
  int64_t ld;
  kernels::Layout layout;
};

// Reads a 2-D tensor in place when it is row- or column-major with some leading dimension (a
// transposed view, a column slice); anything else (broadcast / overlapping / fully strided) is
// copied to a contiguous buffer.
Operand as_operand(const at::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  const int64_t s0 = t.stride(0), s1 = t.stride(1);
  const auto* ptr = static_cast<const char*>(t.data_ptr());
  if (s1 == 1 || cols == 1) {
    const int64_t ld = rows > 1 ? s0 : cols;
    if (ld >= cols) return {t, ptr, ld, kernels::Layout::kRowMajor};
  }
  if (s0 == 1 || rows == 1) {
    const int64_t ld = cols > 1 ? s1 : rows;
    if (ld >= rows) return {t, ptr, ld, kernels::Layout::kColumnMajor};
  }
  at::Tensor copy = t.contiguous();
  return {copy, static_cast<const char*>(copy.data_ptr()), cols, kernels::Layout::kRowMajor};
}

Operand as_row_major(const at::Tensor& t) {
  at::Tensor copy = t.contiguous();
  return {copy, static_cast<const char*>(copy.data_ptr()), t.size(1),
          kernels::Layout::kRowMajor};
}

}  // namespace

bool set_force_sm80(bool enable) { return g_force_sm80.exchange(enable); }

const char* last_kernel_name() { return g_last_kernel; }

bool is_row_major_output(const at::Tensor& t) {
  return t.dim() == 2 && (t.stride(1) == 1 || t.size(1) == 1) &&
         (t.size(0) <= 1 || t.stride(0) >= t.size(1));
}

at::Tensor empty_row_major(const at::Tensor& like, int64_t m, int64_t n) {
  return at::empty({m, n}, like.options().memory_format(at::MemoryFormat::Contiguous));
}

void gemm(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& d,
          const std::optional<at::Tensor>& bias, bool accumulate) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // An empty sum: D = bias (or 0), or D unchanged when accumulating.
    if (!accumulate) {
      if (bias.has_value()) {
        d.copy_(bias->unsqueeze(0).expand({m, n}));
      } else {
        d.zero_();
      }
    }
    return;
  }
  TORCH_CHECK(is_row_major_output(d), "cutlass_nn.", op,
              ": internal error: GEMM output is not row-major (strides ",
              shape_string(d.strides()), ")");
  TORCH_CHECK_VALUE(n <= INT_MAX && k <= INT_MAX, "cutlass_nn.", op,
                    ": GEMM sizes N=", n, " and K=", k, " must each be below 2^31");

  c10::cuda::CUDAGuard guard(a.device());
  Operand A = as_operand(a);
  Operand B = as_operand(b);
  if (A.layout == kernels::Layout::kColumnMajor && B.layout == kernels::Layout::kColumnMajor) {
    // No kernel reads both operands column-major; one contiguous copy of A makes it row-major.
    A = as_row_major(a);
  }
  at::Tensor bias_contig;
  if (bias.has_value()) bias_contig = bias->contiguous();

  const DeviceInfo& info = device_info(a.get_device());
  kernels::GemmParams p;
  p.n = n;
  p.k = k;
  p.lda = A.ld;
  p.layout_a = A.layout;
  p.b = B.ptr;
  p.ldb = B.ld;
  p.layout_b = B.layout;
  p.ldd = d.size(0) > 1 ? d.stride(0) : n;
  p.dtype_ab = to_kernel_dtype(a.scalar_type());
  p.dtype_cd = to_kernel_dtype(d.scalar_type());
  p.fp32_math = at::globalContext().allowTF32CuBLAS() ? kernels::Fp32Math::kTf32
                                                       : kernels::Fp32Math::kIeee;
  p.arch_path = g_force_sm80.load() ? kernels::ArchPath::kSm80 : kernels::ArchPath::kAuto;
  p.sm = info.sm;
  p.multiprocessors = info.multiprocessors;
  if (accumulate) {
    p.beta = 1.0f;  // C aliases D: D += A @ B
    p.ldc = p.ldd;
  } else if (bias.has_value()) {
    p.beta = 1.0f;  // C is the bias row, broadcast over the rows of D
    p.c_row_broadcast = true;
  }

  const int64_t a_elem = a.element_size(), d_elem = d.element_size();
  auto* d_ptr = static_cast<char*>(d.data_ptr());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();

  // CUTLASS problem sizes are 32-bit: very tall problems run as slabs of rows.
  constexpr int64_t kMaxRows = int64_t{1} << 30;
  for (int64_t row0 = 0; row0 < m; row0 += kMaxRows) {
    p.m = std::min(kMaxRows, m - row0);
    const int64_t a_offset = A.layout == kernels::Layout::kRowMajor ? row0 * A.ld : row0;
    p.a = A.ptr + a_offset * a_elem;
    p.d = d_ptr + row0 * p.ldd * d_elem;
    if (accumulate) {
      p.c = p.d;
    } else if (bias.has_value()) {
      p.c = bias_contig.data_ptr();
    } else {
      p.c = nullptr;
    }
    const size_t workspace_bytes = kernels::gemm_workspace_size(p);
    at::Tensor workspace;
    if (workspace_bytes > 0) {
      workspace = at::empty({static_cast<int64_t>(workspace_bytes)}, a.options().dtype(at::kByte));
    }
    const char* detail = nullptr;
    const kernels::GemmStatus status = kernels::run_gemm(
        p, workspace_bytes > 0 ? workspace.data_ptr() : nullptr, workspace_bytes, stream, &detail);
    g_last_kernel = kernels::gemm_kernel_name(p);
    TORCH_CHECK(status == kernels::GemmStatus::kSuccess, "cutlass_nn.", op, ": GEMM failed (",
                kernels::gemm_status_string(status), detail ? ": " : "", detail ? detail : "",
                ") for M=", p.m, " N=", n, " K=", k, ", dtype ", dtype_name(a.scalar_type()),
                ", output dtype ", dtype_name(d.scalar_type()), ", kernel '", g_last_kernel,
                "', device ", a.device(), " (compute capability ", info.sm / 10, ".",
                info.sm % 10, ")");
  }
}

}  // namespace cuda
}  // namespace cutlass_nn
