// Standalone, torch-free self-test of the cutlass_nn GEMM kernel layer (run_gemm()).
//
// For every dtype pair / layout / shape / arch path / epilogue variant / alignment mode it fills
// random inputs on the GPU, runs run_gemm(), and compares with a naive fp64 reference GEMM on the
// GPU. Per element: |out - ref| <= tol(dtype) * (sum_k |alpha a b| + |beta c|) + tiny.
//
// Build: csrc/kernels/tests/build_selftest.sh <cutlass include dir>
// Run:   ./gemm_selftest [-q]      (-q prints FAIL lines only)
// Exit status 0 iff every case passed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "gemm_params.h"

using namespace cutlass_nn::kernels;

#define CHECK_CUDA(expr)                                                          \
  do {                                                                            \
    cudaError_t err_ = (expr);                                                    \
    if (err_ != cudaSuccess) {                                                    \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(err_), \
                   __FILE__, __LINE__, #expr);                                    \
      std::exit(2);                                                               \
    }                                                                             \
  } while (0)

namespace {

size_t esize(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    default:
      return 8;
  }
}

const char* dname(DType t) {
  switch (t) {
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat32:
      return "f32";
    default:
      return "f64";
  }
}

__device__ double load(const void* p, int64_t i, DType t) {
  switch (t) {
    case DType::kFloat16:
      return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kFloat32:
      return static_cast<const float*>(p)[i];
    default:
      return static_cast<const double*>(p)[i];
  }
}

__device__ void store(void* p, int64_t i, DType t, double v) {
  switch (t) {
    case DType::kFloat16:
      static_cast<__half*>(p)[i] = __float2half(static_cast<float>(v));
      break;
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(static_cast<float>(v));
      break;
    case DType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    default:
      static_cast<double*>(p)[i] = v;
  }
}

__global__ void fill_random(void* p, int64_t count, DType t, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = (uint64_t(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    double u = double(x >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
    store(p, i, t, 2.0 * u - 1.0);
  }
}

// ref[i, j] = alpha * sum_k A[i, k] B[k, j] + beta * C[i, j]; mag = the same with absolute values.
__global__ void reference_gemm(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                               bool a_row, const void* b, int64_t ldb, bool b_row, DType tab,
                               const void* c, int64_t ldc, bool c_bcast, DType tcd, double alpha,
                               double beta, double* ref, double* mag) {
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= m * n) return;
  int64_t i = idx / n, j = idx % n;
  double s = 0, sa = 0;
  for (int64_t kk = 0; kk < k; ++kk) {
    double x = load(a, a_row ? i * lda + kk : i + kk * lda, tab);
    double y = load(b, b_row ? kk * ldb + j : kk + j * ldb, tab);
    s += x * y;
    sa += std::fabs(x * y);
  }
  double r = alpha * s, g = std::fabs(alpha) * sa;
  if (c != nullptr && beta != 0) {
    double cv = load(c, c_bcast ? j : i * ldc + j, tcd);
    r += beta * cv;
    g += std::fabs(beta * cv);
  }
  ref[idx] = r;
  mag[idx] = g;
}

__global__ void compare(int64_t m, int64_t n, const void* d, int64_t ldd, DType t,
                        const double* ref, const double* mag, double tol,
                        unsigned long long* bad, double* worst) {
  int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= m * n) return;
  int64_t i = idx / n, j = idx % n;
  double v = load(d, i * ldd + j, t);
  double e = std::fabs(v - ref[idx]);
  double rel = e / (mag[idx] + 1e-30);
  if (!(e <= tol * mag[idx] + 1e-30)) atomicAdd(bad, 1ull);  // NaN counts as bad
  // Relative errors are in [0, inf); their bit patterns order like the values.
  if (rel == rel) {
    atomicMax(reinterpret_cast<unsigned long long*>(worst),
              static_cast<unsigned long long>(__double_as_longlong(rel)));
  }
}

struct Buffer {
  void* base = nullptr;
  void* ptr = nullptr;  // base + offset elements
  ~Buffer() {
    if (base != nullptr) cudaFree(base);
  }
};

void alloc_fill(Buffer& buf, int64_t elements, int64_t offset, DType t, uint64_t seed) {
  const int64_t total = elements + offset + 8;
  CHECK_CUDA(cudaMalloc(&buf.base, total * esize(t)));
  fill_random<<<1024, 256>>>(buf.base, total, t, seed);
  CHECK_CUDA(cudaGetLastError());
  buf.ptr = static_cast<char*>(buf.base) + offset * esize(t);
}

struct Combo {
  DType ab, cd;
  Fp32Math math;
  double out_tol;  // output rounding (and TF32 input rounding), relative to the magnitude sum
  double acc_eps;  // unit roundoff of the accumulator
  // Random-sign accumulation error grows like sqrt(k); 8x margin.
  double tol(int64_t k) const { return out_tol + 8.0 * std::sqrt(double(k)) * acc_eps; }
};

// Alignment modes: kAligned (16-byte pointers and lds), kAlign4Bytes (4-byte pointer offset and
// ld padding: the 16-bit align2 / TF32 align1 kernels), kAlign1 (1-element offsets: fallback,
// SIMT, DMMA).
enum AlignMode { kAligned, kAlign4Bytes, kAlign1, kNumAlignModes };
const char* kAlignName[] = {"aligned", "align4bytes", "align1"};

enum Variant { kPlain, kBias, kBiasScaled, kInplace, kAlphaBeta, kNumVariants };
const char* kVariantName[] = {"plain", "bias", "bias_scaled", "inplace_beta1", "alpha_beta"};

int g_passed = 0, g_failed = 0;
bool g_quiet = false;

void run_case(const Combo& cb, Layout la, Layout lb, int64_t m, int64_t n, int64_t k,
              ArchPath arch, Variant variant, AlignMode amode, int sm, int sms) {
  const bool a_row = la == Layout::kRowMajor, b_row = lb == Layout::kRowMajor;
  const int64_t four_bytes = static_cast<int64_t>(4 / esize(cb.ab)) > 0 ? 4 / esize(cb.ab) : 1;
  const int64_t off = amode == kAligned ? 0 : amode == kAlign4Bytes ? four_bytes : 1;
  const int64_t pad = amode == kAligned ? 8 : off;
  const int64_t lda = (a_row ? k : m) + pad, ldb = (b_row ? n : k) + pad, ldd = n + pad;
  const int64_t ldc = n + (amode == kAligned ? 0 : 3 * off);
  uint64_t seed = (uint64_t(m) * 1315423911u) ^ (uint64_t(n) << 20) ^ (uint64_t(k) << 40) ^
                  (uint64_t(variant) << 8) ^ uint64_t(cb.ab) * 77;

  Buffer A, B, C, D;
  alloc_fill(A, (a_row ? m : k) * lda, off, cb.ab, seed + 1);
  alloc_fill(B, (b_row ? k : n) * ldb, off, cb.ab, seed + 2);
  alloc_fill(D, m * ldd, off, cb.cd, seed + 3);

  GemmParams p;
  p.m = m, p.n = n, p.k = k;
  p.a = A.ptr, p.lda = lda, p.layout_a = la;
  p.b = B.ptr, p.ldb = ldb, p.layout_b = lb;
  p.d = D.ptr, p.ldd = ldd;
  p.dtype_ab = cb.ab, p.dtype_cd = cb.cd;
  p.fp32_math = cb.math;
  p.arch_path = arch;
  p.sm = sm;
  p.multiprocessors = sms;

  switch (variant) {
    case kPlain:  // D holds NaN: a kernel that reads C with beta == 0 fails the test
      CHECK_CUDA(cudaMemset(D.base, 0xFF, (m * ldd + off + 8) * esize(cb.cd)));
      break;
    case kBias:
    case kBiasScaled:
      alloc_fill(C, n, off, cb.cd, seed + 4);
      p.c = C.ptr, p.c_row_broadcast = true, p.ldc = 12345;  // ldc must be ignored
      p.beta = variant == kBias ? 1.0f : 0.5f;
      p.alpha = variant == kBias ? 1.0f : 2.0f;
      break;
    case kInplace:
      p.c = D.ptr, p.ldc = ldd, p.beta = 1.0f;
      break;
    case kAlphaBeta:
      alloc_fill(C, m * ldc, off, cb.cd, seed + 5);
      p.c = C.ptr, p.ldc = ldc, p.alpha = 0.5f, p.beta = -0.75f;
      break;
    default:
      break;
  }

  // Reference first (in-place variants overwrite C == D).
  double *ref = nullptr, *mag = nullptr, *worst = nullptr;
  unsigned long long* bad = nullptr;
  CHECK_CUDA(cudaMalloc(&ref, m * n * sizeof(double)));
  CHECK_CUDA(cudaMalloc(&mag, m * n * sizeof(double)));
  CHECK_CUDA(cudaMalloc(&worst, sizeof(double)));
  CHECK_CUDA(cudaMalloc(&bad, sizeof(unsigned long long)));
  CHECK_CUDA(cudaMemset(worst, 0, sizeof(double)));
  CHECK_CUDA(cudaMemset(bad, 0, sizeof(unsigned long long)));
  const int64_t blocks = (m * n + 255) / 256;
  reference_gemm<<<blocks, 256>>>(m, n, k, p.a, lda, a_row, p.b, ldb, b_row, cb.ab, p.c, p.ldc,
                                  p.c_row_broadcast, cb.cd, p.alpha, p.beta, ref, mag);
  CHECK_CUDA(cudaGetLastError());

  const char* kname = gemm_kernel_name(p);
  size_t ws_bytes = gemm_workspace_size(p);
  void* ws = nullptr;
  if (ws_bytes > 0) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaDeviceSynchronize());
  const char* detail = nullptr;
  GemmStatus st = run_gemm(p, ws, ws_bytes, stream, &detail);
  cudaError_t sync = cudaStreamSynchronize(stream);

  char desc[320];
  std::snprintf(desc, sizeof(desc),
                "%s->%s%s %c%c m=%lld n=%lld k=%lld arch=%s %s %s kernel=%s", dname(cb.ab),
                dname(cb.cd),
                cb.ab == DType::kFloat32 ? (cb.math == Fp32Math::kTf32 ? "(tf32)" : "(ieee)") : "",
                a_row ? 'T' : 'N', b_row ? 'N' : 'T', (long long)m, (long long)n, (long long)k,
                arch == ArchPath::kAuto ? "auto" : "sm80", kVariantName[variant],
                kAlignName[amode], kname[0] ? kname : "(none)");

  const bool expect_unsupported = !a_row && !b_row;
  bool ok;
  double worst_h = 0;
  unsigned long long bad_h = 0;
  if (sync != cudaSuccess) {
    std::printf("FAIL %s: CUDA error %s\n", desc, cudaGetErrorString(sync));
    std::exit(3);  // the context is unusable after a kernel fault
  }
  if (expect_unsupported) {
    ok = st == GemmStatus::kUnsupported;
  } else if (st != GemmStatus::kSuccess) {
    ok = false;
  } else {
    compare<<<blocks, 256>>>(m, n, p.d, ldd, cb.cd, ref, mag, cb.tol(k), bad, worst);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaMemcpy(&bad_h, bad, sizeof(bad_h), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(&worst_h, worst, sizeof(worst_h), cudaMemcpyDeviceToHost));
    ok = bad_h == 0;
  }
  if (ok) {
    ++g_passed;
    if (!g_quiet) std::printf("PASS %s max_rel_err=%.3g\n", desc, worst_h);
  } else {
    ++g_failed;
    std::printf("FAIL %s status=%s detail=%s bad=%llu max_rel_err=%.3g tol=%.3g\n", desc,
                gemm_status_string(st), detail ? detail : "", bad_h, worst_h, cb.tol(k));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (ws) CHECK_CUDA(cudaFree(ws));
  CHECK_CUDA(cudaFree(ref));
  CHECK_CUDA(cudaFree(mag));
  CHECK_CUDA(cudaFree(worst));
  CHECK_CUDA(cudaFree(bad));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-q") == 0) g_quiet = true;
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
  const int sm = prop.major * 10 + prop.minor;
  std::printf("device %d: %s sm_%d, %d SMs\n", dev, prop.name, sm, prop.multiProcessorCount);

  // Tolerances relative to sum_k |alpha a b| + |beta c|: output rounding dominates for 16-bit
  // outputs; TF32 rounds the inputs to 10-bit mantissas; fp32 accumulation error grows with k.
  const Combo combos[] = {
      {DType::kFloat16, DType::kFloat16, Fp32Math::kTf32, 1e-3, 6e-8},
      {DType::kBFloat16, DType::kBFloat16, Fp32Math::kTf32, 8e-3, 6e-8},
      {DType::kFloat16, DType::kFloat32, Fp32Math::kTf32, 1e-7, 6e-8},
      {DType::kBFloat16, DType::kFloat32, Fp32Math::kTf32, 1e-7, 6e-8},
      {DType::kFloat32, DType::kFloat32, Fp32Math::kTf32, 4e-3, 6e-8},
      {DType::kFloat32, DType::kFloat32, Fp32Math::kIeee, 1e-7, 6e-8},
      {DType::kFloat64, DType::kFloat64, Fp32Math::kTf32, 1e-15, 1.2e-16},
  };
  // Odd shapes from {1, 7, 33, 129, 1000, 4097} plus aligned ones that reach the 16-byte paths.
  const int64_t shapes[][3] = {
      {1, 1, 1},       {7, 33, 129},    {33, 7, 1000},    {129, 1000, 7},  {1000, 129, 33},
      {4097, 7, 129},  {1, 4097, 1000}, {129, 129, 4097}, {1000, 1000, 1000},
      {128, 256, 64},  {1000, 4096, 512}, {4097, 1024, 1000}, {256, 512, 4096}, {8, 8, 8},
  };
  const Layout layouts[][2] = {{Layout::kRowMajor, Layout::kColumnMajor},
                               {Layout::kRowMajor, Layout::kRowMajor},
                               {Layout::kColumnMajor, Layout::kRowMajor},
                               {Layout::kColumnMajor, Layout::kColumnMajor}};

  for (const Combo& cb : combos) {
    for (const auto& lay : layouts) {
      const bool colcol = lay[0] == Layout::kColumnMajor && lay[1] == Layout::kColumnMajor;
      for (const auto& s : shapes) {
        for (ArchPath arch : {ArchPath::kAuto, ArchPath::kSm80}) {
          for (int v = 0; v < kNumVariants; ++v) {
            for (int am = 0; am < kNumAlignModes; ++am) {
              if (colcol && (v != kPlain || arch != ArchPath::kAuto || am != kAligned)) continue;
              run_case(cb, lay[0], lay[1], s[0], s[1], s[2], arch, static_cast<Variant>(v),
                       static_cast<AlignMode>(am), sm, prop.multiProcessorCount);
            }
          }
        }
      }
    }
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
