// Standalone self-test of csrc/kernels/elementwise.cu (no torch).
//
// Build (from the repository root):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a \
//        -gencode=arch=compute_80,code=[sm_80,compute_80] -Icsrc/kernels \
//        csrc/kernels/elementwise.cu csrc/kernels/tests/elementwise_selftest.cu \
//        -L/usr/local/cuda/lib64 -lcudart -o elementwise_selftest
// Run:
//   ./elementwise_selftest            correctness cases, prints PASS/FAIL per case
//   ./elementwise_selftest --huge     + add2 with numel > 2^31 (needs ~13 GB of GPU memory)
//   ./elementwise_selftest --bench    + timings (GB/s) of add2 and column_sum
// Exit status 0 iff every case passed.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "elementwise.h"

using cutlass_nn::kernels::DType;
using cutlass_nn::kernels::launch_add2;
using cutlass_nn::kernels::launch_column_sum;

namespace {

int g_passed = 0, g_failed = 0;
int g_sms = 0;

void report(bool ok, const std::string& name, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.empty() ? "" : "  ",
              detail.c_str());
  (ok ? g_passed : g_failed)++;
}

#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, \
                   __LINE__, #expr);                                                        \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
    case DType::kFloat64: return "fp64";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
  }
  return 0;
}

// Host conversions (the cuda_fp16 / cuda_bf16 conversion functions are host-callable and
// round to nearest even).
double load_elem(DType t, const unsigned char* p) {
  switch (t) {
    case DType::kFloat16: { __half h; std::memcpy(&h, p, 2); return __half2float(h); }
    case DType::kBFloat16: { __nv_bfloat16 h; std::memcpy(&h, p, 2); return __bfloat162float(h); }
    case DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::kFloat64: { double d; std::memcpy(&d, p, 8); return d; }
  }
  return 0;
}

// Stores v rounded once to t (for fp16/bf16 via float, which is exact when v is a float).
void store_elem(DType t, unsigned char* p, double v) {
  switch (t) {
    case DType::kFloat16: { __half h = __float2half_rn(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kBFloat16: { __nv_bfloat16 h = __float2bfloat16_rn(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::kFloat32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case DType::kFloat64: std::memcpy(p, &v, 8); break;
  }
}

std::mt19937_64 g_rng(12345);

void fill_random(DType t, unsigned char* p, size_t n) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  const size_t es = dtype_size(t);
  for (size_t i = 0; i < n; ++i) store_elem(t, p + i * es, dist(g_rng));
}

constexpr unsigned char kSentinel = 0xA7;

// ---------------------------------------------------------------------------------------------
// add2
// ---------------------------------------------------------------------------------------------

// offsets in elements of a, b, out from a 256-byte aligned cudaMalloc base.
void test_add2(DType t, int64_t n, int oa, int ob, int oo) {
  const size_t es = dtype_size(t);
  const size_t bytes = (static_cast<size_t>(n) + 2) * es;  // room for the offset + 1 guard
  std::vector<unsigned char> ha(bytes), hb(bytes), ho(bytes, kSentinel), ref(bytes, kSentinel);
  fill_random(t, ha.data(), n + 2);
  fill_random(t, hb.data(), n + 2);
  for (int64_t i = 0; i < n; ++i) {
    const double x = load_elem(t, ha.data() + (oa + i) * es);
    const double y = load_elem(t, hb.data() + (ob + i) * es);
    // torch semantics: fp16/bf16/fp32 add in float and round once; fp64 in double.
    const double s = t == DType::kFloat64 ? x + y
                                          : static_cast<double>(static_cast<float>(x) +
                                                                static_cast<float>(y));
    store_elem(t, ref.data() + (oo + i) * es, s);
  }
  unsigned char *da, *db, *dout;
  CUDA_CHECK(cudaMalloc(&da, bytes));
  CUDA_CHECK(cudaMalloc(&db, bytes));
  CUDA_CHECK(cudaMalloc(&dout, bytes));
  CUDA_CHECK(cudaMemcpy(da, ha.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(db, hb.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dout, kSentinel, bytes));
  cudaError_t st = launch_add2(t, da + oa * es, db + ob * es, dout + oo * es, n, g_sms, 0);
  cudaError_t sync = cudaDeviceSynchronize();
  CUDA_CHECK(cudaMemcpy(ho.data(), dout, bytes, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(da));
  CUDA_CHECK(cudaFree(db));
  CUDA_CHECK(cudaFree(dout));

  char name[128];
  std::snprintf(name, sizeof(name), "add2 %s n=%lld off(a,b,out)=(%d,%d,%d)", dtype_name(t),
                static_cast<long long>(n), oa, ob, oo);
  if (st != cudaSuccess || sync != cudaSuccess) {
    report(false, name, std::string("status ") + cudaGetErrorName(st) + " / " +
                            cudaGetErrorName(sync));
    return;
  }
  // Bitwise comparison of the whole buffer: the result range and the untouched guard bytes.
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < bytes; ++i)
    if (ho[i] != ref[i]) { if (first < 0) first = static_cast<int64_t>(i); ++bad; }
  char detail[160] = "";
  if (bad) {
    const int64_t e = first / static_cast<int64_t>(es) - oo;
    std::snprintf(detail, sizeof(detail), "%lld bad bytes, first at element %lld", 
                  static_cast<long long>(bad), static_cast<long long>(e));
  }
  report(bad == 0, name, detail);
}

// numel > 2^31: data generated on the device, sampled indices checked on the host.
__global__ void fill_pattern(__half* a, __half* b, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    a[i] = __float2half_rn(static_cast<float>(i % 1000) * 0.125f);
    b[i] = __float2half_rn(static_cast<float>(i % 777) * 0.0625f);
  }
}

void test_add2_huge(int offset) {
  const int64_t n = (int64_t(1) << 31) + 13;
  __half *a, *b, *o;
  if (cudaMalloc(&a, (n + 1) * 2) != cudaSuccess || cudaMalloc(&b, (n + 1) * 2) != cudaSuccess ||
      cudaMalloc(&o, (n + 1) * 2) != cudaSuccess) {
    (void)cudaGetLastError();
    report(false, "add2 huge: cudaMalloc failed");
    return;
  }
  fill_pattern<<<4096, 256>>>(a, b, n + 1);
  CUDA_CHECK(cudaMemset(o, 0, (n + 1) * 2));
  cudaError_t st = launch_add2(DType::kFloat16, a + offset, b + offset, o + offset, n, g_sms, 0);
  cudaError_t sync = cudaDeviceSynchronize();
  std::vector<int64_t> idx = {0, 1, 7, 8, (1ll << 31) - 1, 1ll << 31, (1ll << 31) + 1, n - 9,
                              n - 8, n - 1};
  for (int k = 0; k < 1000; ++k) idx.push_back(static_cast<int64_t>(g_rng() % n));
  int bad = 0;
  for (int64_t i : idx) {
    __half got;
    CUDA_CHECK(cudaMemcpy(&got, o + offset + i, 2, cudaMemcpyDeviceToHost));
    const int64_t j = i + offset;
    const float want = __half2float(__float2half_rn(
        __half2float(__float2half_rn(static_cast<float>(j % 1000) * 0.125f)) +
        __half2float(__float2half_rn(static_cast<float>(j % 777) * 0.0625f))));
    if (__half2float(got) != want) ++bad;
  }
  CUDA_CHECK(cudaFree(a));
  CUDA_CHECK(cudaFree(b));
  CUDA_CHECK(cudaFree(o));
  char name[96];
  std::snprintf(name, sizeof(name), "add2 fp16 huge n=2^31+13 offset=%d", offset);
  report(st == cudaSuccess && sync == cudaSuccess && bad == 0, name,
         bad ? std::to_string(bad) + " wrong samples" : "");
}

// ---------------------------------------------------------------------------------------------
// column_sum
// ---------------------------------------------------------------------------------------------

// x has `rows` rows of stride `ld` starting `off` elements after an aligned base.
void test_column_sum(DType t, DType ot, int64_t rows, int64_t cols, int64_t ld, int off,
                     bool check_determinism = false) {
  const size_t es = dtype_size(t), oes = dtype_size(ot);
  const size_t xelems = static_cast<size_t>(off) + (rows > 0 ? (rows - 1) * ld + cols : 0) + 1;
  const size_t xbytes = xelems * es;
  const size_t obytes = (static_cast<size_t>(cols) + 1) * oes;  // + 1 guard element
  std::vector<unsigned char> hx(xbytes), ho(obytes), ho2(obytes);
  fill_random(t, hx.data(), xelems);
  std::vector<double> ref(cols, 0.0), sabs(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double v = load_elem(t, hx.data() + (off + i * ld + j) * es);
      ref[j] += v;
      sabs[j] += std::fabs(v);
    }
  unsigned char *dx, *dout;
  CUDA_CHECK(cudaMalloc(&dx, xbytes));
  CUDA_CHECK(cudaMalloc(&dout, obytes));
  CUDA_CHECK(cudaMemcpy(dx, hx.data(), xbytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dout, kSentinel, obytes));
  cudaError_t st = launch_column_sum(t, dx + off * es, rows, cols, ld, ot, dout, g_sms, 0);
  cudaError_t sync = cudaDeviceSynchronize();
  CUDA_CHECK(cudaMemcpy(ho.data(), dout, obytes, cudaMemcpyDeviceToHost));
  bool same = true;
  if (check_determinism) {
    CUDA_CHECK(cudaMemset(dout, kSentinel, obytes));
    CUDA_CHECK(launch_column_sum(t, dx + off * es, rows, cols, ld, ot, dout, g_sms, 0));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(ho2.data(), dout, obytes, cudaMemcpyDeviceToHost));
    same = ho == ho2;
  }
  CUDA_CHECK(cudaFree(dx));
  CUDA_CHECK(cudaFree(dout));

  char name[160];
  std::snprintf(name, sizeof(name), "column_sum %s->%s rows=%lld cols=%lld ld=%lld off=%d",
                dtype_name(t), dtype_name(ot), static_cast<long long>(rows),
                static_cast<long long>(cols), static_cast<long long>(ld), off);
  if (st != cudaSuccess || sync != cudaSuccess) {
    report(false, name, std::string("status ") + cudaGetErrorName(st) + " / " +
                            cudaGetErrorName(sync));
    return;
  }
  // Accumulation error (float: generous 1e-5 * sum|x|, far below one dropped or doubled row)
  // plus the final rounding to the output type.
  const double acc_eps = t == DType::kFloat64 ? 1e-13 : 1e-5;
  const double out_eps = ot == DType::kFloat16 ? std::ldexp(1.0, -11)
                       : ot == DType::kBFloat16 ? std::ldexp(1.0, -8)
                       : ot == DType::kFloat32 ? std::ldexp(1.0, -24)
                                               : std::ldexp(1.0, -53);
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (int64_t j = 0; j < cols; ++j) {
    const double got = load_elem(ot, ho.data() + j * oes);
    const double err = std::fabs(got - ref[j]);
    const double tol = acc_eps * sabs[j] + out_eps * std::fabs(ref[j]) + 1e-300;
    if (!(err <= tol)) { if (first < 0) first = j; ++bad; }
    if (rows == 0 && got != 0.0) { if (first < 0) first = j; ++bad; }
    worst = std::max(worst, err);
  }
  bool guard_ok = true;
  for (size_t i = cols * oes; i < obytes; ++i) guard_ok &= ho[i] == kSentinel;
  char detail[200] = "";
  if (bad || !guard_ok || !same)
    std::snprintf(detail, sizeof(detail), "%lld bad cols (first %lld), max err %.3g%s%s",
                  static_cast<long long>(bad), static_cast<long long>(first), worst,
                  guard_ok ? "" : ", wrote past cols", same ? "" : ", not deterministic");
  report(bad == 0 && guard_ok && same, name, detail);
}

// ---------------------------------------------------------------------------------------------
// Argument / status checks
// ---------------------------------------------------------------------------------------------

void test_status() {
  const DType bogus = static_cast<DType>(7);
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, 256));
  report(launch_add2(bogus, p, p, p, 4, g_sms, 0) == cudaErrorInvalidValue,
         "add2 unknown dtype -> cudaErrorInvalidValue");
  report(launch_add2(DType::kFloat32, nullptr, nullptr, nullptr, 0, g_sms, 0) == cudaSuccess,
         "add2 numel=0 with null pointers -> cudaSuccess");
  report(launch_column_sum(bogus, p, 4, 4, 4, DType::kFloat32, p, g_sms, 0) ==
             cudaErrorInvalidValue,
         "column_sum unknown dtype -> cudaErrorInvalidValue");
  report(launch_column_sum(DType::kFloat32, p, 4, 4, 4, DType::kFloat16, p, g_sms, 0) ==
             cudaErrorInvalidValue,
         "column_sum fp32->fp16 -> cudaErrorInvalidValue");
  report(launch_column_sum(DType::kFloat16, nullptr, 4, 0, 4, DType::kFloat32, nullptr, g_sms,
                           0) == cudaSuccess,
         "column_sum cols=0 -> cudaSuccess");
  report(cudaDeviceSynchronize() == cudaSuccess, "no asynchronous error after status checks");
  CUDA_CHECK(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------
// Timings
// ---------------------------------------------------------------------------------------------

template <typename F> float time_ms(F f, int iters = 20) {
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  f();  // warm-up
  CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) f();
  CUDA_CHECK(cudaEventRecord(e1));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return ms / iters;
}

void bench() {
  const size_t big = size_t(1) << 30;  // bytes per buffer
  unsigned char *a, *b, *o;
  CUDA_CHECK(cudaMalloc(&a, big + 64));
  CUDA_CHECK(cudaMalloc(&b, big + 64));
  CUDA_CHECK(cudaMalloc(&o, big + 64));
  CUDA_CHECK(cudaMemset(a, 0, big + 64));
  CUDA_CHECK(cudaMemset(b, 0, big + 64));
  for (DType t : {DType::kFloat16, DType::kFloat32}) {
    const int64_t n = big / dtype_size(t);
    for (int off : {0, 1}) {
      const size_t ob = off * dtype_size(t);
      const float ms = time_ms([&] {
        CUDA_CHECK(launch_add2(t, a + ob, b + ob, o + ob, n - off, g_sms, 0));
      });
      std::printf("BENCH add2 %s n=%lld %s: %.3f ms, %.0f GB/s\n", dtype_name(t),
                  static_cast<long long>(n), off ? "misaligned(scalar)" : "aligned(vec)", ms,
                  3.0 * big / ms / 1e6);
    }
  }
  struct Shape { DType t, ot; int64_t rows, cols; int off; };
  const Shape shapes[] = {
      {DType::kFloat16, DType::kFloat32, 16384, 4096, 0},
      {DType::kBFloat16, DType::kBFloat16, 16384, 4096, 0},
      {DType::kFloat32, DType::kFloat32, 16384, 4096, 0},
      {DType::kFloat16, DType::kFloat32, 16384, 4096, 1},
      {DType::kFloat16, DType::kFloat32, 16384, 1024, 0},
      {DType::kFloat16, DType::kFloat32, 16384, 11008, 0},
      {DType::kFloat16, DType::kFloat32, 16, 4096, 0},
      {DType::kFloat32, DType::kFloat32, 16, 4096, 0},
      {DType::kFloat16, DType::kFloat32, 16, 65536, 0},
  };
  for (const Shape& s : shapes) {
    const size_t es = dtype_size(s.t);
    const float ms = time_ms([&] {
      CUDA_CHECK(launch_column_sum(s.t, a + s.off * es, s.rows, s.cols, s.cols, s.ot, o, g_sms, 0));
    });
    std::printf("BENCH column_sum %s->%s %lldx%lld off=%d: %.4f ms, %.0f GB/s\n",
                dtype_name(s.t), dtype_name(s.ot), static_cast<long long>(s.rows),
                static_cast<long long>(s.cols), s.off, ms, s.rows * s.cols * es / ms / 1e6);
  }
  CUDA_CHECK(cudaFree(a));
  CUDA_CHECK(cudaFree(b));
  CUDA_CHECK(cudaFree(o));
}

}  // namespace

int main(int argc, char** argv) {
  bool huge = false, do_bench = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--huge")) huge = true;
    else if (!std::strcmp(argv[i], "--bench")) do_bench = true;
  }
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device %s, %d SMs\n", prop.name, g_sms);

  const DType all[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};

  test_status();

  // add2: odd sizes, aligned and misaligned (by one element) pointers.
  const int offsets[][3] = {{0, 0, 0}, {1, 1, 1}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  for (DType t : all)
    for (int64_t n : {0ll, 1ll, 3ll, 7ll, 8ll, 1000003ll})
      for (const auto& o : offsets) test_add2(t, n, o[0], o[1], o[2]);

  // column_sum: x aligned / shifted by one element / padded (odd) ld.
  for (DType t : all) {
    std::vector<DType> outs = {t};
    if (t == DType::kFloat16 || t == DType::kBFloat16) outs.push_back(DType::kFloat32);
    for (DType ot : outs)
      for (int64_t rows : {0ll, 1ll, 16ll, 1000ll})
        for (int64_t cols : {1ll, 3ll, 4096ll}) {
          test_column_sum(t, ot, rows, cols, cols, 0);
          test_column_sum(t, ot, rows, cols, cols, 1);
          test_column_sum(t, ot, rows, cols, cols + 1, 0);
        }
  }
  // Ragged last vector (cols not a multiple of the pack), ld > cols aligned, tall shapes,
  // and bitwise run-to-run reproducibility.
  test_column_sum(DType::kFloat16, DType::kFloat32, 1000, 4099, 4104, 0, true);
  test_column_sum(DType::kFloat32, DType::kFloat32, 1000, 1001, 1004, 0, true);
  test_column_sum(DType::kFloat16, DType::kFloat32, 16384, 4096, 4096, 0, true);
  test_column_sum(DType::kBFloat16, DType::kBFloat16, 16384, 4096, 4096, 0, true);
  test_column_sum(DType::kFloat32, DType::kFloat32, 100000, 3, 3, 0, true);

  if (huge) {
    test_add2_huge(0);
    test_add2_huge(1);
  }
  if (do_bench) bench();

  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
