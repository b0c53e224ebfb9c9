#include "gemm_binding.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../validation.h"
#include "device_info.h"
#include "empty_output.h"
#include "gemm_autotune.h"
#include "gemm_params.h"
#include "kernel_dtype.h"
#include "launch_settings.h"
#include "split_tf32.h"

namespace cutlass_nn {
namespace cuda {
namespace {

std::atomic<bool> g_force_sm80{false};
// Overrides of the SM90 tile configuration / scheduler swizzle (-1 / 0: the per-shape rule).
std::atomic<int> g_sm90_config{-1};
std::atomic<int> g_swizzle{0};
std::atomic<bool> g_epilogue_without_c{true};
std::atomic<int> g_splits{0};
// Process-wide (not thread-local): autograd runs CUDA backward ops on its own worker thread.
std::atomic<const char*> g_last_kernel{""};

// Whether float32 GEMMs may use TF32, by the same setting cuBLAS follows: the per-backend
// precision of torch >= 2.9 (torch.backends.cuda.matmul.fp32_precision), falling back to the
// legacy global setting (torch.set_float32_matmul_precision / allow_tf32) when that is unset.
bool float32_matmul_allows_tf32() {
  auto& ctx = at::globalContext();
  const auto precision = ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL);
  if (precision == at::Float32Precision::TF32) return true;
  if (precision == at::Float32Precision::IEEE) return false;
  return ctx.float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST;
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

// Runs one planned GEMM of the kernel layer with a workspace from the caching allocator, and
// turns a failure into an error naming the operator, the problem and the kernel.
void run_planned(const char* op, const kernels::GemmPlan& plan, const at::Tensor& a,
                 const at::Tensor& d, const DeviceInfo& info, cudaStream_t stream) {
  at::Tensor workspace;
  if (plan.workspace_bytes > 0) {
    workspace = empty_output({static_cast<int64_t>(plan.workspace_bytes)},
                          a.options().dtype(at::kByte));
  }
  const char* detail = nullptr;
  const kernels::GemmStatus status =
      kernels::run_gemm_plan(plan, plan.workspace_bytes > 0 ? workspace.data_ptr() : nullptr,
                             plan.workspace_bytes, stream, &detail);
  g_last_kernel = plan.name;
  const bool has_detail = detail != nullptr && *detail != '\0';
  // The problem as the caller posed it (the plan may hold the transposed one, or a batched
  // split-K's partial products, with the caller's problem in plan.output).
  const kernels::GemmParams& p = plan.k_slices > 1 ? plan.output : plan.params;
  const int64_t m = p.d_column_major ? p.n : p.m, n = p.d_column_major ? p.m : p.n;
  TORCH_CHECK(status == kernels::GemmStatus::kSuccess, "cutlass_nn.", op, ": GEMM failed (",
              kernels::gemm_status_string(status), has_detail ? ": " : "", has_detail ? detail : "",
              ") for M=", std::to_string(m), " N=", std::to_string(n), " K=",
              std::to_string(p.k), ", dtype ", dtype_name(a.scalar_type()), ", output dtype ",
              dtype_name(d.scalar_type()), ", kernel '", plan.name, "', device ",
              a.device().str(), " (compute capability ", std::to_string(info.sm / 10), ".",
              std::to_string(info.sm % 10), ")");
}

}  // namespace

bool set_force_sm80(bool enable) { return g_force_sm80.exchange(enable); }

bool set_programmatic_launch(bool enable) { return kernels::set_programmatic_launch(enable); }
bool programmatic_launch_enabled() { return kernels::programmatic_launch_enabled(); }

const char* last_kernel_name() { return g_last_kernel.load(); }

void set_last_kernel_name(const char* name) { g_last_kernel = name; }

bool is_row_major_output(const at::Tensor& t) {
  return t.dim() == 2 && (t.stride(1) == 1 || t.size(1) == 1) &&
         (t.size(0) <= 1 || t.stride(0) >= t.size(1));
}

at::Tensor empty_row_major(const at::Tensor& like, int64_t m, int64_t n) {
  return empty_output({m, n}, like.options().memory_format(at::MemoryFormat::Contiguous));
}

namespace {

int64_t round_up8(int64_t x) { return (x + 7) / 8 * 8; }

// Problems at least this large (m * n * k) with an operand the TMA kernels cannot read (a K or
// N that is not a multiple of 8 elements for 16-bit types) are run on padded copies: one pass
// over A, B and D costs far less than the plain-CUDA / narrow-access kernels would lose.
constexpr double kPadMinWork = 1 << 27;

// A copy of the 2-D matrix `t` [rows, cols] grown to [rows_p, cols_p] with zeros, in the same
// storage order as `t` (a column-major view stays column-major), so the new leading dimension is
// the padded extent.
at::Tensor pad_matrix(const at::Tensor& t, int64_t rows_p, int64_t cols_p) {
  const int64_t rows = t.size(0), cols = t.size(1);
  const bool column_major = t.stride(0) == 1 && t.stride(1) != 1;
  if (column_major) {
    return at::constant_pad_nd(t.t(), {0, rows_p - rows, 0, cols_p - cols}).t();
  }
  return at::constant_pad_nd(t, {0, cols_p - cols, 0, rows_p - rows}).contiguous();
}

void set_device_for_tma(const char* op, const at::Tensor& a) {
  // The SM90 kernels build TMA descriptors with the driver API (cuTensorMapEncodeTiled), which
  // needs a current context on this thread. Autograd's worker threads may not have one yet
  // (CUDA_ERROR_INVALID_CONTEXT, then a crash, was seen there); cudaSetDevice makes the
  // device's primary context current (CUDA >= 12) and is legal during graph capture. It is
  // called once per thread and device: afterwards the context stays current until the thread
  // switches devices, which cudaGetDevice (cheap, no driver call) then shows.
  thread_local int context_device = -1;
  const int device = a.get_device();
  int current = -1;
  if (context_device == device && cudaGetDevice(&current) == cudaSuccess && current == device) {
    return;
  }
  const cudaError_t set_device = cudaSetDevice(device);
  TORCH_CHECK(set_device == cudaSuccess, "cutlass_nn.", op, ": cudaSetDevice(",
              std::to_string(device), ") failed: ", cudaGetErrorString(set_device));
  context_device = device;
}

// The GemmParams of D = A @ B for operands already in kernel form (no pointers for the slabs
// yet; m and k are set per slab). split_operands: A and B are the TF32 parts of a 3xTF32 split.
kernels::GemmParams base_params(const Operand& A, const Operand& B, const at::Tensor& a,
                                const at::Tensor& d, int64_t n, const DeviceInfo& info,
                                bool split_operands = false) {
  kernels::GemmParams p;
  p.n = n;
  p.lda = A.ld;
  p.layout_a = A.layout;
  p.ldb = B.ld;
  p.layout_b = B.layout;
  p.ldd = d.size(0) > 1 ? d.stride(0) : n;
  p.dtype_ab = kernel_dtype(a.scalar_type());
  p.dtype_cd = kernel_dtype(d.scalar_type());
  p.fp32_math = split_operands ? kernels::Fp32Math::kTf32Split
                : a.scalar_type() == c10::kFloat && !float32_matmul_allows_tf32()
                    ? kernels::Fp32Math::kIeee
                    : kernels::Fp32Math::kTf32;
  p.arch_path = g_force_sm80.load() ? kernels::ArchPath::kSm80 : kernels::ArchPath::kAuto;
  p.sm = info.sm;
  p.multiprocessors = info.multiprocessors;
  p.memory_gbps = info.memory_gbps;
  p.sm90_config = g_sm90_config.load();
  p.swizzle = g_swizzle.load();
  p.splits = g_splits.load();
  p.epilogue_without_c = g_epilogue_without_c.load();
  return p;
}

// Operands in kernel form: read in place where possible, never both column-major.
std::pair<Operand, Operand> kernel_operands(const at::Tensor& a, const at::Tensor& b) {
  Operand A = as_operand(a);
  Operand B = as_operand(b);
  if (A.layout == kernels::Layout::kColumnMajor && B.layout == kernels::Layout::kColumnMajor) {
    // No kernel reads both operands column-major; one contiguous copy of A makes it row-major.
    A = as_row_major(a);
  }
  return {A, B};
}

// Whether the problem should run on padded copies (see kPadMinWork): a 16-bit problem on a GPU
// with the SM90 kernels, that the kernels would otherwise not give to an SM90 kernel.
bool wants_padding(const kernels::GemmParams& p, int64_t m, int64_t k) {
  if (p.sm != 90 || p.arch_path != kernels::ArchPath::kAuto) return false;
  if (p.dtype_ab != kernels::DType::kFloat16 && p.dtype_ab != kernels::DType::kBFloat16) return false;
  if (static_cast<double>(m) * static_cast<double>(p.n) * static_cast<double>(k) < kPadMinWork) {
    return false;
  }
  if (m > INT_MAX / 2 || k > INT_MAX / 2 || p.n > INT_MAX / 2) return false;
  kernels::GemmParams probe = p;
  probe.m = m;
  probe.k = k;
  const std::string name = kernels::gemm_kernel_name(probe);
  return name.rfind("sm90", 0) != 0;
}

// float32 at precision "highest" on SM90 (see split_tf32.h): problems at least this large run as
// one TF32 GEMM over split operands, 3x the K, on the SM90 kernel that accumulates with fp32 adds
// (config 21); the split costs one pass over A and B and 3x their memory for the duration of the
// call (capped below; above the cap, the SM80 3xTF32 kernels run instead).
constexpr double kSplitMinWork = 1 << 26;
constexpr int64_t kSplitMaxBytes = int64_t{4} << 30;

// K of each split segment: K rounded up to 32 floats (zeros past K), so that every row of the
// split operands starts on a 128-byte boundary for the kernel's TMA loads. (Rounded up to 4, the
// 16-byte minimum, K = 4091 ran at 1.65x cuBLAS fp32 against 1.9-2.2x for the other shapes.)
int64_t split_segment_k(int64_t k) { return (k + 31) / 32 * 32; }

bool wants_tf32_split(const kernels::GemmParams& p, int64_t m, int64_t k) {
  if (p.dtype_ab != kernels::DType::kFloat32 || p.fp32_math != kernels::Fp32Math::kIeee) {
    return false;
  }
  if (p.sm != 90 || p.arch_path != kernels::ArchPath::kAuto) return false;
  if (static_cast<double>(m) * static_cast<double>(p.n) * static_cast<double>(k) < kSplitMinWork) {
    return false;
  }
  constexpr int64_t kMaxRows = int64_t{65535} * 32;  // launch_split_tf32's grid
  if (m > kMaxRows || p.n > kMaxRows || k > INT_MAX / 4) return false;
  const int64_t kp = split_segment_k(k), np = (p.n + 3) / 4 * 4;
  // The split operands, and a padded copy of D where D itself cannot be the kernel's output.
  return (3 * (m + np) * kp + m * np) * 4 <= kSplitMaxBytes;
}

// A stable C string for a name built at run time (last_kernel_name() hands out raw pointers).
const char* intern(const std::string& name) {
  static std::mutex mutex;
  static std::set<std::string> names;
  std::lock_guard<std::mutex> lock(mutex);
  return names.insert(name).first->c_str();
}

void gemm_impl(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& d,
               const std::optional<at::Tensor>& bias, bool accumulate, bool allow_rewrite,
               bool split_operands);

// The 3xTF32 path: split A and B into K-major [big | big | small] / [big | small | big] operands
// (K padded with zeros, split_segment_k) and run one TF32 GEMM over them (the kernel's name gets
// the prefix "3xtf32_split+"). The SM90 kernel writes D with TMA, in 16-byte aligned rows: where
// D's are not (N not a multiple of 4, or its address or row stride), it writes a padded copy
// [M, N rounded up to 4] (B's extra rows zero), whose first N columns are then copied to D.
void gemm_split_tf32(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& d,
                     const std::optional<at::Tensor>& bias, bool accumulate) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const int64_t kp = split_segment_k(k), np = (n + 3) / 4 * 4;
  const auto options = a.options().memory_format(at::MemoryFormat::Contiguous);
  const at::Tensor a3 = empty_output({m, 3 * kp}, options);
  const at::Tensor b3 = empty_output({np, 3 * kp}, options);
  if (np > n) b3.narrow(0, n, np - n).zero_();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();
  const float* a_ptr = static_cast<const float*>(a.data_ptr());
  const float* b_ptr = static_cast<const float*>(b.data_ptr());
  cudaError_t err = kernels::launch_split_tf32(a_ptr, m, k, a.stride(0), a.stride(1),
                                               static_cast<float*>(a3.data_ptr()), kp,
                                               kernels::kSplitPatternA, stream);
  if (err == cudaSuccess) {
    // Row r of b3 is column r of B: element (r, c) of the source is b[c, r].
    err = kernels::launch_split_tf32(b_ptr, n, k, b.stride(1), b.stride(0),
                                     static_cast<float*>(b3.data_ptr()), kp,
                                     kernels::kSplitPatternB, stream);
  }
  TORCH_CHECK(err == cudaSuccess, "cutlass_nn.", op, ": the 3xTF32 operand split failed for M=",
              std::to_string(m), " N=", std::to_string(n), " K=", std::to_string(k), ": ",
              cudaGetErrorString(err));
  const auto d_addr = reinterpret_cast<uintptr_t>(d.data_ptr());
  const bool d_fits = np == n && d_addr % 16 == 0 && (m <= 1 || d.stride(0) % 4 == 0);
  if (d_fits) {
    gemm_impl(op, a3, b3.t(), d, bias, accumulate, /*allow_rewrite=*/false,
              /*split_operands=*/true);
  } else {
    at::Tensor dp = empty_row_major(d, m, np);
    if (accumulate) dp.narrow(1, 0, n).copy_(d);
    std::optional<at::Tensor> bias_p;
    if (bias.has_value()) bias_p = at::constant_pad_nd(bias->contiguous(), {0, np - n});
    gemm_impl(op, a3, b3.t(), dp, bias_p, accumulate, /*allow_rewrite=*/false,
              /*split_operands=*/true);
    d.copy_(dp.narrow(1, 0, n));
  }
  g_last_kernel = intern(std::string("3xtf32_split+") + g_last_kernel.load());
}

void gemm_impl(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& d,
               const std::optional<at::Tensor>& bias, bool accumulate, bool allow_rewrite,
               bool split_operands) {
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
  TORCH_CHECK(n <= INT_MAX, "cutlass_nn.", op, ": GEMM size N=", std::to_string(n),
                    " must be below 2^31");

  c10::cuda::CUDAGuard guard(a.device());
  set_device_for_tma(op, a);
  auto [A, B] = kernel_operands(a, b);
  at::Tensor bias_contig;
  if (bias.has_value()) bias_contig = bias->contiguous();

  const DeviceInfo& info = device_info(a.get_device());
  kernels::GemmParams p = base_params(A, B, a, d, n, info, split_operands);
  // Pointers are set below; the probe only needs the operand addresses for alignment.
  p.a = A.ptr;
  p.b = B.ptr;
  p.d = d.data_ptr();
  p.c = bias.has_value() && !accumulate ? bias_contig.data_ptr() : nullptr;
  p.c_row_broadcast = bias.has_value() && !accumulate;
  p.beta = (accumulate || bias.has_value()) ? 1.0f : 0.0f;
  if (accumulate) {
    p.c = p.d;
    p.ldc = p.ldd;
  }
  if (allow_rewrite && wants_tf32_split(p, m, k)) {
    gemm_split_tf32(op, a, b, d, bias, accumulate);
    return;
  }
  if (allow_rewrite && wants_padding(p, m, k)) {
    // Misaligned K / N (or M for a column-major A): pad the contiguous extents to multiples of 8
    // (K with zeros, which add nothing to the sums), run the TMA kernel into a padded D, copy the
    // [m, n] block back.
    const bool a_col = A.layout == kernels::Layout::kColumnMajor;
    const bool b_col = B.layout == kernels::Layout::kColumnMajor;
    const int64_t mp = a_col ? round_up8(m) : m;
    const int64_t kp = (!a_col || b_col) ? round_up8(k) : k;
    const int64_t np = round_up8(n);
    const at::Tensor ap = pad_matrix(a, mp, kp);
    const at::Tensor bp = pad_matrix(b, kp, np);
    at::Tensor dp = accumulate ? pad_matrix(d, mp, np) : empty_row_major(d, mp, np);
    std::optional<at::Tensor> bias_p;
    if (bias.has_value()) bias_p = at::constant_pad_nd(bias_contig, {0, np - n});
    gemm_impl(op, ap, bp, dp, bias_p, accumulate, /*allow_rewrite=*/false,
              /*split_operands=*/false);
    d.copy_(dp.narrow(0, 0, m).narrow(1, 0, n));
    return;
  }

  const int64_t a_elem = a.element_size(), d_elem = d.element_size();
  auto* d_ptr = static_cast<char*>(d.data_ptr());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.get_device()).stream();

  // CUTLASS problem sizes are 32-bit: a very tall problem runs as slabs of rows, and a very deep
  // one (wgrad over more than 2^30 tokens) as slabs of K, each after the first adding to D.
  constexpr int64_t kMaxSlab = int64_t{1} << 30;
  const int64_t b_elem = b.element_size();
  const bool row_a = A.layout == kernels::Layout::kRowMajor;
  const bool row_b = B.layout == kernels::Layout::kRowMajor;
  for (int64_t row0 = 0; row0 < m; row0 += kMaxSlab) {
    p.m = std::min(kMaxSlab, m - row0);
    p.d = d_ptr + row0 * p.ldd * d_elem;
    for (int64_t k0 = 0; k0 < k; k0 += kMaxSlab) {
      p.k = std::min(kMaxSlab, k - k0);
      p.a = A.ptr + (row_a ? row0 * A.ld + k0 : row0 + k0 * A.ld) * a_elem;
      p.b = B.ptr + (row_b ? k0 * B.ld : k0) * b_elem;
      if (accumulate || k0 > 0) {  // C aliases D: D += A @ B
        p.beta = 1.0f;
        p.c = p.d;
        p.ldc = p.ldd;
        p.c_row_broadcast = false;
      } else if (bias.has_value()) {  // C is the bias row, broadcast over the rows of D
        p.beta = 1.0f;
        p.c = bias_contig.data_ptr();
        p.ldc = 0;
        p.c_row_broadcast = true;
      } else {
        p.beta = 0.0f;
        p.c = nullptr;
        p.ldc = 0;
        p.c_row_broadcast = false;
      }
      // The autotuned configuration of this problem, if the table has one (or tunes it now).
      kernels::GemmParams q = p;
      apply_autotuned_choice(q, a, stream);
      run_planned(op, kernels::plan_gemm(q), a, d, info, stream);
    }
  }
}

}  // namespace

void gemm(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& d,
          const std::optional<at::Tensor>& bias, bool accumulate) {
  gemm_impl(op, a, b, d, bias, accumulate, /*allow_rewrite=*/true, /*split_operands=*/false);
}

bool gemm_fused_activation(const char* op, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& d, const std::optional<at::Tensor>& bias,
                           kernels::Activation activation, const at::Tensor* aux) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m == 0 || n == 0 || k == 0) return false;
  if (m > INT_MAX || k > INT_MAX || n > INT_MAX) return false;
  if (!is_row_major_output(d) || (aux != nullptr && !is_row_major_output(*aux))) return false;

  c10::cuda::CUDAGuard guard(a.device());
  auto [A, B] = kernel_operands(a, b);
  at::Tensor bias_contig;
  if (bias.has_value()) bias_contig = bias->contiguous();
  const DeviceInfo& info = device_info(a.get_device());
  kernels::GemmParams p = base_params(A, B, a, d, n, info);
  p.m = m;
  p.k = k;
  p.a = A.ptr;
  p.b = B.ptr;
  p.d = d.data_ptr();
  if (bias.has_value()) {
    p.beta = 1.0f;
    p.c = bias_contig.data_ptr();
    p.c_row_broadcast = true;
  }
  p.activation = activation;
  if (aux != nullptr) {
    p.aux = aux->data_ptr();
    p.ldaux = aux->size(0) > 1 ? aux->stride(0) : n;
  }
  const kernels::GemmPlan plan = kernels::plan_gemm(p);
  if (plan.kernel == nullptr) return false;  // no kernel fuses it here
  set_device_for_tma(op, a);
  run_planned(op, plan, a, d, info, c10::cuda::getCurrentCUDAStream(a.get_device()).stream());
  return true;
}

std::vector<int64_t> set_gemm_config(int64_t config, int64_t swizzle, int64_t splits) {
  TORCH_CHECK(config >= -1 && config < kernels::kSm90ConfigCount,
              "cutlass_nn._set_gemm_config: argument 'config' must be -1 (automatic) or an index "
              "below ", std::to_string(kernels::kSm90ConfigCount), ", got ", std::to_string(config));
  TORCH_CHECK(swizzle >= 0 && swizzle <= 8,
              "cutlass_nn._set_gemm_config: argument 'swizzle' must be 0 (automatic) to 8, got ",
              std::to_string(swizzle));
  TORCH_CHECK(splits >= -64 && splits <= 64 && splits != -1,
              "cutlass_nn._set_gemm_config: argument 'splits' must be 0 (automatic), 1 to 64 "
              "(stream-K split-K) or -64 to -2 (batched split-K), got ",
              std::to_string(splits));
  const int previous_config = g_sm90_config.exchange(static_cast<int>(config));
  const int previous_swizzle = g_swizzle.exchange(static_cast<int>(swizzle));
  const int previous_splits = g_splits.exchange(static_cast<int>(splits));
  return {previous_config, previous_swizzle, previous_splits};
}

bool set_epilogue_without_c(bool enabled) { return g_epilogue_without_c.exchange(enabled); }

std::string gemm_config_names() {
  std::string out;
  for (int i = 0; i < kernels::kSm90ConfigCount; ++i) {
    if (i > 0) out += "\n";
    out += kernels::sm90_config_name(i);
  }
  return out;
}

}  // namespace cuda
}  // namespace cutlass_nn
