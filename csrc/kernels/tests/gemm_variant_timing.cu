// Torch-free timing of experimental SM90 GEMM variants (gemm_variants.cuh) against cuBLAS, at
// given problem shapes, for deciding which tile / cluster / schedule / epilogue changes are
// worth a configuration of the library (scripts/gemm_variant_ab.sh builds and runs it).
//
//   gemm_variant_timing [--rounds R] [--samples S] [--iters I] [--gap-us G] [--rasters 0,1,2]
//                       [--swizzles 1,2] MxNxK:tn|nn|nt ...
//
// bfloat16, D = A @ B, A row-major, B column-major (tn, a linear layer's forward) or row-major
// (nn, its dgrad), or A column-major and B row-major (nt, its weight gradient). Each problem runs on rotating operand sets covering twice the L2, so that no
// launch finds its operands in the L2 of the one before. Correctness first: each variant's D on
// the first set is compared with cuBLAS's (relative max difference, bf16 output). Timing: R
// rounds, the variants in alternating order (cuBLAS among them); in each, S samples of I
// launches between two CUDA events, cycling the operand sets; a variant's figure is the median
// microseconds per launch over all its samples. Prints one line per (problem, variant, raster,
// swizzle): microseconds, ratio cuBLAS time / ours (> 1: faster than cuBLAS), the correctness
// check ("MISMATCH" is reported, not fatal: the exit code says only whether the run completed).
//
// Power: back-to-back launches of a large GEMM hold an H100 / H200 at its power limit (700 W,
// the SM clock at 1230-1500 MHz instead of 1980), so their times measure energy per GEMM, not
// what the GEMM takes inside a training step, where lighter kernels around it keep the clock
// up. --gap-us G sleeps G microseconds on the host before each sample (the GPU idles); with
// --iters 1 each sample then times one launch, which follows the gap and one untimed launch
// (that one keeps the host's enqueue out of the timed interval), and the large GEMMs' times
// come within 2% of those measured inside training steps.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gemm_variants.cuh"
#include "timing_common.cuh"

namespace {

using cutlass_nn::variants::OperandSet;
using cutlass_nn::variants::Prepared;
using cutlass_nn::variants::Problem;

// cuBLAS on the same operands: D row-major [m, n] is D^T column-major [n, m] = op(B) op(A)
// with B read as an n x k (tn: column-major k x n, transposed) or k x n matrix (nn, nt), and A
// as a k x m (tn, nn) or m x k matrix (nt: A column-major, transposed).
class PreparedCublas final : public Prepared {
 public:
  PreparedCublas(cublasHandle_t handle, const Problem& pr, const std::vector<OperandSet>& sets)
      : handle_(handle), pr_(pr), sets_(sets) {}
  bool launch(int set, cudaStream_t stream) override {
    const float alpha = 1.0f, beta = 0.0f;
    const OperandSet& s = sets_[set];
    cublasSetStream(handle_, stream);
    const int m = static_cast<int>(pr_.m), n = static_cast<int>(pr_.n), k = static_cast<int>(pr_.k);
    const cublasOperation_t op_b = pr_.b_row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
    const int ldb = pr_.b_row_major ? n : k;
    const cublasOperation_t op_a = pr_.a_col_major ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int lda = pr_.a_col_major ? m : k;
    return cublasGemmEx(handle_, op_b, op_a, n, m, k, &alpha, s.b, CUDA_R_16BF, ldb, s.a,
                        CUDA_R_16BF, lda, &beta, s.d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  }

 private:
  cublasHandle_t handle_;
  Problem pr_;
  std::vector<OperandSet> sets_;
};

struct Buffers {
  std::vector<void*> owned;
  std::vector<OperandSet> sets;
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }
};

void* device_bf16(int64_t count, unsigned seed, std::vector<void*>* owned) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, count * sizeof(__nv_bfloat16)));
  owned->push_back(p);
  cutlass_nn::timing::fill_bf16(static_cast<__nv_bfloat16*>(p), count, seed, 2.0f);
  return p;
}

// Operand sets (A, B, D each) whose bytes together cover at least twice the L2, at least 2.
void make_sets(const Problem& pr, int l2_bytes, Buffers* buf) {
  const int64_t per_set = (pr.m * pr.k + pr.k * pr.n + pr.m * pr.n) * 2;
  int count = static_cast<int>((2 * static_cast<int64_t>(l2_bytes) + per_set - 1) / per_set);
  count = std::max(count, 2);
  for (int i = 0; i < count; ++i) {
    OperandSet s;
    s.a = device_bf16(pr.m * pr.k, 17u + 3u * i, &buf->owned);
    s.b = device_bf16(pr.k * pr.n, 29u + 3u * i, &buf->owned);
    s.d = device_bf16(pr.m * pr.n, 41u + 3u * i, &buf->owned);
    buf->sets.push_back(s);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
}

std::vector<float> to_host(const void* d, int64_t count) {
  std::vector<__nv_bfloat16> raw(count);
  CHECK_CUDA(cudaMemcpy(raw.data(), d, count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i) out[i] = __bfloat162float(raw[i]);
  return out;
}

const char* layout_name(const Problem& pr) {
  return pr.a_col_major ? "nt" : pr.b_row_major ? "nn" : "tn";
}

// max |ours - ref| / max |ref|
double relative_difference(const std::vector<float>& ours, const std::vector<float>& ref) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ours[i])) return INFINITY;
    diff = std::max(diff, static_cast<double>(std::fabs(ours[i] - ref[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
  }
  return scale > 0.0 ? diff / scale : diff;
}

bool parse_problem(const char* text, Problem* pr) {
  long long m = 0, n = 0, k = 0;
  char layout[8] = {0};
  if (std::sscanf(text, "%lldx%lldx%lld:%2s", &m, &n, &k, layout) != 4) return false;
  if (m <= 0 || n <= 0 || k <= 0) return false;
  if (std::strcmp(layout, "tn") != 0 && std::strcmp(layout, "nn") != 0 &&
      std::strcmp(layout, "nt") != 0) {
    return false;
  }
  pr->m = m;
  pr->n = n;
  pr->k = k;
  pr->b_row_major = std::strcmp(layout, "tn") != 0;
  pr->a_col_major = std::strcmp(layout, "nt") == 0;
  return true;
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  for (const char* p = text; *p;) {
    out.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return out;
}

struct Entry {
  std::string label;  // variant, raster, swizzle
  Prepared* prepared;
  double check;       // relative difference to cuBLAS on set 0
  std::vector<float> us;
  bool failed = false;  // a launch returned an error: no time is reported
};

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--rounds R] [--samples S] [--iters I] [--gap-us G] [--rasters 0,1,2] "
               "[--swizzles 1,2] MxNxK:tn|nn|nt ...\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3, samples = 5, iters = 20, gap_us = 0;
  std::vector<int> rasters = {0}, swizzles = {1};
  std::vector<Problem> problems;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--rounds") {
      rounds = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--samples") {
      samples = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--iters") {
      iters = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--gap-us") {
      gap_us = std::atoi(argv[++i]);
    } else if (i + 1 < argc && a == "--rasters") {
      rasters = parse_list(argv[++i]);
    } else if (i + 1 < argc && a == "--swizzles") {
      swizzles = parse_list(argv[++i]);
    } else {
      Problem pr;
      if (!parse_problem(argv[i], &pr)) return usage(argv[0]);
      problems.push_back(pr);
    }
  }
  if (problems.empty() || rounds < 1 || samples < 1 || iters < 1 || gap_us < 0) {
    return usage(argv[0]);
  }

  int device = 0, sms = 0, l2 = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasCreate failed\n");
    return 1;
  }
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  auto& registry = cutlass_nn::variants::variant_registry();
  std::printf(
      "device %s (%d SMs, L2 %d MiB); %zu variants; rounds %d x samples %d x %d launches; "
      "%d us idle before each sample\n",
      prop.name, sms, l2 >> 20, registry.size(), rounds, samples, iters, gap_us);

  for (const Problem& pr : problems) {
    Buffers buf;
    make_sets(pr, l2, &buf);
    const int nsets = static_cast<int>(buf.sets.size());
    PreparedCublas cublas(handle, pr, buf.sets);
    std::vector<std::unique_ptr<Prepared>> owned;
    std::vector<Entry> entries;
    // cuBLAS's D on set 0: the reference of the correctness check.
    if (!cublas.launch(0, stream)) {
      std::fprintf(stderr, "cuBLAS failed\n");
      return 1;
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    const std::vector<float> ref = to_host(buf.sets[0].d, pr.m * pr.n);
    entries.push_back(Entry{"cuBLAS", &cublas, 0.0, {}, false});
    for (const auto& v : registry) {
      for (int raster : rasters) {
        for (int swizzle : swizzles) {
          std::string why;
          auto p = v.prepare(pr, buf.sets, raster, swizzle, sms, stream, &why);
          char label[160];
          std::snprintf(label, sizeof(label), "%s r%d s%d", v.name.c_str(), raster, swizzle);
          if (!p) {
            std::printf("%lldx%lldx%lld:%s  %-40s skipped: %s\n", (long long)pr.m,
                        (long long)pr.n, (long long)pr.k, layout_name(pr), label,
                        why.c_str());
            continue;
          }
          CHECK_CUDA(cudaMemsetAsync(buf.sets[0].d, 0, pr.m * pr.n * 2, stream));
          if (!p->launch(0, stream)) {
            std::printf("%s: launch failed\n", label);
            continue;
          }
          CHECK_CUDA(cudaStreamSynchronize(stream));
          const double check = relative_difference(to_host(buf.sets[0].d, pr.m * pr.n), ref);
          entries.push_back(Entry{label, p.get(), check, {}, false});
          owned.push_back(std::move(p));
        }
      }
    }
    for (int r = 0; r < rounds; ++r) {
      for (size_t j = 0; j < entries.size(); ++j) {
        Entry& e = entries[r % 2 == 0 ? j : entries.size() - 1 - j];
        if (e.failed) continue;
        for (int w = 0; w < 3; ++w) e.failed = e.failed || !e.prepared->launch(w % nsets, stream);
        for (int s = 0; s < samples && !e.failed; ++s) {
          if (gap_us > 0) {
            CHECK_CUDA(cudaStreamSynchronize(stream));
            std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
          }
          // one untimed launch first, so the timed ones start on a busy GPU (no idle gap at the
          // first event that the host's enqueue time would fill)
          e.failed = !e.prepared->launch(0, stream);
          CHECK_CUDA(cudaEventRecord(start, stream));
          for (int i = 0; i < iters; ++i) {
            e.failed = !e.prepared->launch((s * iters + i) % nsets, stream) || e.failed;
          }
          CHECK_CUDA(cudaEventRecord(stop, stream));
          CHECK_CUDA(cudaEventSynchronize(stop));
          float ms = 0.0f;
          CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
          e.us.push_back(1000.0f * ms / iters);
        }
      }
    }
    CHECK_CUDA(cudaGetLastError());
    // Checked again after the timed launches: a kernel whose state carries over between
    // launches (the stream-K reduction's flags) must still give cuBLAS's D.
    for (size_t j = 1; j < entries.size(); ++j) {
      Entry& e = entries[j];
      if (e.failed) continue;
      CHECK_CUDA(cudaMemsetAsync(buf.sets[0].d, 0, pr.m * pr.n * 2, stream));
      e.failed = !e.prepared->launch(0, stream);
      CHECK_CUDA(cudaStreamSynchronize(stream));
      e.check = std::max(e.check, relative_difference(to_host(buf.sets[0].d, pr.m * pr.n), ref));
    }
    auto median = [](std::vector<float> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    if (entries[0].failed) {
      std::fprintf(stderr, "cuBLAS failed while timed\n");
      return 1;
    }
    const float base = median(entries[0].us);
    for (const Entry& e : entries) {
      if (e.failed || e.us.empty()) {
        std::printf("%lldx%lldx%lld:%s  %-40s launch failed\n", (long long)pr.m, (long long)pr.n,
                    (long long)pr.k, layout_name(pr), e.label.c_str());
        continue;
      }
      const float us = median(e.us);
      std::printf("%lldx%lldx%lld:%s  %-40s %9.2f us  %6.3f  %s (%.1e)\n", (long long)pr.m,
                  (long long)pr.n, (long long)pr.k, layout_name(pr),
                  e.label.c_str(), us, base / us, e.check <= 1e-2 ? "ok" : "MISMATCH", e.check);
    }
    std::fflush(stdout);
  }
  cublasDestroy(handle);
  return 0;
}
