// Implements gemm_params.h: picks one of the generated kernels (generated/kernel_registry.inc) for
// a GemmParams and runs it. Includes no CUTLASS header; every kernel body lives in its own
// generated translation unit.
//
// Selection (first registry row that fits, rows are in priority order):
//   1. kSm90TmaWs     only if sm == 90, arch_path == kAuto, 16-bit A/B (or float32 with
//                     Fp32Math::kTf32: config 20, or kTf32Split: config 21), every operand
//                     16-byte aligned, and (for a row-broadcast bias) beta == 1; among its tile
//                     configurations the one choose_sm90_config() names for the problem shape.
//                     The only family with fused activation epilogues. For a small M the rule
//                     may name a transposed configuration (4-7, 16): the problem is then run as
//                     D^T = B^T A^T with a column-major D^T (plan_gemm), or, where that has no
//                     kernel, with the rule's row-major choice.
//   2. kSm80TensorOp  sm >= 80; highest alignment first (f16/bf16: 8 then 2; tf32: 4 then 1, only
//                     with Fp32Math::kTf32 or kTf32Split; 3xTF32: 4, only with Fp32Math::kIeee;
//                     f64 DMMA: 1).
//   3. kSm80Simt      fp32 (IEEE, or TF32 requested but nothing tensor-op fits).
//   4. kFallback      any alignment / layout (A ColumnMajor with B ColumnMajor excepted).
//
// Batched split-K (GemmParams::splits < 0, or batched_k_slices() for the weight gradient's long-K
// problems with few output tiles): the SM90 float32-output kernel of config 2 runs the K slices
// as a batch of independent GEMMs into fp32 slices of the workspace, and reduce_k_slices()
// (split_k_reduce.h) sums them into the caller's D.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>
#include <unordered_map>

#include "gemm_params.h"
#include "gemm_registry.h"
#include "split_k_reduce.h"

namespace cutlass_nn {
namespace kernels {
namespace {

const KernelEntry kKernels[] = {
#define CUTLASS_NN_KERNEL(fam, ab, cd, la, lb, align, align_cd, config, epi, act, name)       \
  {KernelFamily::fam, DType::ab,  DType::cd, Layout::la, Layout::lb, align, align_cd, config,  \
   EpilogueKind::epi, Activation::act, name,                                                  \
   &launch<KernelTag<KernelFamily::fam, DType::ab, DType::cd, Layout::la, Layout::lb, align,  \
                     config, EpilogueKind::epi, Activation::act>>},
#include "generated/kernel_registry.inc"
#undef CUTLASS_NN_KERNEL
};

// Largest N the SM80 CUTLASS kernels take: N tiles go to grid.y (<= 65535), smallest tile N is 64.
constexpr int64_t kSm80MaxN = int64_t(65535) * 64;

size_t element_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

bool is_16bit(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Largest access width (elements, power of two, at most 16 bytes) that the operand allows:
// pointer address, leading dimension (when more than one line is read) and contiguous extent.
int operand_alignment(const void* ptr, int64_t ld, int64_t contiguous, int64_t strided,
                      size_t esize) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(ptr);
  for (int a = static_cast<int>(16 / esize); a > 1; a /= 2) {
    if (addr % (a * esize) == 0 && contiguous % a == 0 && (strided <= 1 || ld % a == 0)) return a;
  }
  return 1;
}

// Canonical form of the params: C unused -> C := D with beta 0 (every kernel then has a valid C
// pointer and none reads it); ld of a single-line operand is irrelevant and is replaced by a
// 16-byte multiple so that it neither lowers the alignment nor upsets TMA descriptor checks.
GemmParams normalize(const GemmParams& in) {
  GemmParams p = in;
  if (p.c == nullptr || p.beta == 0.0f) {
    p.c = p.d;
    p.ldc = p.ldd;
    p.c_row_broadcast = false;
    p.beta = 0.0f;
  }
  const int64_t v_ab = 16 / static_cast<int64_t>(element_size(p.dtype_ab));
  const int64_t v_cd = 16 / static_cast<int64_t>(element_size(p.dtype_cd));
  const bool a_row = p.layout_a == Layout::kRowMajor, b_row = p.layout_b == Layout::kRowMajor;
  if ((a_row ? p.m : p.k) <= 1) p.lda = round_up(a_row ? p.k : p.m, v_ab);
  if ((b_row ? p.k : p.n) <= 1) p.ldb = round_up(b_row ? p.n : p.k, v_ab);
  if (p.m <= 1) {
    p.ldd = round_up(p.n, v_cd);
    if (!p.c_row_broadcast) p.ldc = p.ldd;
  }
  if (p.c_row_broadcast) p.ldc = 0;  // ignored by contract; kernels broadcast row 0
  return p;
}

bool valid_dtypes(DType ab, DType cd) {
  if (is_16bit(ab)) return cd == ab || cd == DType::kFloat32;
  return cd == ab;
}

// The SM90 tile configuration of the fused-activation kernels (SM90_ACT_CONFIG of the generator).
constexpr int kActConfig = 3;
// The peak DRAM bandwidth (GB/s) from which with_wave_fill's pingpong_waves clause applies: the
// H200 (4.8 TB/s) measured it ahead, the H100 (3.35 TB/s) behind (v0.44).
constexpr int kPingpongWavesMinGbps = 4500;
// The SM90 configurations of float32 operands: TF32, and the TF32 parts of a 3xTF32 split.
constexpr int kTf32Config = 20;
constexpr int kTf32SplitConfig = 21;
// The short-K configurations (Sm90TileConfig<8, 9>: config 0 with a 128x64 / 128x128 epilogue
// tile), compiled for the wgrad layout with the input dtype out only.
constexpr int kShortKConfig = 8;
constexpr int kShortKWideConfig = 9;
// The 128x192 configuration (Sm90TileConfig<10>) and the small weight-gradient ones (11: 64x64,
// 12: 64x32 ping-pong tiles), compiled with the input dtype out only.
constexpr int kTile192Config = 10;
constexpr int kSmallWgradConfig = 11;
constexpr int kSmallWgradNarrowConfig = 12;
// The 64x128 ping-pong tile (Sm90TileConfig<13>) and the 256x128 cooperative one with a 1x2
// cluster (Sm90TileConfig<14>), compiled with the input dtype out only.
constexpr int kTile64x128Config = 13;
constexpr int kTile256x128Config = 14;
// Config 3's 128x128 ping-pong tile without a cluster (v0.37).
constexpr int kPingpongNoClusterConfig = 15;
// Config 10's 128x192 tile without a cluster (Sm90TileConfig<1>, v0.30), compiled with the input
// dtype out only.
constexpr int kTile192NoClusterConfig = 1;
// The transposed configurations by token rows per tile (Sm90TileConfig<4..7>), narrowest first.
struct SwappedTile {
  int64_t rows;
  int config;
};
constexpr SwappedTile kSwappedTiles[] = {{16, 4}, {32, 5}, {64, 6}, {128, 7}};
// Config 6's tile with 64-deep k-blocks (Sm90TileConfig<16>, v0.41).
constexpr int kSwappedDeepConfig = 16;
// v0.49: the wave-filling ping-pong tiles (Sm90TileConfig<17..19>: 128x96, 192x96, 192x128, no
// cluster), compiled with the input dtype out only.
constexpr int kTile128x96Config = 17;
constexpr int kTile192x96Config = 18;
constexpr int kTile192x128Config = 19;
bool is_swapped_config(int config) {
  return (config >= 4 && config <= 7) || config == kSwappedDeepConfig;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The number of tiles CUTLASS's SM90 persistent scheduler walks for a grid of `rows` x `cols`
// tiles (its tile_scheduler_params.h): each side is rounded up to the cluster, then to the
// cluster times the swizzle it applies (the requested one, lowered to 1 where the grid's
// shorter side has under 2 cluster-rounded tiles, to 2 under 3, to 4 under 6). The rounded-up
// tiles lie outside the problem but take a CTA's turn like real ones, so a swizzle can add a
// wave: 13 x 10 tiles of 256x128 with a 1x2 cluster are 130 (one wave on 132 SMs), with a
// swizzle of 2 they are 14 x 12 = 168 (two; 3328 x 1280 x 1024 forward 0.571 of cuBLAS vs 0.947
// with no swizzle: results/sweep_nvidia-h100-80gb-hbm3_20261126-113615.json).
int64_t scheduled_tiles(int64_t rows, int64_t cols, int64_t cluster_m, int64_t cluster_n,
                        int swizzle) {
  rows = round_up(rows, cluster_m);
  cols = round_up(cols, cluster_n);
  const int64_t shorter = std::min(rows, cols);
  int64_t applied = 1;
  if (swizzle >= 8 && shorter >= 6) {
    applied = 8;
  } else if (swizzle >= 4 && shorter >= 3) {
    applied = 4;
  } else if (swizzle >= 2 && shorter >= 2) {
    applied = 2;
  }
  return round_up(rows, applied * cluster_m) * round_up(cols, applied * cluster_n);
}

// Whether a swizzle makes CUTLASS's scheduler walk more waves of tiles than no swizzle (then the
// rule does without it: the tiles are the same, their order only costs some L2 reuse).
bool swizzle_adds_wave(int64_t rows, int64_t cols, int64_t cluster_m, int64_t cluster_n,
                       int swizzle, int64_t sms) {
  return ceil_div(scheduled_tiles(rows, cols, cluster_m, cluster_n, swizzle), sms) >
         ceil_div(scheduled_tiles(rows, cols, cluster_m, cluster_n, 1), sms);
}

// Whether the 128x192 tile (config 10) beats config 0's 128x256 on wave quantization: the work
// of the waves each needs, a wave of 128x192 tiles costing 3/4 of one of 128x256 tiles, is at
// least 5% less (4096 x 3584: 5 waves of 192-wide tiles vs 4 of 256-wide, 960 vs 1024;
// 4096 x 768: one wave either way, 192 vs 256).
bool tile192_fills_waves_better(const GemmParams& p, int64_t sms) {
  const int64_t rows = ceil_div(p.m, 128);
  const int64_t cost256 = ceil_div(scheduled_tiles(rows, ceil_div(p.n, 256), 2, 1, 1), sms) * 256;
  const int64_t cost192 = ceil_div(scheduled_tiles(rows, ceil_div(p.n, 192), 2, 1, 1), sms) * 192;
  return cost192 * 20 <= cost256 * 19;
}

// The 128x192 configuration, with a scheduler swizzle of 4 where its tiles make at most 4
// columns (N <= 768: measured 2-7% faster than no swizzle) and the swizzle adds no wave.
Sm90Choice tile192_choice(const GemmParams& p, int64_t sms) {
  Sm90Choice c;
  c.config = kTile192Config;
  const int64_t rows = ceil_div(p.m, 128), cols = ceil_div(p.n, 192);
  if (cols <= 4 && !swizzle_adds_wave(rows, cols, 2, 1, 4, sms)) c.swizzle = 4;
  return c;
}

// Whether a problem's 128x192 tiles (2x1 cluster) fill 85-100% of one wave of the SMs.
bool tile192_fills_one_wave(const GemmParams& p, int64_t sms) {
  const int64_t tiles192 = scheduled_tiles(ceil_div(p.m, 128), ceil_div(p.n, 192), 2, 1, 1);
  return tiles192 <= sms && tiles192 * 20 >= sms * 17;
}

// Whether the 16-bit weight gradient of a mid-size layer over 2048-4096 tokens runs on config 1's
// 128x192 tiles without a cluster, with a swizzle of 2: where those tiles fill 80-100% of one wave
// (v0.30, H100, 4096 tokens, isolated, of cuBLAS: the 2816 x 1024 weight gradient 0.976 vs 0.853
// for the stream-K tile the rule took before and 0.524-0.755 for config 10's clustered 128x192
// tile; 1024 x 2816 0.984 vs 0.961 for config 10: results/sweep_nvidia-h100-80gb-hbm3_20261127-
// 235628.json; inside the compiled llama-host step the 2816 x 1024 one took 34.7 us vs 39.6, cuBLAS
// 34.4: step_sweep_..._20261128-000604.json). Over more tokens config 10 lost to stream-K (1024 x
// 2816 over 16384 tokens 0.73-0.75 vs 1.01) and this tile was not measured there. v0.31 lowers
// the bound from 85% to 80% of a wave (H200, isolated, of cuBLAS, config 1 vs the stream-K tile
// the rule took: 112 tiles, 3584 x 768 over 4096 tokens 0.971 vs 0.861, 1792 x 1536 0.971 vs
// 0.867, 3584 x 768 over 2048 tokens 0.959 vs 0.808; 108 tiles, 3456 x 768, 0.857 vs 0.802:
// results/sweep_nvidia-h200_20261128-061125.json). Under 80% stays on stream-K: at 104 tiles
// (3328 x 768) config 1 ran 0.822 vs 0.808, inside the ~3% that one kernel's ratio moved
// between two runs (sweep_..._20261128-062815.json); 106-107 tiles were not measured.
bool tile192_no_cluster_takes_wgrad(const GemmParams& p, int64_t sms) {
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  const int64_t tiles = scheduled_tiles(ceil_div(p.m, 128), ceil_div(p.n, 192), 1, 1, 1);
  return wgrad_layout && p.dtype_cd == p.dtype_ab && p.k >= 2048 && p.k <= 4096 && tiles <= sms &&
         tiles * 5 >= sms * 4;
}

// Config 1 with a swizzle of 2, none where that would add a wave.
Sm90Choice tile192_no_cluster_choice(const GemmParams& p, int64_t sms) {
  Sm90Choice c;
  c.config = kTile192NoClusterConfig;
  c.swizzle = swizzle_adds_wave(ceil_div(p.m, 128), ceil_div(p.n, 192), 1, 1, 2, sms) ? 1 : 2;
  return c;
}

// Whether a problem's 64x128 tiles (config 13) fill 85-100% of one wave of the SMs, for at least
// 1024 rows, 256 columns and K >= 1024, with the input dtype out: where the smaller tile gives
// every SM a tile that 128x128 / 128x256 tiles would leave idle (v0.22, with config 13 then a
// 128x64 tile: the 1024 x 1024 weight gradient over 4096 tokens 0.79-0.80 vs 0.72-0.73 for
// split-K; the 4096 x 256 x 1024 forward 0.95 vs 0.92 for the transposed problem; v0.28's 64x128
// tile: 0.99 and 1.01).
bool tile64x128_fills_one_wave(const GemmParams& p, int64_t sms) {
  const int64_t tiles = scheduled_tiles(ceil_div(p.m, 64), ceil_div(p.n, 128), 1, 1, 1);
  return p.dtype_cd == p.dtype_ab && p.m >= 1024 && p.n >= 256 && p.k >= 1024 && tiles <= sms &&
         tiles * 20 >= sms * 17;
}

// Whether the weight gradient of a small output (at least 512 x 768) over 1024-8192 tokens runs
// on config 13's 64x128 tiles although they fill only part of a wave (7/16 of it up to all of
// it), with the input dtype out, in place of the 128x128 split-K / stream-K tiles (over exactly
// 1024 tokens the rule's small-wgrad clause, configs 11 / 12, takes these shapes first; v0.29,
// isolated, of cuBLAS: 768 x 768 over 4096 tokens 0.86 vs 0.60, 512 x 1024 0.84 vs 0.55, 512 x
// 2048 1.08 vs 0.81, 1024 x 768 1.00 vs 0.72, 768 x 768 over 8192 tokens 0.87 vs 0.82: 64-128
// tiles; with 32 tiles, 256 x 1024, the 64x64 tiles of config 11 stay ahead, 13.4 vs 16.1 us).
// Narrower, shorter or longer problems were not measured and keep split-K.
bool tile64x128_takes_small_wgrad(const GemmParams& p, int64_t sms) {
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  const int64_t tiles = scheduled_tiles(ceil_div(p.m, 64), ceil_div(p.n, 128), 1, 1, 1);
  return wgrad_layout && p.dtype_cd == p.dtype_ab && p.m >= 512 && p.n >= 768 && p.k >= 1024 &&
         p.k <= 8192 && tiles <= sms && tiles * 16 >= sms * 7;
}

// Whether config 14's tiles fill their waves to at least 80% (v0.32).
bool tile256x128_waves_fill(int64_t tiles, int64_t sms) {
  return tiles * 5 >= ceil_div(tiles, sms) * sms * 4;
}

// Whether config 14 (256x128 tiles, 1x2 cluster: the tile cuBLAS runs at these shapes) takes a
// mid-size problem: at least 1024 x 1024 with K >= 256, the input dtype out, and at most one
// wave of its tiles with K <= 4096, or at most four waves with K <= 1024. With a swizzle of 2.
// v0.22 (H100, 4096 tokens, results/sweep_nvidia-h100-80gb-hbm3_20261126-090230 / -090559 /
// -090607): 1.5-4% over the previous rule on every layout (4096 x 1024 x 1024 forward 0.950 vs
// 0.934, 4096 x 4096 x 1024 forward 0.966 vs 0.944, 4096 x 2816 x 1024 dgrad layout 0.947 vs
// 0.913, 4096 x 1024 x 4096 forward 0.979 vs 0.952 and wgrad layout 0.978 vs 0.953, the
// 3072 x 1024 wgrad 0.820 vs 0.783); it lost with more tiles over a longer K (4096 x 4096 x 4096
// 0.976-0.985 vs 1.004-1.010 for config 0). v0.32: over more than one wave with 256 < K
// <= 1024, only where its waves are at least 80% full (4096 x 2304 x 768 forward, 288 tiles, 73%
// full: 0.784 on config 14 against 0.900 for config 3 on the H100, 0.794 against 0.940 on the
// H200; 1024 x 5120 x 512, 61%: 0.804 against 0.926 for config 10 on the H100, 0.815 against
// 0.930 on the H200; results/sweep_nvidia-h100-80gb-hbm3_* and
// sweep_nvidia-h200_20261128-090700.json). K <= 256 and the weight gradient over 257-1024
// tokens unchanged, not measured.
bool tile256x128_takes(const GemmParams& p, int64_t sms) {
  if (p.dtype_cd != p.dtype_ab || p.m < 1024 || p.n < 1024 || p.k < 256) return false;
  const int64_t tiles = scheduled_tiles(ceil_div(p.m, 256), ceil_div(p.n, 128), 1, 2, 1);
  if (tiles <= sms && p.k <= 4096) return true;
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  return tiles <= 4 * sms && p.k <= 1024 &&
         (p.k <= 256 || wgrad_layout || tile256x128_waves_fill(tiles, sms));
}

// Config 14 with a swizzle of 2 (v0.22), none where that would add a wave (v0.24).
Sm90Choice tile256x128_choice(const GemmParams& p, int64_t sms) {
  Sm90Choice c;
  c.config = kTile256x128Config;
  c.swizzle = swizzle_adds_wave(ceil_div(p.m, 256), ceil_div(p.n, 128), 1, 2, 2, sms) ? 1 : 2;
  return c;
}

// Whether a problem that config 14 takes runs on config 3 (128x128 ping-pong tiles, 1x2 cluster)
// instead (v0.36): the forward and dgrad layouts with 256 < K <= 1024, where the mainloop is
// short and ping-pong's epilogue, overlapped with the other warpgroup's mainloop, pays. Timed
// inside compiled training steps on an H200 (bench --what step-sweep, fixed round order,
// results/step_sweep_nvidia-h200_20261128-235051 / -235702 / -235740 / -235829.json), config 3
// against config 14 in us per call: 4096 x 4096 x 1024 forward 46.4-46.5 vs 50.9-51.5 and dgrad
// 46.5-48.6 vs 51.0-54.7 (gpt-host, bert-host, llama-gpu); 4096 x 3072 x 1024 forward 37.4 vs
// 40.0; 4096 x 2816 x 1024 forward 37.5 vs 39.9 and dgrad 37.6 vs 39.4; 4096 x 1024 x 1024
// 15.1-15.7 vs 15.5-16.2. Config 14 stayed ahead or level at K = 256 and K >= 2816 (4096 x 1024 x
// 2816 / 4096), which keep it; weight gradients with 256 < K <= 1024 were not measured and keep
// it too. Isolated H100 sweeps were mixed (results/sweep_..._20261127-234915 / -235628.json:
// config 14 ahead by 1-2% at 4096 x 4096 x 1024 and 4096 x 3072 x 1024, config 3 at 4096 x 1024
// x 1024); the rule follows the H200's steps.
bool pingpong_replaces_tile256x128(const GemmParams& p) {
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  return !wgrad_layout && p.k > 256 && p.k <= 1024;
}
// Whether a problem that config 14 takes runs on config 15 (config 3's ping-pong tile without a
// cluster) instead (v0.37): the forward layout of an output at most 8 tiles of 128 wide over
// 1.5-3 waves of 128x128 tiles, with 256 < K <= 3072. Inside tile256x128_takes (N >= 1024, and
// at most one wave of 256x128 tiles for K > 1024, 80% full waves for K <= 1024) that is N = 1024
// with 3072 < M <= 4096 (1.5-1.94 waves); 4096 x 1024 is the shape measured. Isolated on an H200 (scripts/gemm_variant_ab.sh, 3 interleaved rounds, operands rotated
// over twice the L2: benchmarks/results/variant_ab_nvidia-h200_20261129-033207.txt), us per call
// at the rule's raster and swizzle, config 15 / 3 / 14 (swizzle 2) / cuBLAS: 4096 x 1024 x 1024
// (256 tiles) 16.49 / 16.82 / 17.28 / 15.97; 4096 x 1024 x 2816 38.83 / 38.46 / 39.11 / 37.12
// (config 15 at the other raster / swizzle settings: 37.3-37.5, and 39.4 with raster 2 and
// swizzle 2); a second run (variant_ab_...-041314.txt) had config 15 ahead at the rule's settings,
// 35.47 vs 36.23. Inside compiled training steps the two 128x128 tiles tied on these forwards
// (forced 15 / 3: 4096 x 1024 x 1024 15.7 / 15.7 us in llama-host and gpt-host, 4096 x 1024 x
// 2816 33.1 / 33.2 in llama-host; results/step_sweep_nvidia-h200_20261129-035925 / -040225.json),
// while config 15 ran the 4096 x 1024 x 1024 dgrad 1.1-1.6% faster (15.0 vs 15.2-15.3).
// v0.38: the dgrad layout (A and B row-major) of the same domain too. Isolated
// (variant_ab_...-041314.txt, both swizzles) config 15 was level with or ahead of config 3 there:
// 4096 x 1024 x 1024 16.16-16.19 vs 16.33-16.36 us, 4096 x 1024 x 2816 35.20-35.27 vs 35.62-35.66;
// inside compiled llama-host steps (step_sweep_...-035925.json) 15.0 vs 15.2 (config 3, the
// rule's choice before) and 33.4 vs 33.7 (config 14, the rule's choice before, at K = 2816);
// the gpt-host step had 4096 x 1024 x 3072 at 36.1 on both configs 14 and 15. The weight
// gradient's layout is not taken (not measured). Other shapes keep the choices above.
bool pingpong_without_cluster_takes(const GemmParams& p, int64_t sms) {
  const bool forward_layout = p.layout_a == Layout::kRowMajor && p.layout_b == Layout::kColumnMajor;
  const bool dgrad_layout = p.layout_a == Layout::kRowMajor && p.layout_b == Layout::kRowMajor;
  const int64_t tiles128 = ceil_div(p.m, 128) * ceil_div(p.n, 128);
  return (forward_layout || dgrad_layout) && p.k > 256 && p.k <= 3072 &&
         ceil_div(p.n, 128) <= 8 && tiles128 * 2 > sms * 3 && tiles128 <= sms * 3;
}

// The rule for row-major D (see choose_sm90_config). `with_tile256x128` false: the rule without
// config 14 (configs 13 and the v0.24 tile counting stay), which
// tile192_replaces_transposed_without_config14 asks.
Sm90Choice choose_row_major_config(const GemmParams& p, bool with_tile256x128 = true) {
  const int64_t sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  const int64_t tiles256 = ceil_div(p.m, 128) * ceil_div(p.n, 256);
  const int64_t tiles128 = ceil_div(p.m, 128) * ceil_div(p.n, 128);
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  // Configurations 10-12 have kernels with the input dtype out only.
  const bool same_dtype_out = p.dtype_cd == p.dtype_ab;
  Sm90Choice c;
  if (tiles256 * 2 < sms) {
    // The weight gradient of a small layer: whole-K 64-row ping-pong tiles where they give each
    // consumer warpgroup at most one tile, for an output of at most 256 rows or over at most
    // 1024 tokens (256 x 1024 over 4096 tokens: 1.08 vs 0.61 for split-K; 128 x 8192: 0.94 vs
    // 0.80; 768 x 768 over 512 tokens: 0.83 vs 0.65; but 1024 x 1024 over 4096 tokens lost,
    // 0.64 vs 0.79), 32-column tiles over at most 1024 tokens where those fill at most a wave
    // (256 x 1024 over 512 tokens: 0.94 vs 0.84 with 64-column tiles). Not over more than 8192
    // tokens (not measured).
    const int64_t tiles64 = ceil_div(p.m, 64) * ceil_div(p.n, 64);
    if (wgrad_layout && same_dtype_out && p.k <= 8192 && tiles64 <= 2 * sms &&
        (p.m <= 256 || p.k <= 1024)) {
      c.config = p.k <= 1024 && ceil_div(p.m, 64) * ceil_div(p.n, 32) <= sms
                     ? kSmallWgradNarrowConfig
                     : kSmallWgradConfig;
      return c;
    }
    if (tile64x128_fills_one_wave(p, sms) || tile64x128_takes_small_wgrad(p, sms)) {
      c.config = kTile64x128Config;
      c.swizzle = swizzle_adds_wave(ceil_div(p.m, 64), ceil_div(p.n, 128), 1, 1, 2, sms) ? 1 : 2;
      return c;
    }
    c.config = 2;
    // Under half a wave of 128x128 tiles: split K into as many slices as fill the SMs, at
    // most 4 and each at least 1024 deep (the scheduler's own stream-K split lost 25-60% here).
    if (tiles128 * 2 <= sms) {
      int64_t splits = sms / tiles128;
      if (splits > 4) splits = 4;
      if (splits > p.k / 1024) splits = p.k / 1024;
      if (splits >= 2) c.splits = static_cast<int>(splits);  // else the scheduler's choice
    }
    return c;
  }
  if (p.k <= 256) {
    if (wgrad_layout && p.dtype_cd == p.dtype_ab) {
      c.config = p.k <= 128 ? kShortKWideConfig : kShortKConfig;
    } else if (with_tile256x128 && tile256x128_takes(p, sms)) {
      return tile256x128_choice(p, sms);  // K = 256: the 4096 x 1024 x 256 dgrad layout 0.933 vs 0.893
    }
    return c;
  }
  // The weight gradient of a mid-size layer over many tokens (up to 1.4 waves of 128x128
  // tiles, K >= 2048): stream-K, or 128x192 tiles where they fill one wave: 80-100% of it without
  // a cluster over 2048-4096 tokens (v0.30 / v0.31, tile192_no_cluster_takes_wgrad), else 85-100%
  // with config 10's where the output is no taller than wide (1024 x 2816 over 4096 tokens: 0.96 vs 0.86; with
  // fewer tiles, 2304 x 768, 0.70 vs 0.91; taller, 2816 x 1024, 0.72-0.77 vs 0.86-0.91, and over
  // 16384 tokens 0.73-0.75 vs 1.01: results/bench_nvidia-h100-80gb-hbm3_20261125-155457.json).
  if (wgrad_layout && tiles128 * 5 <= sms * 7 && p.k >= 2048) {
    if (tile192_no_cluster_takes_wgrad(p, sms)) return tile192_no_cluster_choice(p, sms);
    if (same_dtype_out && p.m <= p.n && tile192_fills_one_wave(p, sms)) {
      return tile192_choice(p, sms);
    }
    c.config = 2;
    return c;
  }
  if (with_tile256x128 && tile256x128_takes(p, sms)) {
    if (pingpong_without_cluster_takes(p, sms)) {
      c.config = kPingpongNoClusterConfig;
      return c;
    }
    if (pingpong_replaces_tile256x128(p)) {
      c.config = 3;
      return c;
    }
    return tile256x128_choice(p, sms);
  }
  // More than a wave of 128x256 tiles but a last wave much emptier than 128x128 tiles would
  // leave it, over a long K: 128x128 data-parallel tiles.
  if (tiles256 >= sms && p.k >= 2048) {
    const double eff256 = double(tiles256) / double(ceil_div(tiles256, sms) * sms);
    const double eff128 = double(tiles128) / double(ceil_div(tiles128, sms) * sms);
    if (eff128 >= 1.15 * eff256) {
      c.config = 2;
      c.splits = 1;
      return c;
    }
  }
  if ((p.k <= 2048 && tiles128 >= 512) || (tiles128 > 1024 && tiles128 < 2048 && p.k <= 4096)) {
    // v0.27: the weight gradient here over 2049-4096 tokens (so 1025-2047 tiles), with the
    // input dtype out, keeps config 0 (a float32 output, the main-gradient accumulation, was
    // not measured and keeps ping-pong). Measured inside compiled training steps (bench --what step-sweep), the 32000 x
    // 1024 language-model head over 4096 tokens (2000 tiles) ran 356-359 us on config 0 against
    // 383-393 on config 3 in the llama / bert / gpt steps
    // (results/step_sweep_nvidia-h100-80gb-hbm3_20261126-172447 / -172545 / -172749.json);
    // isolated, config 0 beat config 3 (best of swizzles 1 and 2) on six of seven such weight
    // gradients by 4-15% (2048 x 11008 over 4096 tokens 0.943 vs 0.854 of cuBLAS, 5120 x 5120
    // 0.903 vs 0.828; the head 0.976 vs 0.965: results/sweep_..._20261126-174139.json).
    if (!(wgrad_layout && same_dtype_out && p.k > 2048)) c.config = 3;
    return c;
  }
  if (same_dtype_out && p.m >= 1024 && tile192_fills_waves_better(p, sms)) {
    return tile192_choice(p, sms);
  }
  // Config 0 over a long raster row: CUTLASS walks the shorter side of the tile grid first, so
  // each row of tiles sweeps one whole operand; from 48 tiles per row on, a swizzle of 2 (two
  // rows side by side) halves that operand's re-reads from memory (16384 x 18944 x 3584
  // forward 0.99 vs 0.87, 16384 x 16384 x 4096 0.99 vs 0.90; 56 tiles: +2-4%; no change below).
  if (std::min(ceil_div(p.m, 128), ceil_div(p.n, 256)) >= 48) c.swizzle = 2;
  return c;
}

// Whether a problem under 3/4 of a wave of 128x256 tiles (where the rule considers the transposed
// problem) runs on the 128x192 tile instead: at least 1024 rows, the input dtype out, its tiles
// fill 85-100% of one wave, and the row-major rule (`row_major`, K included: a short K keeps
// config 0) picks that tile. The row-major rule then beats the transposed kernels (4096 x 768 x
// 3072 forward: 0.95 vs 0.77).
bool tile192_replaces_transposed(const GemmParams& p, const Sm90Choice& row_major, int64_t sms) {
  return p.dtype_cd == p.dtype_ab && p.m >= 1024 && tile192_fills_one_wave(p, sms) &&
         row_major.config == kTile192Config;
}

// Whether the rule's transposed choice for a problem gives way to the 128x192 tile that the rule
// picked before config 14 existed (v0.25): the same conditions as tile192_replaces_transposed,
// asked of the rule without config 14, for the layouts that run transposed (not the weight
// gradient's, whose transposed problem has no kernels and which keeps config 14), from N = 2048
// (the 128x192 tile ran at 0.53-0.73 of cuBLAS at N = 1024-1536 in every layout, NOTES v0.23,
// and at 0.86-0.99 at N = 768, 2816 and 3584). From v0.22 to
// v0.24 config 14 took the row-major rule's place at these shapes, so they went back to the
// transposed kernels: 1024 x 2816 x 2816 forward 0.607 transposed, 0.74-0.77 config 14,
// 0.90-0.94 the 128x192 tile (results/sweep_nvidia-h100-80gb-hbm3_20261126-115131.json).
bool tile192_replaces_transposed_without_config14(const GemmParams& p) {
  const int64_t sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  return !wgrad_layout && p.dtype_cd == p.dtype_ab && p.m >= 1024 && p.n >= 2048 &&
         tile192_fills_one_wave(p, sms) &&
         choose_row_major_config(p, false).config == kTile192Config;
}

// Whether a problem the rule would transpose runs on config 13's 64x128 tiles instead, where
// they fill 85-100% of one wave (tile64x128_fills_one_wave; 4096 x 256 x 1024 forward: 0.95 vs
// 0.92 with v0.22's 128x64 tile, 1.01 with v0.28's 64x128 one) and the row-major rule
// (`row_major`) picks them.
bool tile64x128_replaces_transposed(const GemmParams& p, const Sm90Choice& row_major,
                                    int64_t sms) {
  return tile64x128_fills_one_wave(p, sms) && row_major.config == kTile64x128Config;
}

}  // namespace

// The per-shape rule, from the configuration sweeps and benchmark runs of benchmarks/NOTES.md
// (ratios to cuBLAS there; v0.8: the transformer shape set on an H100,
// results/sweep_nvidia-h100-80gb-hbm3_20261124-171456.json (4096 tokens), -171840 (512 tokens),
// -171934 (split-K of small weight gradients); v0.10, configurations 10-12 and the swizzle:
// results/sweep_nvidia-h100-80gb-hbm3_20261125-154223.json (small weight gradients over 512 and
// 4096 tokens) and -154243 (configs 0, 3, 10 x swizzles 1-8 over 4096 and 16384 tokens)).
// Tile counts are of the output [m, n].
//   * a small M (<= 128 rows: decode, small-batch inference and its dgrad) with N >= 1024:
//     the transposed problem D^T = B^T A^T (configs 4-7), whose 64-row tiles cut the weight
//     into ceil(n / 64) slabs, each streamed once by its own CTA. The token-row tile is the
//     narrowest of 16 / 32 / 64 / 128 that holds all m rows, narrowed further (each slab then
//     re-read from L2 per token tile) until the tiles cover 7/8 of the SMs. Measured
//     (results/sweep_nvidia-h200_20261122-055333.json): 16 / 32 / 64 / 128 x 8192 x 8192
//     forward 0.98-1.00 / 0.99 / 1.02 / 0.92 (the row-major rule: 0.55 / 0.58 / 0.67 / 0.77);
//     128x4096x4096 with 64-row token tiles 1.03, 128x2048x8192 with 32-row ones 1.14;
//   * under 3/4 of a wave of 128x256 tiles otherwise (a narrow layer, or few tokens): the
//     transposed problem too, its token tile narrowed from 128 rows while its tiles fill under
//     half the SMs, where that gives at least a quarter of the SMs a tile and the token tile
//     is not the 128-row one over a K above 3072 (else the row-major rule). H100, 512 tokens:
//     512x1024x1024 forward 0.86-0.89 vs 0.49 for stream-K, 512x3072x768 dgrad 0.98 vs 0.48;
//     4096 tokens: 4096x256x1024 forward 0.90-0.94 vs 0.56 (results/bench_*_20261124-173108);
//   * few output tiles otherwise (a 128x256 grid filling under half the SMs: the weight
//     gradient of a small layer, or an operand the transposed kernels cannot read): config 2,
//     128x128 tiles, with K split into 2-4 slices of at least 1024 where the tiles fill under
//     half the SMs (768x768 over 4096 tokens: 0.65 with 3 slices vs 0.57 with the scheduler's
//     stream-K; config 13 there from v0.29), else the scheduler's stream-K split;
//   * a short K (<= 256: wgrad over a few tokens): the output write dominates. Config 0's
//     128x256 tile (0.80-0.83 vs 0.73-0.75 for ping-pong), with a wider epilogue tile where
//     compiled (the wgrad layout, 16-bit out): 128x128 for K <= 128 (config 9: 16x8192x8192
//     0.98 vs 0.83, 128x8192x8192 0.88 vs 0.79), 128x64 for K <= 256 (config 8: 256x4096x4096
//     0.93 vs 0.89; results/sweep_nvidia-h200_20261122-061729.json);
//   * the weight gradient (layout nt) of a mid-size layer, up to 1.4 waves of 128x128 tiles,
//     over K >= 2048 tokens: config 2 with the scheduler's stream-K split (3072x768 over 4096
//     tokens 0.81-0.82 vs 0.60-0.68; over 512 tokens it lost: 1024x2816 0.65 vs 0.83);
//   * more than a wave of 128x256 tiles whose last wave is much emptier than with 128x128
//     tiles, K >= 2048: config 2 data-parallel (512x12288x4096 forward 0.92 vs 0.77);
//   * config 3, 128x128 ping-pong with a 1x2 cluster, whose epilogue overlaps the other
//     warpgroup's mainloop: for K <= 2048 from 512 tiles of 128x128 on (4096x2304x768 forward
//     0.90 vs 0.78, 4096x8192x1024 1.08 vs 0.95), and for 1025..2047 tiles with K <= 4096
//     (H200: 2048x11008x4096 forward 1.00 vs 0.94, wgrad 1.07 vs 0.98). Not from 2048 tiles:
//     v0.23 took it up to 4096 tiles (the 4096-token GPU-size MLPs and QKV projections), where
//     three H100 sweeps had it 3-10% ahead of config 0 GEMM by GEMM, but the GPU-size compiled
//     model rows of those builds fell (llama 0.973, gpt 0.937 vs 0.99 / 0.98-1.01 with config 0),
//     so v0.26 takes it back (NOTES v0.23);
//   * v0.10: the weight gradient of a small layer (few tiles, wgrad layout, 16-bit out): the
//     whole-K 64-row ping-pong tiles (configs 11, 12) where they give each consumer warpgroup at
//     most one tile and the output has at most 256 rows or K <= 1024 (256 x 1024 over 4096
//     tokens 1.08 vs 0.61);
//   * v0.10: config 10 (128x192) where its waves cost at least 5% less than config 0's, for at
//     least 1024 rows (4096 x 3584 x 3584 forward 0.99 vs 0.98 and dgrad 0.97 vs 0.94,
//     4096 x 3584 x 18944 1.01 vs 0.95, 16384 x 128 x 8192 0.96 vs 0.74), also in place of the
//     transposed problem or the wgrad stream-K where its tiles fill 85-100% of a wave
//     (4096 x 768 x 3072 forward 0.95 vs 0.77, the 1024 x 2816 wgrad over 4096 tokens 0.96 vs
//     0.86); a swizzle of 4 for its N <= 768;
//   * v0.22: config 13 (128x64 tiles, 1x2 cluster, swizzle 2) where its tiles fill 85-100% of one
//     wave, for at least 1024 rows, K >= 1024 and the input dtype out, in place of split-K or of
//     the transposed problem (the 1024 x 1024 wgrad over 4096 tokens 0.79-0.80 vs 0.72-0.73,
//     4096 x 256 x 1024 forward 0.95 vs 0.92);
//   * v0.22: config 14 (256x128 tiles, 1x2 cluster, swizzle 2: cuBLAS's nvjet tile) for outputs
//     of at least 1024 x 1024 with up to one wave of its tiles over K <= 4096, or up to four
//     waves over K <= 1024 (ahead of the ping-pong and data-parallel choices below; after the
//     mid-size wgrad's stream-K and 128x192 choices, which beat it there): 1.5-4% over the
//     previous rule on the host-size models' GEMMs, every layout (tile256x128_takes);
//   * v0.24: the swizzles of configs 10, 13 and 14 only where CUTLASS's rounding of the tile
//     grid to cluster x swizzle adds no wave, and their one-wave tests count the tiles the
//     scheduler walks (scheduled_tiles; 3328 x 1280 x 1024 forward: 0.571 with config 14's
//     swizzle of 2, 0.947 without);
//   * v0.25: the 128x192 tile again in place of the transposed problem where config 14 had
//     taken its place in the row-major rule (N >= 2048, not the weight gradient's layout;
//     1024 x 2816 x 2816 forward: 0.607 transposed, 0.90-0.94 with the 128x192 tile);
//   * v0.27: the weight gradient of 1025-2047 128x128 tiles over 2049-4096 tokens, input dtype
//     out, keeps config 0 instead of ping-pong (the 32000 x 1024 head over 4096 tokens: 357 vs 383-393 us
//     inside compiled training steps; isolated, 2048 x 11008 0.943 vs 0.854, 5120 x 5120 0.903
//     vs 0.828 of cuBLAS);
//   * v0.28: config 13 becomes a 64x128 ping-pong tile without a cluster (64x128 WGMMAs per
//     warpgroup instead of the 128x64 cooperative tile's 64x64), at the same places, its one-wave
//     test counting 64x128 tiles (1024 x 1024 wgrad over 4096 tokens 0.99 vs 0.79, 16384 tokens
//     0.96 vs 0.77, 4096 x 256 x 1024 forward 1.01 vs 0.90);
//   * v0.29: config 13 also for the 16-bit weight gradient of an output of at least 512 x 768
//     whose 64x128 tiles fill 7/16 to one wave, over 1025-8192 tokens, in place of split-K /
//     stream-K (768 x 768 over 4096 tokens 0.86 vs 0.60);
//   * otherwise config 0 (128x256, 2x1 cluster, cooperative, persistent): the tile cuBLAS
//     picks most at these shapes (its nvjet 256x128 1x2 kernels, results/cublas_kernels_*),
//     with a scheduler swizzle of 2 from 48 tiles along the grid's shorter side (v0.10:
//     16384 x 18944 x 3584 forward 0.99 vs 0.87).
//   * v0.30 / v0.31: config 1 (config 10's 128x192 tile without a cluster, in the slot of a
//     128x256 stream-K tile that won no measured shape after v0.10), swizzle 2, for the 16-bit
//     weight gradient over 2048-4096 tokens where its tiles fill 80-100% of one wave, ahead of
//     the stream-K and config 10 choices there (the 2816 x 1024 wgrad over 4096 tokens 0.976 vs
//     0.853, 1024 x 2816 0.984 vs 0.961 on an H100; 3584 x 768 0.971 vs 0.861 on an H200;
//     tile192_no_cluster_takes_wgrad).
//   * v0.36: config 3 in config 14's place for the forward and dgrad layouts with 256 < K <= 1024
//     (pingpong_replaces_tile256x128): 2-11% faster per call inside compiled H200 training steps
//     (4096 x 4096 x 1024 forward 46.5 vs 51.5 us in gpt-host's), where isolated H100 sweeps were
//     mixed (config 14 ahead by up to 2% on the larger shapes); the step is what users run.
//   * v0.37: config 15 (config 3 without a cluster) in config 14's or 3's place for the forward
//     layout of outputs at most 1024 wide over 1.5-3 waves of 128x128 tiles with 256 < K <= 3072
//     (pingpong_without_cluster_takes; within config 14's gate: N = 1024, 3073-4096 rows): isolated on an H200 2% faster than config 3 at 4096 x
//     1024 x 1024 (16.49 vs 16.82 us), 1% slower at 4096 x 1024 x 2816 (38.83 vs 38.46; config
//     14, v0.36's choice there, 39.11); tied with config 3 inside compiled steps.
//   * v0.38: the same clause for the dgrad layout (A and B row-major): config 15 level with or
//     ahead of configs 3 / 14 there, isolated (4096 x 1024 x 1024 16.2 vs 16.3-16.4 us) and in
//     compiled llama-host steps (15.0 vs 15.2; 4096 x 1024 x 2816 33.4 vs 33.7 on config 14).
//   * v0.40: the wave-fill clauses on top of all the above (with_wave_fill, below): config 15
//     with a swizzle of 2 from half a wave to a wave of 128x128 tiles, at two waves, and for the
//     weight gradient over at most 512 tokens; config 1 for the wide data-parallel forward and
//     dgrad; config 3 where its waves cost less than the 128x192 tile's.
//   * v0.43: two weight-gradient clauses in with_wave_fill, ahead of the others: config 13 where
//     its 64x128 tiles fill one wave over 4096 <= K <= 16384 in place of config 11 / split-K
//     (tile64x128_takes_long_wgrad), config 1 over K <= 512 where its 128x192 tiles fill 70-100%
//     of a wave and 128x128 tiles spill a little into a second (tile192_no_cluster_takes_short_wgrad).
//   * v0.44: v0.40's config-3 clause (pingpong_waves) only on devices of at least 4.5 TB/s peak
//     DRAM bandwidth (GemmParams::memory_gbps; the H200): on the H100 it lost at every shape it
//     takes, which keep the 128x192 tile there.
//   * v0.45: the GELU forms with the pre-activation kept (linear_act_aux: the training path of a
//     Linear + GELU layer) run unfused, the rule's GEMM with the bias and then the activation
//     pass (gelu_aux_runs_unfused).
//   * v0.46: GELU(tanh) back on the fused kernels where the rule's own tile is theirs (config 3),
//     its epilogue math now z * sigmoid(2u) with the fast exponential and division
//     (activation_forward_epilogue); the erf form, and GELU(tanh) where the rule picks another
//     tile, run unfused.
//   * v0.47: any fused epilogue runs unfused where config 3's walk over the tiles would stream an
//     operand larger than the L2 once per row (or column) of tiles and the rule picks another
//     tile (fused_walk_restreams_operand: 16384 x 16384 x 4096); elsewhere GELU(tanh) with the
//     pre-activation is fused whatever the rule's tile, and the erf form too over K >= 2048,
//     where the mainloop hides its epilogue.
namespace {

// The transposed configuration (4-7, 16) for a problem under 3/4 of a wave of 128x256 tiles that no
// row-major tile stands in for, or -1 where the row-major problem runs (the token tiles would not
// fill the SMs, or K is too long for the 128-row token tile).
int transposed_config(const GemmParams& p, int64_t sms) {
  const int64_t weight_tiles = ceil_div(p.n, 64);
  int i = 3;  // 128 token rows; fewer where they hold all m rows
  while (i > 0 && kSwappedTiles[i - 1].rows >= p.m) --i;
  while (i > 0 && weight_tiles * ceil_div(p.m, kSwappedTiles[i].rows) * 2 < sms) --i;
  // The 128-row token tile (config 7, 64-deep k-blocks) lost to the row-major rule from
  // K = 3584 on (512x4096x11008 forward 0.53 vs 0.97); the 64-row one won up to K = 8192.
  const bool long_k_wide_tile = i == 3 && p.k > 3072;
  if (long_k_wide_tile || weight_tiles * ceil_div(p.m, kSwappedTiles[i].rows) * 4 < sms) return -1;
  // v0.41: the 64-row token tile with 64-deep k-blocks (config 16, twice the stages) where the
  // sweep of configs 6 and 16 had it ahead (H200, results/sweep_nvidia-h200_20261203-073908.json):
  // 512 tokens over K >= 3072 in the forward layout (512 x 768 x 3072 0.973 vs 0.898, 512 x 1024
  // x 8192 0.956 vs 0.907, 512 x 1024 x 4096 level) and over K >= 8192 in the dgrad layout (512 x
  // 1024 x 8192 0.944 vs 0.927). Config 6 kept the rest: the dgrad layout over K <= 4096 (512 x
  // 1024 x 4096 0.971 vs 0.928, 512 x 1024 x 2816 0.915 vs 0.870), the forward over K = 2816
  // (0.883 vs 0.869) and 4096 tokens (4096 x 128 x 8192 0.979 vs 0.947).
  const bool forward_layout = p.layout_a == Layout::kRowMajor && p.layout_b == Layout::kColumnMajor;
  if (kSwappedTiles[i].config == 6 && p.m <= 512 &&
      (p.k >= 8192 || (forward_layout && p.k >= 3072))) {
    return kSwappedDeepConfig;
  }
  return kSwappedTiles[i].config;
}

Sm90Choice standing_in_for_transposed(Sm90Choice c) {
  c.stands_in_for_transposed = true;
  return c;
}

}  // namespace

namespace {

// The rule before v0.40's wave-fill clauses (choose_sm90_config applies them on top).
Sm90Choice choose_sm90_config_before_wave_fill(const GemmParams& p) {
  const int sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  if (p.m <= 128 && p.n >= 1024) {
    const int64_t weight_tiles = ceil_div(p.n, 64);
    int i = 0;
    while (kSwappedTiles[i].rows < p.m) ++i;  // the narrowest token tile holding all rows
    while (i > 0 && weight_tiles * ceil_div(p.m, kSwappedTiles[i].rows) * 8 < int64_t{7} * sms) {
      --i;
    }
    Sm90Choice c;
    c.config = kSwappedTiles[i].config;
    return c;
  }
  const Sm90Choice row_major = choose_row_major_config(p);
  const int64_t tiles256 = ceil_div(p.m, 128) * ceil_div(p.n, 256);
  if (tiles256 * 4 >= 3 * sms) return row_major;
  // Under 3/4 of a wave of 128x256 tiles: the transposed problem, or a row-major tile in its place.
  if (tile192_replaces_transposed(p, row_major, sms) ||
      tile64x128_replaces_transposed(p, row_major, sms)) {
    return standing_in_for_transposed(row_major);
  }
  const int transposed = transposed_config(p, sms);
  // v0.32: the 128x192 tile also where K is too long for the transposed problem (1024 x 2816 x
  // 4096 forward: 0.754 on config 14, 0.897 on the 128x192 tile on the H100, 0.761 against 0.912
  // on the H200; the 1024 x 2816 x 4096 dgrad GEMM of a 4096 x 2816 layer over 1024 tokens 0.784
  // vs 0.959 on the H100, 0.790 vs 0.960 on the H200; sweep_nvidia-h200_20261128-090700.json).
  // Where there is no transposed problem (long K, a fused epilogue) the tile stands in for
  // nothing: a fused epilogue keeps its fused kernels.
  if (tile192_replaces_transposed_without_config14(p)) {
    const Sm90Choice tile192 = choose_row_major_config(p, false);
    return transposed < 0 ? tile192 : standing_in_for_transposed(tile192);
  }
  if (transposed < 0) return row_major;
  Sm90Choice c;
  c.config = transposed;
  return c;
}

// v0.40: config 15 (128x128 ping-pong, no cluster) with a swizzle of 2 where a sweep of every
// configuration over issue 13's shape set (H200, results/sweep_nvidia-h200_20261202-122047.json,
// NOTES "thirty-ninth session") had it ahead of the rule's choice; 16-bit operands with the input
// dtype out, no fused epilogue (its kernels are config 3's), not the small-M transposed problem.
// t = tiles of 128x128 of the output:
//   * one_wave: 66 < t <= 132 with 256 < K <= 18944 (the sweep's K range), in place of stream-K
//     or split-K (config 2), the transposed tiles, the 128x192 tile or the 128x256 / 256x128
//     tiles, the choices it was measured against (not configs 1 / 11 / 13) (dgrad 512 x 3584 x 8192 1.000 vs 0.924 of cuBLAS, wgrad 512 x
//     3584 x 512 0.921 vs 0.731), except a forward the rule transposes over K <= 1024 (512 x 4096
//     x 1024: 0.946 against the transposed tile's 0.976);
//   * two_waves: 7/4 of a wave to two waves of tiles (231 <= t <= 264 on 132 SMs) with 256 < K <= 4096 where the rule picks configs 0, 14 or 2
//     (fwd 512 x 8192 x 3584 0.967 vs 0.905, wgrad 4096 x 1024 x 4096 0.983 vs 0.948), except
//     the dgrad layout over K <= 1024, which lost 1-5% in the bench of the built rule (512 x 8192
//     x 128, 512 x 8192 x 1024, 4096 x 1024 x 256: results/bench_nvidia-h200_20261202-124149.json);
//     a shorter K was measured in the dgrad layout only;
//   * short_wgrad: the weight gradient over K <= 512 tokens where the rule picks the 256x128 or
//     128x256 tile (configs 14, 0): 4096 x 4096 x 512 1.125 vs 0.960, 1024 x 8192 x 512 1.076 vs
//     0.918.
// Not the large problems where config 15 also won isolated (16384 x 16384 x 4096): there config 0
// ran level or ahead under sustained load and inside training steps (the power limit).
//
// `before` is the choice the clauses may replace: the rule's before them, or (plan_normalized)
// the row-major rule's where the problem the rule would transpose cannot run transposed (the
// weight gradient's layout always: 1024 x 2816 x 512 0.927 vs 0.868 on config 14);
// `rule_transposes` says the rule chose the transposed problem (so the forward's K <= 1024
// exception holds in that fallback too: 512 x 4096 x 1024 with beta = 1 keeps the row-major tile).
// v0.43: the weight gradient of one wave of config 13's 64x128 tiles (swizzle 1) over
// 4096 <= K <= 16384, where the rule picks config 11's whole-K 64x64 tiles or the 128x128 split-K
// / stream-K tile; 16-bit, input dtype out (with_wave_fill checks those). H200 sweeps
// (results/sweep_nvidia-h200_20261202-121720 / -122047.json): the 128 x 8192 weight gradient over
// 4096 tokens 0.927 vs 0.836-0.847 for config 11, over 16384 tokens 0.987 vs 0.900 for stream-K;
// the H100 (results/sweep_nvidia-h100-80gb-hbm3_20261207-070256.json): 0.950 vs 0.897 and 0.990
// vs 0.849. Over 512 tokens config 11 stays ahead (5.27 vs 5.05); other outputs of one wave of
// 64x128 tiles already take config 13. Not the outputs where 256x128 / 128x256 tiles leave most
// SMs idle (3072 x 1024 over 4096 / 16384 tokens): config 13 was ahead there on the H200
// (0.879-0.919 vs 0.822-0.842) but far behind on the H100 (0.677 / 0.579 vs 0.794-0.837).
bool tile64x128_takes_long_wgrad(const GemmParams& p, const Sm90Choice& before, int64_t sms) {
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  if (!wgrad_layout || p.k < 4096 || p.k > 16384) return false;
  const int64_t tiles64 = scheduled_tiles(ceil_div(p.m, 64), ceil_div(p.n, 128), 1, 1, 1);
  if (before.config == kSmallWgradConfig || before.config == 2) {
    return tiles64 <= sms && tiles64 * 20 >= sms * 17;
  }
  return false;
}

// v0.43: the weight gradient over at most 512 tokens on config 1's 128x192 tiles (no cluster,
// tile192_no_cluster_choice) where those fill 70-100% of one wave and 128x128 tiles would spill
// under a quarter of a second wave (config 15 then runs two rounds of tiles for 1.1 waves of
// work). Config 1 at swizzle 2 against the rule's choice in three H200 sweeps at 512 tokens
// (results/sweep_nvidia-h200_20261202-121720 / -122047 / -161547.json): 3072 x 768 (144 tiles of
// 128x128) 0.781 / 0.926 / 0.806 vs 0.765 / 0.857 / 0.764 on config 10; 768 x 3072 (144) 0.799 /
// 0.824 / 0.814 vs 0.814 / 0.804 / 0.741 on config 15. With more of a second wave (176 tiles:
// 2816 x 1024 0.821 / 0.861 / 0.906 vs 0.878 / 0.888 / 0.831, 1024 x 2816 0.873 / 0.924 / 0.958
// vs 0.897 / 0.927 / 0.934) the sweeps disagree, and those keep config 15; where config 1's tiles
// fill less (2304 x 768, 72 tiles: 0.852 vs 1.022) or more than a wave (3072 x 1024, 144 tiles:
// 0.626 vs 0.914) it lost.
bool tile192_no_cluster_takes_short_wgrad(const GemmParams& p, int64_t sms) {
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  if (!wgrad_layout || p.k > 512) return false;
  const int64_t tiles192 = scheduled_tiles(ceil_div(p.m, 128), ceil_div(p.n, 192), 1, 1, 1);
  const int64_t tiles128 = ceil_div(p.m, 128) * ceil_div(p.n, 128);
  return tiles192 <= sms && tiles192 * 10 >= sms * 7 && tiles128 > sms && tiles128 * 4 <= sms * 5;
}

// v0.49: the output tile of a configuration (rows x columns of D, or of D^T for the transposed
// problem's configurations), the cluster it is rounded up to, and whether it runs the
// transposed problem. Stream-K and split-K choices (config 2) count as their data-parallel
// 128x128 tiles: what the clause below weighs is how whole the waves of output tiles are.
struct OutputTile {
  int64_t rows, cols, cluster_m, cluster_n;
  bool transposed;
};
OutputTile output_tile(int config) {
  switch (config) {
    case 0: case 8: case 9: return {128, 256, 2, 1, false};
    case 1: return {128, 192, 1, 1, false};
    case 10: return {128, 192, 2, 1, false};
    case 3: return {128, 128, 1, 2, false};
    case 4: return {64, 16, 1, 1, true};
    case 5: return {64, 32, 1, 1, true};
    case 6: case kSwappedDeepConfig: return {64, 64, 1, 1, true};
    case 7: return {64, 128, 1, 1, true};
    case kSmallWgradConfig: return {64, 64, 1, 1, false};
    case kSmallWgradNarrowConfig: return {64, 32, 1, 1, false};
    case kTile64x128Config: return {64, 128, 1, 1, false};
    case kTile256x128Config: return {256, 128, 1, 2, false};
    case kTile128x96Config: return {128, 96, 1, 1, false};
    case kTile192x96Config: return {192, 96, 1, 1, false};
    case kTile192x128Config: return {192, 128, 1, 1, false};
    default: return {128, 128, 1, 1, false};  // 2 (stream-K / split-K), 15
  }
}

// The share of the SMs' tile turns that compute D (per mille): D's elements over the elements of
// all the tiles the waves could hold (scheduled tiles rounded up to whole waves of `sms`).
int64_t wave_use_permille(const GemmParams& p, const OutputTile& t, int swizzle, int64_t sms) {
  const int64_t m = t.transposed ? p.n : p.m, n = t.transposed ? p.m : p.n;
  const int64_t tiles = scheduled_tiles(ceil_div(m, t.rows), ceil_div(n, t.cols), t.cluster_m,
                                        t.cluster_n, swizzle);
  const int64_t capacity = ceil_div(tiles, sms) * sms * t.rows * t.cols;
  return m * n * 1000 / capacity;
}

// v0.49 (whole_waves): configs 17-19 (128x96, 192x96, 192x128 ping-pong tiles, no cluster) where
// one of them fills one or two waves of the SMs at least 88% with D's own elements and the
// rule's choice fills them at most 80%: the transformer GEMMs whose outputs are 3072 x 768,
// 768 x 3072, 3072 x 1024 (weight gradients, 0.78-0.86 of cuBLAS on the H100) and 512 x 2816..3072
// (forward and dgrad over 512 tokens, 0.82-0.87), where cuBLAS runs 192x96, 128x192 and 96x128
// tiles (results/cublas_kernels_h100_20261124.json) and the rule's tiles leave a quarter to a
// third of the SMs' turns empty. The K range is the measured transformer set's (512-16384).
// Not where the rule streams K over more than 4096 (config 2): its stream-K tiles even out the
// waves there (16384 x 3072 x 768 and 16384 x 768 x 3072 weight gradients at 0.97-1.00 of
// cuBLAS on the H100, results/bench_nvidia-h100-80gb-hbm3_20261207-134824.json). Not the
// batched split-K (chosen after the rule, plan_normalized): that is for far fewer tiles.
bool whole_waves_tile(const GemmParams& p, const Sm90Choice& before, int64_t sms,
                      Sm90Choice* out) {
  if (p.k < 512 || p.k > 16384) return false;
  if (before.config == 2 && p.k > 4096) return false;
  const int64_t before_use = wave_use_permille(p, output_tile(before.config), before.swizzle, sms);
  if (before_use > 800) return false;
  int best = -1;
  int64_t best_use = 880 - 1;
  for (int config : {kTile192x128Config, kTile192x96Config, kTile128x96Config}) {
    const OutputTile t = output_tile(config);
    const int64_t tiles = ceil_div(p.m, t.rows) * ceil_div(p.n, t.cols);
    if (tiles > 2 * sms) continue;
    const int64_t use = wave_use_permille(p, t, 1, sms);
    if (use > best_use) {  // ties keep the larger tile (listed first): fewer waves
      best = config;
      best_use = use;
    }
  }
  if (best < 0) return false;
  out->config = best;
  out->swizzle = 1;
  out->splits = 0;
  return true;
}

Sm90Choice with_wave_fill_v048(const GemmParams& p, const Sm90Choice& before,
                               bool rule_transposes) {
  const int64_t sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  if (!is_16bit(p.dtype_ab) || p.dtype_cd != p.dtype_ab || has_fused_epilogue(p)) return before;
  Sm90Choice c;
  // v0.43 first: its weight gradients include the small-M fallback's (128 x 8192).
  if (tile64x128_takes_long_wgrad(p, before, sms)) {
    c.config = kTile64x128Config;
    return c;
  }
  if (tile192_no_cluster_takes_short_wgrad(p, sms)) return tile192_no_cluster_choice(p, sms);
  if (p.m <= 128 && p.n >= 1024) return before;
  const bool forward_layout = p.layout_a == Layout::kRowMajor && p.layout_b == Layout::kColumnMajor;
  const bool dgrad_layout = p.layout_a == Layout::kRowMajor && p.layout_b == Layout::kRowMajor;
  const bool wgrad_layout = p.layout_a == Layout::kColumnMajor && p.layout_b == Layout::kRowMajor;
  const int64_t rows = ceil_div(p.m, 128), cols = ceil_div(p.n, 128);
  const int64_t tiles128 = rows * cols;
  // Only the configurations, K range and wave band the sweep measured config 15 against.
  const bool one_wave_measured_before =
      before.config == 0 || before.config == 2 || before.config == kTile256x128Config ||
      before.config == kTile192Config || rule_transposes;
  const bool one_wave = p.k > 256 && p.k <= 18944 && tiles128 * 2 > sms && tiles128 <= sms &&
                        one_wave_measured_before &&
                        !(forward_layout && p.k <= 1024 && rule_transposes);
  const bool two_waves = tiles128 * 4 >= sms * 7 && tiles128 <= 2 * sms && p.k > 256 &&
                         p.k <= 4096 &&
                         (before.config == 0 || before.config == kTile256x128Config ||
                          before.config == 2) &&
                         !(dgrad_layout && p.k <= 1024);
  const bool short_wgrad = wgrad_layout && p.k <= 512 &&
                           (before.config == 0 || before.config == kTile256x128Config);
  if (one_wave || two_waves || short_wgrad) {
    c.config = kPingpongNoClusterConfig;
    c.swizzle = swizzle_adds_wave(rows, cols, 1, 1, 2, sms) ? 0 : 2;
    return c;
  }
  // wide_data_parallel: the rule's data-parallel 128x128 tiles (config 2, one slice) of a wide
  // output over few rows in the forward or dgrad layout: config 1's 128x192 tiles without a
  // cluster (512 x 18944 x 3584 fwd 0.997 vs 0.869, dgrad 1.023 vs 0.878; 512 x 12288 x 4096 fwd
  // 0.995 vs 0.941; 512 x 11008 x 4096 dgrad 1.003 vs 0.942). Over at most 512 rows, as measured:
  // for tall outputs the rule's own wave cost has config 1 20% behind (8192 x 1280 x 2048).
  if (!wgrad_layout && p.m <= 512 && before.config == 2 && before.splits == 1) {
    c.config = kTile192NoClusterConfig;
    return c;
  }
  // pingpong_waves: where the rule picks the 128x192 tile for its waves (tile192_fills_waves_better)
  // and config 3's 128x128 tiles (1x2 cluster) cost fewer columns of waves still (4096 x 3584:
  // 7 waves of 128 columns against 5 of 192): config 3 (4096 x 3584 x 3584 fwd 1.082 vs 0.988,
  // dgrad 1.078 vs 0.966; 4096 x 3584 x 8192 fwd 1.114 vs 1.006, dgrad 1.102 vs 0.996; 4096 x
  // 3584 x 18944 fwd 1.090 vs 1.001, dgrad 1.091 vs 0.999). Not the weight gradient's layout (no
  // such group in the sweep). v0.44: on the H200 only (peak DRAM bandwidth from
  // kPingpongWavesMinGbps; 0, unknown, counts as the H200). On the H100 (3.35 TB/s, same SM count
  // and L2) config 3 is behind at all six of those GEMMs: 0.737-0.811 of cuBLAS at K = 18944 and
  // 0.89-0.95 at K = 3584 / 8192 in the shape-set benches of 2026-12-07
  // (results/bench_nvidia-h100-80gb-hbm3_20261207-070303 / -113300.json), where config 10 had run
  // 0.96-1.00 (bench_..._20261126-214542 / -212655 / -175900.json); its sweep of 2026-11-25
  // (sweep_..._20261125-154243.json) had config 3 at 0.914-0.960 against config 10's 0.967-1.005 (both at the rule's swizzle 1).
  const bool pingpong_waves_device =
      p.memory_gbps == 0 || p.memory_gbps >= kPingpongWavesMinGbps;
  if (!wgrad_layout && before.config == kTile192Config && pingpong_waves_device) {
    const int64_t cost128 = ceil_div(scheduled_tiles(rows, cols, 1, 2, 1), sms) * 128;
    const int64_t cost192 =
        ceil_div(scheduled_tiles(rows, ceil_div(p.n, 192), 2, 1, 1), sms) * 192;
    if (cost128 < cost192) {
      c.config = 3;
      return c;
    }
  }
  return before;
}

// The wave-fill clauses: v0.40-v0.48's, then v0.49's whole_waves on their choice.
Sm90Choice with_wave_fill(const GemmParams& p, const Sm90Choice& before, bool rule_transposes) {
  const Sm90Choice c = with_wave_fill_v048(p, before, rule_transposes);
  if (!is_16bit(p.dtype_ab) || p.dtype_cd != p.dtype_ab || has_fused_epilogue(p)) return c;
  if (p.m <= 128 && p.n >= 1024) return c;  // the small-M transposed problem's own tiles
  const int64_t sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  Sm90Choice whole;
  return whole_waves_tile(p, c, sms, &whole) ? whole : c;
}

}  // namespace

Sm90Choice choose_sm90_config(const GemmParams& p) {
  const Sm90Choice before = choose_sm90_config_before_wave_fill(p);
  return with_wave_fill(p, before, is_swapped_config(before.config));
}

namespace {

// Whether the transposed problem D^T = B^T A^T has SM90 kernels: 16-bit operands with the same
// output dtype, no fused activation, A row-major (forward and dgrad; the transposed layouts are
// then "tn" and "tt"), and no C other than a bias (no operator accumulates into D with a
// row-major A, so a column-major C^T would be a path no test reaches).
bool can_transpose(const GemmParams& p) {
  return p.sm == 90 && p.arch_path == ArchPath::kAuto && is_16bit(p.dtype_ab) &&
         p.dtype_cd == p.dtype_ab && !has_fused_epilogue(p) &&
         p.layout_a == Layout::kRowMajor && !p.d_column_major &&
         (p.beta == 0.0f || p.c_row_broadcast);
}

Layout flipped(Layout l) {
  return l == Layout::kRowMajor ? Layout::kColumnMajor : Layout::kRowMajor;
}

// D^T = B^T A^T: the same memory read the other way round. B^T is B with its layout flipped,
// and so is A^T; D^T (and C^T) is column-major with D's leading dimension; the bias of D's
// columns is a bias of D^T's rows.
GemmParams transposed(const GemmParams& p) {
  GemmParams t = p;
  t.m = p.n;
  t.n = p.m;
  t.a = p.b;
  t.lda = p.ldb;
  t.layout_a = flipped(p.layout_b);
  t.b = p.a;
  t.ldb = p.lda;
  t.layout_b = flipped(p.layout_a);
  t.d_column_major = true;
  return t;
}

// v0.47: the operand bytes that config 3's fused kernels may stream once per row (column) of
// tiles without paying for it: what the 50 MB L2 of the H100 and H200 keeps between the CTAs that
// read it. Measured on both sides (H100, ReLU, fused forward time / the rule's GEMM + the pass,
// results/probe_linact_forward_nvidia-h100-80gb-hbm3_20261207-155343.txt and -155728.txt): 32 MB
// (4096 x 16384 x 4096, 16384 x 8192 x 2048) 0.84-0.90, 128 MB (16384 x 16384 x 4096) 1.28.
constexpr int64_t kFusedWalkOperandBytes = int64_t{40} << 20;

// v0.47: whether config 3's fused kernel would re-stream an operand from DRAM once per row or
// column of its 128x128 tiles. CUTLASS's persistent scheduler (RasterOrderOptions::Heuristic,
// no swizzle) walks along N when the problem has at least as many tile rows as tile columns:
// the CTAs in flight then share one row of A while the whole of B streams past them, once per
// row of tiles; along M otherwise, A streaming once per column (the tile counts rounded up to the
// 1x2 cluster, as the scheduler counts them). An operand that the L2 keeps is read from DRAM
// about once; a larger one costs tiles x its bytes: at 16384 x 16384 x 4096, 128 rows x 128 MiB
// of B = 16 GiB, about 5.1 ms at the H100's 3.35 TB/s, near the fused forward's measured 4.8-5.4
// ms at swizzles 1 and 2 for every activation (swizzle 4, which walks four rows together, 4.2-4.6;
// results/probe_linact_forward_..._20261207-155728.txt: ReLU 4936 us against 3497 + 356 for the
// rule's GEMM and the pass). Only where the rule's own tile is another one (config 0 at these
// sizes): on config 3 the plain GEMM would walk alike.
bool fused_walk_restreams_operand(const GemmParams& p, int rule_config) {
  if (rule_config == kActConfig) return false;
  const int64_t tiles_m = ceil_div(p.m, 128), tiles_n = ceil_div(ceil_div(p.n, 128), 2) * 2;
  const int64_t streamed = tiles_m >= tiles_n ? p.n : p.m;  // B's rows along N, A's along M
  const int64_t bytes = streamed * p.k * static_cast<int64_t>(element_size(p.dtype_ab));
  return bytes > kFusedWalkOperandBytes;
}

// v0.45: whether a GELU epilogue that also stores the pre-activation runs unfused. The fused
// kernels evaluate erff / tanhf per output in the epilogue, between the tiles' mainloops: on an
// H100 (2026-12-07, benchmarks/profile_linact.py at 4096 x 3072 x 768, bf16) the fused forward
// took 59.3 us with GELU(tanh) and 68.3 us with GELU(erf) against 35.2 us for ReLU on the same
// tile, i.e. 1.9-2.6 us per million outputs of math, where the unfused path's extra cost is one
// more read of z by the activation pass (about 0.7 us per million at 3 TB/s) and the rule's
// own tile for the GEMM. The whole fused layer ran at 0.84-1.02 of nn.Linear + nn.GELU, eager
// or compiled, at the four MLP shapes with h <= 1024 of `bench --what linact --linact-set mlp`
// (results/bench_nvidia-h100-80gb-hbm3_20261207-141247.json), ReLU at 0.99-1.16 there. ReLU
// and the inference path (no pre-activation, one output to write) keep the fused kernels.
// v0.46: GELU(tanh)'s epilogue math is two special-function instructions now
// (activation_forward_epilogue), so it stayed fused where the rule's own tile for the problem is
// the fused kernels' anyway, and the erf form unfused everywhere.
// v0.47: GELU(tanh) fused wherever config 3's walk keeps its operands in L2
// (fused_walk_restreams_operand decides the rest, for every activation): at 4096 x 16384 x 4096,
// where the rule's tile is config 0, the fused forward took 820-832 us against 954 for the GEMM
// + pass (results/probe_linact_forward_..._20261207-155343.txt, swizzles 4 / 1). The erf form
// fused over K >= 2048, where the mainloop of 32 or more k-blocks hides enough of the epilogue:
// 16384 x 8192 x 2048 1023-1039 us fused against 1065 unfused, 4096 x 8192 x 2048 247-248
// against 259 (-155728.txt), 4096 x 16384 x 4096 863-896 against 1017 (-155343.txt); the
// layer's step 0.999 / 1.027 of eager fused under v0.44 against 0.955-0.959 / 1.016-1.020
// unfused under v0.46. Over K = 768 / 1024 it lost (64.2 / 91.0 us against 55.6 / 84.6).
constexpr int64_t kGeluErfFusedMinK = 2048;

bool gelu_aux_runs_unfused(const GemmParams& p) {
  return p.aux != nullptr && p.activation == Activation::kGelu && p.k < kGeluErfFusedMinK;
}

// The rule's choice with the overrides of the params applied (sm90_config / swizzle / splits
// >= their "unset" values). A fused epilogue gets the configuration with fused kernels, or
// config -1 (no fused kernel: the caller runs GEMM + activation) where the rule transposes a
// small-M problem, since the transposed GEMM alone beats the fused 128-row tile there, and for
// a GELU with the pre-activation kept (v0.45 - v0.47, gelu_aux_runs_unfused), and where config
// 3's walk would re-stream an operand the L2 cannot keep (v0.47, fused_walk_restreams_operand).
Sm90Choice resolve_sm90(const GemmParams& p) {
  if (p.dtype_ab == DType::kFloat32) {
    return Sm90Choice{p.fp32_math == Fp32Math::kTf32Split ? kTf32SplitConfig : kTf32Config, 0, 0};
  }
  Sm90Choice c = choose_sm90_config(p);
  const int rule_config = c.config;
  if (has_fused_epilogue(p)) {
    // A row-major tile in place of the transposed problem counts as transposing: the plain GEMM
    // then runs on it, followed by the activation pass.
    const bool unfused =
        is_swapped_config(c.config) || c.stands_in_for_transposed ||
        gelu_aux_runs_unfused(p) || fused_walk_restreams_operand(p, rule_config);
    c.config = unfused && p.sm90_config < 0 ? -1 : kActConfig;
  } else if (p.sm90_config >= 0) {
    c.config = p.sm90_config;
  }
  // The rule's swizzle belongs to the rule's configuration: another one (forced, or the fused
  // kernels') runs with CUTLASS's default unless a swizzle is forced too.
  if (c.config != rule_config) c.swizzle = 0;
  if (p.swizzle > 0) c.swizzle = p.swizzle;
  if (p.splits > 0) c.splits = p.splits;
  return c;
}

// The first registry row that fits params whose sm90_config is already resolved.
const KernelEntry* select_kernel(const GemmParams& p) {
  if (p.sm < 80) return nullptr;
  if (p.m < 1 || p.n < 1 || p.k < 1) return nullptr;
  if (p.a == nullptr || p.b == nullptr || p.d == nullptr) return nullptr;
  if (!valid_dtypes(p.dtype_ab, p.dtype_cd)) return nullptr;
  const bool a_row = p.layout_a == Layout::kRowMajor, b_row = p.layout_b == Layout::kRowMajor;
  // No kernel reads both operands column-major, except the transposed problem's "tt" kernels.
  if (!a_row && !b_row && !p.d_column_major) return nullptr;

  const size_t es_ab = element_size(p.dtype_ab), es_cd = element_size(p.dtype_cd);
  const int align_a = operand_alignment(p.a, p.lda, a_row ? p.k : p.m, a_row ? p.m : p.k, es_ab);
  const int align_b = operand_alignment(p.b, p.ldb, b_row ? p.n : p.k, b_row ? p.k : p.n, es_ab);
  // C and D: contiguous along n (row-major) or m (column-major D of the transposed problem).
  const int64_t cd_contiguous = p.d_column_major ? p.m : p.n;
  const int64_t cd_lines = p.d_column_major ? p.n : p.m;
  const int align_d = operand_alignment(p.d, p.ldd, cd_contiguous, cd_lines, es_cd);
  int align_c = p.c_row_broadcast ? operand_alignment(p.c, 0, cd_contiguous, 1, es_cd)
                                  : operand_alignment(p.c, p.ldc, cd_contiguous, cd_lines, es_cd);
  const int align_ab = align_a < align_b ? align_a : align_b;
  int align_cd = align_c < align_d ? align_c : align_d;
  const bool fits_int = p.m <= INT_MAX && p.n <= INT_MAX && p.k <= INT_MAX;

  // A fused epilogue: D = act(acc + bias) only (no alpha, no accumulation into C).
  const bool fused = has_fused_epilogue(p);
  EpilogueKind want = EpilogueKind::kLinComb;
  if (p.d_column_major) {
    if (fused) return nullptr;
    want = EpilogueKind::kLinCombColMajorD;
  } else if (fused) {
    want = p.aux != nullptr ? EpilogueKind::kActAux : EpilogueKind::kAct;
  }
  // A plain product (beta = 0, no bias): a kernel without a C operand comes first where the
  // configuration has one (the registry lists those rows before the kLinComb ones).
  const bool without_c = want == EpilogueKind::kLinComb && p.epilogue_without_c &&
                         p.beta == 0.0f && !p.c_row_broadcast;
  if (fused) {
    if (p.alpha != 1.0f || (p.beta != 0.0f && !p.c_row_broadcast)) return nullptr;
    if (p.aux != nullptr) {
      const int align_aux = operand_alignment(p.aux, p.ldaux, p.n, p.m, es_cd);
      if (align_aux < align_cd) align_cd = align_aux;
    }
  }

  for (const KernelEntry& e : kKernels) {
    if (e.dtype_ab != p.dtype_ab || e.dtype_cd != p.dtype_cd) continue;
    const bool epilogue_fits =
        e.epilogue == want || (without_c && e.epilogue == EpilogueKind::kLinCombNoC);
    if (!epilogue_fits || e.activation != (fused ? p.activation : Activation::kIdentity)) {
      continue;
    }
    if (e.family != KernelFamily::kFallback &&
        (e.layout_a != p.layout_a || e.layout_b != p.layout_b || !fits_int)) {
      continue;
    }
    if (e.align_ab > align_ab || e.align_cd > align_cd) continue;
    switch (e.family) {
      case KernelFamily::kSm90TmaWs:
        if (p.sm != 90 || p.arch_path != ArchPath::kAuto) continue;
        if (p.dtype_ab == DType::kFloat32 && p.fp32_math == Fp32Math::kIeee) continue;
        if (p.c_row_broadcast && p.beta != 1.0f) continue;  // the fused bias is not scaled
        if (e.config != p.sm90_config) continue;
        break;
      case KernelFamily::kSm80TensorOp:
        if (p.dtype_ab == DType::kFloat32) {
          // config 0: TF32 (allowed by the matmul precision, or operands that are TF32 parts
          // already); config 1: 3xTF32 (fp32 accuracy)
          if (e.config != (p.fp32_math == Fp32Math::kIeee ? 1 : 0)) continue;
        }
        if (p.n > kSm80MaxN) continue;
        break;
      case KernelFamily::kSm80Simt:
        if (p.n > kSm80MaxN) continue;
        break;
      case KernelFamily::kFallback:
        break;
    }
    return &e;
  }
  return nullptr;
}

GemmPlan finish_plan(const GemmParams& p, const KernelEntry* e) {
  GemmPlan plan;
  plan.params = p;
  plan.kernel = e;
  if (e == nullptr) return plan;
  plan.name = e->name;
  size_t bytes = 0;
  if (e->fn(p, nullptr, 0, nullptr, nullptr, &bytes) == GemmStatus::kSuccess) {
    plan.workspace_bytes = bytes;
  }
  return plan;
}

}  // namespace

namespace {

// ---- batched split-K -------------------------------------------------------------------------
// The configuration whose float32-output kernels compute the partial products: config 2, the
// 128x128 cooperative tile without a cluster, run data-parallel (one tile per CTA, no fixup).
constexpr int kBatchedSplitConfig = 2;
// The partial products' offset alignment in the workspace (and the kernel workspace's after them).
constexpr size_t kPartialsAlignment = 256;
// Where the partial GEMM's C and D stand while it is only planned: a non-null, 256-byte aligned
// address that is never dereferenced (run_gemm_plan puts the workspace there).
void* const kPartialsPlaceholder = reinterpret_cast<void*>(uintptr_t(kPartialsAlignment));

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Whether params p (normalized) can run as `slices` batched K slices: 16-bit A and B in the
// weight gradient's layout (A column-major, B row-major; the only layout measured), 16-byte
// aligned with leading dimensions of whole 16-byte vectors (TMA, also for each slice's start),
// K a multiple of `slices`, N a multiple of 4 (the fp32 slices' rows are 16-byte vectors), no
// fused epilogue, on SM90. The output (C, D) may have any alignment: the reduction writes it.
bool batched_split_fits(const GemmParams& p, int slices) {
  if (slices < 2 || p.sm != 90 || p.arch_path != ArchPath::kAuto) return false;
  if (!is_16bit(p.dtype_ab) || !valid_dtypes(p.dtype_ab, p.dtype_cd) || has_fused_epilogue(p)) {
    return false;
  }
  if (p.layout_a != Layout::kColumnMajor || p.layout_b != Layout::kRowMajor) return false;
  if (p.m < 1 || p.n < 1 || p.k < slices || p.k % slices != 0 || p.n % 4 != 0) return false;
  // At most 1 GiB of partial products (a forced -64 slices of a large output would ask for more).
  if (p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX ||
      p.m * p.n > (int64_t(1) << 30) / int64_t(sizeof(float)) / slices) {
    return false;
  }
  if (p.lda % 8 != 0 || p.ldb % 8 != 0 || !aligned16(p.a) || !aligned16(p.b)) return false;
  return p.a != nullptr && p.b != nullptr && p.d != nullptr;
}

// Bytes of the fp32 partial products of p over `slices` slices, rounded up to the alignment.
size_t partials_bytes(const GemmParams& p, int slices) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(p.m) * static_cast<size_t>(p.n) *
                       static_cast<size_t>(slices);
  return (bytes + kPartialsAlignment - 1) / kPartialsAlignment * kPartialsAlignment;
}

// The GEMM of the partial products of p (batched_split_fits(p, slices)): batch l is
// alpha * A[:, l kc : (l + 1) kc] @ B[l kc : (l + 1) kc, :] with kc = K / slices, written as
// fp32 into slice l (m x n, row-major, contiguous) of the partials; C and D at the placeholder.
GemmParams batched_partials(const GemmParams& p, int slices) {
  GemmParams q = p;
  const int64_t kc = p.k / slices;
  q.k = kc;
  q.batch = slices;
  q.batch_stride_a = kc * p.lda;  // A column-major: (i, k) at i + k * lda
  q.batch_stride_b = kc * p.ldb;  // B row-major: (k, j) at k * ldb + j
  q.dtype_cd = DType::kFloat32;
  q.c = q.d = kPartialsPlaceholder;
  q.ldc = q.ldd = p.n;
  q.batch_stride_d = p.m * p.n;
  q.c_row_broadcast = false;
  q.beta = 0.0f;
  q.activation = Activation::kIdentity;
  q.aux = nullptr;
  q.ldaux = 0;
  q.sm90_config = kBatchedSplitConfig;
  q.swizzle = 0;
  q.splits = 1;  // data-parallel: each CTA one whole tile of one slice
  q.epilogue_without_c = false;  // the float32-output kernels all take a C operand
  return q;
}

// The rule's batched split-K (v0.42): the weight gradient's layout with at most a quarter wave
// of 128x128 output tiles over K >= 8192 (16384 x 256 x 1024: 16 tiles over 16384 tokens, 0.575
// of cuBLAS on the H200 on the stream-K tile, whose split-K reduces a tile's splits one after
// another; batched into 8 slices 0.995-1.021 on an H100, 2026-12-07, against 0.75-0.77 there
// before: results/gpu_check_2026-12-07_h100_batched_splitk_rule_v043.md): as many slices as
// fill one wave of tiles, each at least 2048 deep, K a multiple of their number. 0: no batched
// split-K.
int batched_k_slices(const GemmParams& p) {
  if (p.layout_a != Layout::kColumnMajor || p.layout_b != Layout::kRowMajor) return 0;
  const int64_t sms = p.multiprocessors > 0 ? p.multiprocessors : 132;
  const int64_t tiles = ceil_div(p.m, 128) * ceil_div(p.n, 128);
  if (tiles * 4 > sms || p.k < 8192) return 0;
  int64_t slices = std::min<int64_t>(sms / tiles, p.k / 2048);
  while (slices > 1 && p.k % slices != 0) --slices;
  return slices >= 2 && batched_split_fits(p, static_cast<int>(slices))
             ? static_cast<int>(slices)
             : 0;
}

// The plan of p as `slices` batched K slices, or a plan without a kernel where config 2 has no
// float32-output SM90 kernel for it.
GemmPlan batched_split_plan(const GemmParams& p, int slices) {
  const GemmParams q = batched_partials(p, slices);
  const KernelEntry* e = select_kernel(q);
  if (e == nullptr || e->family != KernelFamily::kSm90TmaWs) return GemmPlan{};
  GemmPlan plan = finish_plan(q, e);
  plan.workspace_bytes += partials_bytes(p, slices);
  plan.k_slices = slices;
  plan.output = p;
  return plan;
}

// The selection itself, for normalized params p (d_column_major false).
GemmPlan plan_normalized(GemmParams p) {
  // Batched split-K: forced (splits < 0), else the rule's where no configuration, swizzle or
  // positive split is forced (a forced one that does not fit falls back to the rule's choice).
  int slices = 0;
  if (p.splits < 0 && batched_split_fits(p, -p.splits)) {
    slices = -p.splits;
  } else if (p.splits <= 0 && p.sm90_config < 0 && p.swizzle == 0) {
    slices = batched_k_slices(p);
  }
  if (slices > 1) {
    GemmPlan plan = batched_split_plan(p, slices);
    if (plan.kernel != nullptr) return plan;
  }
  if (p.splits < 0) p.splits = 0;  // batched split-K does not apply here: the rule's split
  const bool splits_forced = p.splits > 0;
  const bool swizzle_forced = p.swizzle > 0;
  const Sm90Choice c = resolve_sm90(p);
  if (c.config < 0) return finish_plan(p, nullptr);  // a fused epilogue with no kernel here
  p.sm90_config = c.config;
  p.swizzle = c.swizzle;
  p.splits = c.splits;
  if (is_swapped_config(c.config)) {
    if (can_transpose(p)) {
      const GemmParams t = transposed(p);
      if (const KernelEntry* e = select_kernel(t)) return finish_plan(t, e);
    }
    // Not transposable (or no kernel takes the transposed operands): the row-major rule, with
    // the wave-fill clauses that replace its choices.
    const Sm90Choice r = with_wave_fill(p, choose_row_major_config(p), /*rule_transposes=*/true);
    p.sm90_config = r.config;
    if (!splits_forced) p.splits = r.splits;
    if (!swizzle_forced) p.swizzle = r.swizzle;
  }
  const KernelEntry* e = select_kernel(p);
  if ((e == nullptr || e->family != KernelFamily::kSm90TmaWs) && !has_fused_epilogue(p) &&
      p.dtype_ab != DType::kFloat32) {
    // A configuration compiled for some layouts / dtypes only (a forced one, or the short-K and
    // the 10-12 ones with a float32 output): the row-major rule's choice where that has an SM90
    // kernel, else config 0 with CUTLASS's default swizzle.
    GemmParams q = p;
    const Sm90Choice r = choose_row_major_config(p);
    q.sm90_config = r.config;
    if (!splits_forced) q.splits = r.splits;
    if (!swizzle_forced) q.swizzle = r.swizzle;
    if (q.sm90_config == p.sm90_config) {
      q.sm90_config = 0;
      if (!swizzle_forced) q.swizzle = 0;
    }
    if (q.sm90_config != p.sm90_config) {
      const KernelEntry* f = select_kernel(q);
      if (f != nullptr && f->family == KernelFamily::kSm90TmaWs) return finish_plan(q, f);
    }
  }
  return finish_plan(p, e);
}

// ---- the plan cache ---------------------------------------------------------------------------
// A model calls the same few GEMM problems over and over; the plan (kernel, configuration, whether
// the problem runs transposed, workspace size) depends on everything in the params except the
// pointer values, of which only the alignment (address mod 16) and null-ness matter. Each thread
// keeps its own cache (no lock on the hot path; autograd's backward runs on its own thread).

using PlanKey = std::array<int64_t, 29>;

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the 64-bit words
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

struct CachedPlan {
  const KernelEntry* kernel;
  bool transposed;  // the plan runs D^T = B^T A^T
  int sm90_config, swizzle, splits;
  size_t workspace_bytes;
  int k_slices;  // > 1: batched split-K (the plan's params are batched_partials of the problem)
};

int64_t pointer_class(const void* ptr) {
  if (ptr == nullptr) return 16;
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr) & 15u);
}

int64_t float_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

PlanKey plan_key(const GemmParams& p) {
  return PlanKey{p.m,
                 p.n,
                 p.k,
                 p.lda,
                 p.ldb,
                 p.ldc,
                 p.ldd,
                 p.ldaux,
                 static_cast<int64_t>(p.layout_a),
                 static_cast<int64_t>(p.layout_b),
                 p.c_row_broadcast,
                 float_bits(p.alpha),
                 float_bits(p.beta),
                 static_cast<int64_t>(p.dtype_ab),
                 static_cast<int64_t>(p.dtype_cd),
                 static_cast<int64_t>(p.fp32_math),
                 static_cast<int64_t>(p.arch_path),
                 p.sm,
                 p.multiprocessors,
                 static_cast<int64_t>(p.activation),
                 p.sm90_config,
                 p.swizzle,
                 p.splits,
                 p.epilogue_without_c,
                 pointer_class(p.a),
                 pointer_class(p.b),
                 pointer_class(p.c) | (p.c == p.d ? 32 : 0),
                 pointer_class(p.d),
                 pointer_class(p.aux)};
}

constexpr size_t kPlanCacheCapacity = 4096;  // entries per thread; the cache restarts when full

}  // namespace

GemmPlan plan_gemm(const GemmParams& params) {
  GemmParams p = normalize(params);
  p.d_column_major = false;  // the dispatcher's own flag
  thread_local std::unordered_map<PlanKey, CachedPlan, PlanKeyHash> cache;
  const PlanKey key = plan_key(p);
  const auto hit = cache.find(key);
  if (hit != cache.end()) {
    const CachedPlan& c = hit->second;
    if (c.k_slices > 1) {
      GemmPlan plan;
      plan.params = batched_partials(p, c.k_slices);
      plan.kernel = c.kernel;
      plan.name = c.kernel->name;
      plan.workspace_bytes = c.workspace_bytes;
      plan.k_slices = c.k_slices;
      plan.output = p;
      return plan;
    }
    p.sm90_config = c.sm90_config;
    p.swizzle = c.swizzle;
    p.splits = c.splits;
    GemmPlan plan;
    plan.params = c.transposed ? transposed(p) : p;
    plan.kernel = c.kernel;
    plan.name = c.kernel != nullptr ? c.kernel->name : "";
    plan.workspace_bytes = c.workspace_bytes;
    return plan;
  }
  GemmPlan plan = plan_normalized(p);
  if (cache.size() >= kPlanCacheCapacity) cache.clear();
  const bool is_transposed = plan.params.d_column_major;
  // The transposed problem keeps the configuration fields of the problem it came from.
  cache.emplace(key, CachedPlan{static_cast<const KernelEntry*>(plan.kernel), is_transposed,
                                plan.params.sm90_config, plan.params.swizzle, plan.params.splits,
                                plan.workspace_bytes, plan.k_slices});
  return plan;
}

const char* gemm_status_string(GemmStatus status) {
  switch (status) {
    case GemmStatus::kSuccess:
      return "success";
    case GemmStatus::kUnsupported:
      return "unsupported: no compiled kernel handles this dtype / layout / arch combination";
    case GemmStatus::kCannotImplement:
      return "cannot implement: the selected kernel rejected the problem";
    case GemmStatus::kWorkspaceTooSmall:
      return "workspace too small";
    case GemmStatus::kInitializeFailed:
      return "kernel initialization failed";
    case GemmStatus::kRunFailed:
      return "kernel run failed";
    case GemmStatus::kLaunchFailed:
      return "kernel launch failed";
  }
  return "unknown GemmStatus";
}

const char* sm90_config_name(int config) {
  switch (config) {
    case 0: return "128x256x64_2x1x1_coop";
    case 1: return "128x192x64_1x1x1_coop";
    case 2: return "128x128x64_1x1x1_coop_streamk";
    case 3: return "128x128x64_1x2x1_pingpong";
    case 4: return "64x16x128_1x1x1_pingpong_swapab";
    case 5: return "64x32x128_1x1x1_pingpong_swapab";
    case 6: return "64x64x128_1x1x1_pingpong_swapab";
    case 7: return "64x128x64_1x1x1_pingpong_swapab";
    case 8: return "128x256x64_2x1x1_coop_epi128x64";
    case 9: return "128x256x64_2x1x1_coop_epi128x128";
    case 10: return "128x192x64_2x1x1_coop";
    case 11: return "64x64x128_1x1x1_pingpong";
    case 12: return "64x32x128_1x1x1_pingpong";
    case 13: return "64x128x64_1x1x1_pingpong";
    case 14: return "256x128x64_1x2x1_coop";
    case 15: return "128x128x64_1x1x1_pingpong";
    case 16: return "64x64x64_1x1x1_pingpong_swapab";
    case 17: return "128x96x64_1x1x1_pingpong";
    case 18: return "192x96x64_1x1x1_pingpong";
    case 19: return "192x128x64_1x1x1_pingpong";
    case 20: return "128x256x32_2x1x1_coop";
    case 21: return "128x128x32_2x1x1_coop_promoted";
  }
  return nullptr;
}

GemmStatus run_gemm_plan(const GemmPlan& plan, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream, const char** detail) {
  if (detail != nullptr) *detail = "";
  const auto* e = static_cast<const KernelEntry*>(plan.kernel);
  if (e == nullptr) {
    if (detail != nullptr) {
      *detail =
          has_fused_epilogue(plan.params)
              ? "no compiled kernel fuses this epilogue (fused activations need an SM90 GPU, "
                "16-bit dtypes, 16-byte aligned operands, and more than 128 rows or a narrow N)"
              : "no compiled GEMM kernel for this combination (needs sm >= 80; dtype_cd must "
                "equal dtype_ab or be float32 for 16-bit A/B; A and B may not both be "
                "column-major)";
    }
    return GemmStatus::kUnsupported;
  }
  if (plan.k_slices > 1) {
    // The partial products first in the workspace, the kernel's own workspace after them.
    const size_t partials = partials_bytes(plan.output, plan.k_slices);
    if (workspace == nullptr || workspace_bytes < plan.workspace_bytes ||
        (reinterpret_cast<uintptr_t>(workspace) % kPartialsAlignment) != 0) {
      if (detail != nullptr) {
        *detail = "the batched split-K needs the plan's workspace, 256-byte aligned";
      }
      return GemmStatus::kWorkspaceTooSmall;
    }
    GemmParams q = plan.params;
    q.c = q.d = workspace;
    const GemmStatus status = e->fn(q, static_cast<char*>(workspace) + partials,
                                    workspace_bytes - partials, stream, detail, nullptr);
    if (status != GemmStatus::kSuccess) return status;
    const GemmStatus reduced =
        reduce_k_slices(static_cast<const float*>(workspace), plan.k_slices, plan.output, stream);
    if (reduced != GemmStatus::kSuccess && detail != nullptr) {
      *detail = "the batched split-K's reduction kernel did not launch";
    }
    return reduced;
  }
  return e->fn(plan.params, workspace, workspace_bytes, stream, detail, nullptr);
}

const char* gemm_kernel_name(const GemmParams& params) { return plan_gemm(params).name; }

size_t gemm_workspace_size(const GemmParams& params) {
  return plan_gemm(params).workspace_bytes;
}

GemmStatus run_gemm(const GemmParams& params, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream, const char** detail) {
  return run_gemm_plan(plan_gemm(params), workspace, workspace_bytes, stream, detail);
}

}  // namespace kernels
}  // namespace cutlass_nn
