// Kernel selection of the FP8 GEMMs (fp8_gemm.h): which compiled kernel takes a problem, and the
// per-shape choice of tile configuration. Includes no CUTLASS header; the kernels are
// instantiated in fp8_gemm_sm90_*.cu.
#include <cstdint>

#include "fp8_gemm.h"

namespace cutlass_nn {
namespace kernels {
namespace {

using Fp8Launch = GemmStatus (*)(const Fp8GemmParams&, void*, size_t, cudaStream_t, const char**,
                                 size_t*);

struct Fp8Kernel {
  Fp8Format a;
  DType d;
  int config;
  const char* name;
  Fp8Launch launch;
};

// Every compiled FP8 kernel. B is always e4m3 (the weight, or the input for the weight
// gradient); A is e4m3 (the input) or e5m2 (an output gradient). CUTLASS_NN_KERNEL_SUBSET (the CI
// kernel set, cutlass_nn/_build_config.py's FP8_CI_UNITS) compiles one unit per FP8 kernel family
// (the overlapped-promotion mainloop the rule runs, for an e4m3 and an e5m2 A; the
// fast-accumulation one; CUTLASS's own, with float32 output): the rows of the units it leaves out
// are left out with them, guarded where they stand, so that the full build's table keeps its
// order.
#if defined(CUTLASS_NN_HAS_SM90)
constexpr Fp8Kernel kKernels[] = {
#if !defined(CUTLASS_NN_KERNEL_SUBSET)
    {Fp8Format::kE4M3, DType::kBFloat16, 0, "sm90_fp8_e4m3_e4m3_bf16_128x128x128_2x1x1_coop",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 0>},
    {Fp8Format::kE4M3, DType::kBFloat16, 1, "sm90_fp8_e4m3_e4m3_bf16_64x128x128_1x1x1_pingpong",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 1>},
#endif
    {Fp8Format::kE4M3, DType::kBFloat16, 2,
     "sm90_fp8_e4m3_e4m3_bf16_128x256x128_2x1x1_coop_fastaccum",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 2>},
#if !defined(CUTLASS_NN_KERNEL_SUBSET)
    {Fp8Format::kE5M2, DType::kBFloat16, 0, "sm90_fp8_e5m2_e4m3_bf16_128x128x128_2x1x1_coop",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 0>},
    {Fp8Format::kE5M2, DType::kBFloat16, 1, "sm90_fp8_e5m2_e4m3_bf16_64x128x128_1x1x1_pingpong",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 1>},
    {Fp8Format::kE4M3, DType::kBFloat16, 3,
     "sm90_fp8_e4m3_e4m3_bf16_128x128x128_2x1x1_coop_streamk",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 3>},
    {Fp8Format::kE5M2, DType::kBFloat16, 3,
     "sm90_fp8_e5m2_e4m3_bf16_128x128x128_2x1x1_coop_streamk",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 3>},
    {Fp8Format::kE4M3, DType::kBFloat16, 4, "sm90_fp8_e4m3_e4m3_bf16_128x192x128_2x1x1_coop",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 4>},
    {Fp8Format::kE5M2, DType::kBFloat16, 4, "sm90_fp8_e5m2_e4m3_bf16_128x192x128_2x1x1_coop",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 4>},
#endif
    {Fp8Format::kE4M3, DType::kBFloat16, 5,
     "sm90_fp8_e4m3_e4m3_bf16_128x128x128_2x1x1_coop_overlap",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 5>},
    {Fp8Format::kE5M2, DType::kBFloat16, 5,
     "sm90_fp8_e5m2_e4m3_bf16_128x128x128_2x1x1_coop_overlap",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 5>},
    {Fp8Format::kE4M3, DType::kBFloat16, 6,
     "sm90_fp8_e4m3_e4m3_bf16_64x128x128_1x1x1_pingpong_overlap",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 6>},
    {Fp8Format::kE5M2, DType::kBFloat16, 6,
     "sm90_fp8_e5m2_e4m3_bf16_64x128x128_1x1x1_pingpong_overlap",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 6>},
    {Fp8Format::kE4M3, DType::kBFloat16, 7,
     "sm90_fp8_e4m3_e4m3_bf16_128x128x128_2x1x1_coop_overlap_streamk",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kBFloat16, 7>},
    {Fp8Format::kE5M2, DType::kBFloat16, 7,
     "sm90_fp8_e5m2_e4m3_bf16_128x128x128_2x1x1_coop_overlap_streamk",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 7>},
    {Fp8Format::kE4M3, DType::kFloat32, 0, "sm90_fp8_e4m3_e4m3_f32_128x128x128_2x1x1_coop",
     &fp8_gemm_launch<Fp8Format::kE4M3, DType::kFloat32, 0>},
    {Fp8Format::kE5M2, DType::kFloat32, 0, "sm90_fp8_e5m2_e4m3_f32_128x128x128_2x1x1_coop",
     &fp8_gemm_launch<Fp8Format::kE5M2, DType::kFloat32, 0>},
};
#endif

constexpr const char* kConfigNames[kFp8ConfigCount] = {
    "128x128x128_2x1x1_coop", "64x128x128_1x1x1_pingpong", "128x256x128_2x1x1_coop_fastaccum",
    "128x128x128_2x1x1_coop_streamk", "128x192x128_2x1x1_coop",
    "128x128x128_2x1x1_coop_overlap", "64x128x128_1x1x1_pingpong_overlap",
    "128x128x128_2x1x1_coop_overlap_streamk"};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#if defined(CUTLASS_NN_HAS_SM90)
bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

int element_bytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }

// What the kernels take: an SM90 device, positive sizes that fit the kernels' int shapes, K and
// the leading dimensions multiples of 16 bytes (TMA), 16-byte aligned operand pointers, and
// 4-byte aligned scales (the broadcasts load them element by element).
bool kernels_take(const Fp8GemmParams& p) {
  if (p.sm != 90 || p.format_b != Fp8Format::kE4M3) return false;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) {
    return false;
  }
  const int64_t d_align = 16 / element_bytes(p.dtype_d);
  if (p.k % 16 != 0 || p.lda % 16 != 0 || p.ldb % 16 != 0 || p.ldd % d_align != 0) return false;
  if (p.lda < p.k || p.ldb < p.k || p.ldd < p.n) return false;
  if (!aligned16(p.a) || !aligned16(p.b) || !aligned16(p.d)) return false;
  if (p.a_scale == nullptr || p.b_scale == nullptr) return false;
  if (reinterpret_cast<uintptr_t>(p.bias) % element_bytes(p.dtype_d) != 0) return false;
  return true;
}

const Fp8Kernel* find_kernel(const Fp8GemmParams& p) {
  if (!kernels_take(p)) return nullptr;
  const int config = p.config >= 0 ? p.config : choose_fp8_config(p);
  for (const Fp8Kernel& k : kKernels) {
    if (k.a == p.format_a && k.d == p.dtype_d && k.config == config) return &k;
  }
  return nullptr;
}
#endif  // CUTLASS_NN_HAS_SM90

}  // namespace

const char* fp8_config_name(int config) {
  return config >= 0 && config < kFp8ConfigCount ? kConfigNames[config] : nullptr;
}

// The per-shape rule, from the sweep of configurations 5 / 6 / 7 over the transformer shape set
// (benchmarks/NOTES.md v0.20; "waves" = 128x128 tiles per SM): under half a wave, 64x128
// ping-pong tiles (config 6: twice the tiles, and each consumer warpgroup's epilogue overlaps the
// other's mainloop); half a wave to one, 128x128 cooperative tiles (config 5); one to 1.5 waves,
// stream-K over a long K (config 7: the last partial wave split along K) and ping-pong tiles
// over a short one; from 1.5 waves, 128x128 cooperative tiles, but ping-pong over K <= 512 (short
// mainloops, where the overlapped epilogue pays). All three on the mainloop whose promotions
// overlap the next k-tile's tensor-core work; configs 0, 1 and 3 are the same tiles on CUTLASS's
// mainloop, which waits for the tensor cores before each promotion, and config 4 (128x192 on it)
// is kept for sweeps. Config 2 (fast accumulation) changes the arithmetic: it runs only where the
// caller allows it (fast_accum), for the formats it is compiled for. Float32 outputs have
// configuration 0 only.
int choose_fp8_config(const Fp8GemmParams& p) {
  if (p.fast_accum && p.format_a == Fp8Format::kE4M3 && p.dtype_d == DType::kBFloat16) return 2;
  if (p.dtype_d == DType::kFloat32) return 0;
  const int64_t sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  const int64_t tiles = ceil_div(p.m, 128) * ceil_div(p.n, 128);
  if (tiles * 2 < sms) return 6;
  if (tiles < sms) return 5;
  if (tiles * 2 < sms * 3) return p.k >= 4096 ? 7 : 6;
  return p.k <= 512 ? 6 : 5;
}

// No swizzle until a sweep shows one pays (benchmarks/NOTES.md, FP8).
int choose_fp8_swizzle(const Fp8GemmParams& params, int config) {
  (void)params;
  (void)config;
  return 1;
}

const char* plan_fp8_gemm(Fp8GemmParams* params, size_t* workspace_bytes) {
  *workspace_bytes = 0;
#if defined(CUTLASS_NN_HAS_SM90)
  const bool forced = params->config >= 0;
  if (!forced) params->config = choose_fp8_config(*params);
  // the rule's swizzle goes with the rule's configuration only
  if (params->swizzle <= 0) params->swizzle = forced ? 1 : choose_fp8_swizzle(*params, params->config);
  const Fp8Kernel* k = find_kernel(*params);
  if (k == nullptr) return "";
  k->launch(*params, nullptr, 0, nullptr, nullptr, workspace_bytes);
  return k->name;
#else
  (void)params;
  return "";
#endif
}

const char* fp8_gemm_kernel_name(const Fp8GemmParams& params) {
#if defined(CUTLASS_NN_HAS_SM90)
  const Fp8Kernel* k = find_kernel(params);
  return k != nullptr ? k->name : "";
#else
  (void)params;
  return "";
#endif
}

size_t fp8_gemm_workspace_size(const Fp8GemmParams& params) {
#if defined(CUTLASS_NN_HAS_SM90)
  const Fp8Kernel* k = find_kernel(params);
  if (k == nullptr) return 0;
  size_t bytes = 0;
  k->launch(params, nullptr, 0, nullptr, nullptr, &bytes);
  return bytes;
#else
  (void)params;
  return 0;
#endif
}

GemmStatus run_fp8_gemm(const Fp8GemmParams& params, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream, const char** detail) {
#if defined(CUTLASS_NN_HAS_SM90)
  const Fp8Kernel* k = find_kernel(params);
  if (k != nullptr) return k->launch(params, workspace, workspace_bytes, stream, detail, nullptr);
#else
  (void)params;
  (void)workspace;
  (void)workspace_bytes;
  (void)stream;
#endif
  if (detail != nullptr) *detail = "no FP8 kernel takes this problem (fp8_gemm_kernel_name)";
  return GemmStatus::kUnsupported;
}

}  // namespace kernels
}  // namespace cutlass_nn
