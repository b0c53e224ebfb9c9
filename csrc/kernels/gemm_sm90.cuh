// CUTLASS 3.x SM90 (Hopper) GEMM: TMA loads, warp-specialized WGMMA mainloop, TMA epilogue.
//
//   D = alpha * (A @ B) + beta * C + bias[n]        (EpilogueKind::kLinComb)
//   D = act(A @ B + bias[n])                        (kAct, act fixed per kernel)
//   aux = A @ B + bias[n], D = act(aux)             (kActAux: the pre-activation for backward)
//   D = alpha * (A @ B) + beta * C + bias[m]        (kLinCombColMajorD: C, D column-major; the
//                                                    dispatcher's transposed small-M problem)
//
// A/B are 16-bit (f16 / bf16), or float32 on TF32 tensor cores (configs 16 and 17, "tn" only);
// accumulation is fp32, C/D are RowMajor (but see kLinCombColMajorD) with the A/B dtype or fp32.
// "PerColBias" in CUTLASS is a Sm90RowBroadcast with stride (_0, _1): one value per column n,
// i.e. exactly nn.Linear's bias. A null bias pointer reads as 0 (EnableNullptr), so the same kernel
// serves plain GEMMs. With beta == 0 the epilogue skips the C load entirely.
//
// The dispatcher (gemm_dispatch.cu) only routes here when every operand is 16-byte aligned
// (TMA requirement) and, for the row-broadcast bias, when beta == 1 (the bias is not scaled).
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cluster_launch.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "activation_math.h"
#include "gemm_launch.cuh"
#include "launch_settings.h"
#include "stream_k_scheduler.cuh"

// The PDL launches below (launch_settings.h) are safe only for kernels that wait with
// griddepcontrol.wait before touching global memory, i.e. CUTLASS's SM90 kernels compiled with
// this define; every build of the extension sets it (cutlass_nn/_build_config.py, CMakeLists.txt).
#ifndef CUTLASS_ENABLE_GDC_FOR_SM90
#error "gemm_sm90.cuh: compile with -DCUTLASS_ENABLE_GDC_FOR_SM90 (the kernels are launched with PDL)"
#endif

namespace cutlass_nn {
namespace kernels {

// Tile configurations of the SM90 family, indexed by KernelTag's Config. The dispatcher's
// per-shape rule (gemm_dispatch.cu, choose_sm90_config) picks one; the benchmark's --sweep mode
// times each of them. To add one: a specialization here, its name in scripts/generate_kernels.py
// (SM90_CONFIGS), rerun the generator, and a line in the rule.
template <int Config>
struct Sm90TileConfig;

// 0: the large-problem default: 128x256 CTA tile, 2-CTA cluster along M, cooperative (both
// consumer warpgroups on one tile), persistent data-parallel scheduler.
template <>
struct Sm90TileConfig<0> {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// 1: config 10's 128x192 cooperative tile without a cluster (v0.30; until then this slot held
// config 0 with the stream-K scheduler, which won no measured shape after v0.10). It is the tile
// cuBLAS runs on the weight gradient of a 2816 x 1024 layer over 4096 tokens (22 x 6 = 132 tiles,
// one wave of an H100 / H200). There config 10's 2x1 cluster couples the two CTAs' pipelines (a
// stage is refilled only when both consumers released it) and ran at 0.52-0.76 of cuBLAS; this
// tile 0.976, against 0.853 for the stream-K tile the rule took before (NOTES v0.30).
// Compiled with the input dtype out only.
template <>
struct Sm90TileConfig<1> {
  using TileShape = cute::Shape<cute::_128, cute::_192, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// 2: 128x128 tile, no cluster, stream-K: for few output tiles (decode-like small M, or small
// N): the K dimension is spread over all SMs so the whole GPU streams the weight.
template <>
struct Sm90TileConfig<2> {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = StreamKScheduler;  // stream_k_scheduler.cuh
};

// 3: 128x128 tile, 2-CTA cluster along N, ping-pong (the two consumer warpgroups alternate
// between tiles, so one's epilogue overlaps the other's mainloop), persistent.
template <>
struct Sm90TileConfig<3> {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// 4-7 (and 16, below): the transposed problem of a small M (decode-like: 1..128 rows), D^T = B^T A^T, with D^T
// column-major (GemmParams::d_column_major). The weight becomes the M side, cut into 64-row
// tiles: 128 tiles for N = 8192, each CTA streaming its own slab of the weight through the whole
// K loop while the few token rows (the N side) come from L2. Ping-pong, since the 64-row tile is
// one warpgroup's WGMMA height; no cluster (a 2x1 cluster multicasting the token tile measured
// 2-13% slower, benchmarks/NOTES.md v0.4). The N tile (16, 32, 64, 128 token rows) is the
// rule's choice: one N tile for all rows where the weight tiles fill the SMs, narrower ones
// (the weight slab re-read from L2) where they do not.
template <int TokenTile, int KBlock>
struct Sm90SwappedTileConfig {
  using TileShape = cute::Shape<cute::_64, cute::Int<TokenTile>, cute::Int<KBlock>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};
// 128-deep k-blocks for the narrow tiles (~20-32 KiB per stage), 64-deep for the 128-wide one.
template <> struct Sm90TileConfig<4> : Sm90SwappedTileConfig<16, 128> {};
template <> struct Sm90TileConfig<5> : Sm90SwappedTileConfig<32, 128> {};
template <> struct Sm90TileConfig<6> : Sm90SwappedTileConfig<64, 128> {};
template <> struct Sm90TileConfig<7> : Sm90SwappedTileConfig<128, 64> {};
// 16 (v0.41; numbered after the others): config 6's 64x64 tile with 64-deep k-blocks, 16 KiB per
// stage, twice config 6's stages. For a long K: on the row-major 64x64 tile the deeper pipeline
// ran 5-9% faster than 128-deep k-blocks over K = 2816-3072 at 512 rows (H200, back to back,
// results/variant_ab_nvidia-h200_20261202-161310.txt), level elsewhere.
template <> struct Sm90TileConfig<16> : Sm90SwappedTileConfig<64, 64> {};

// 8, 9: the short-K configurations (wgrad over a few tokens, K <= 256): config 0 with a wider
// epilogue tile. With K that short the kernel is the output write; the default 128x32 epilogue
// tile with two store stages keeps 16 KiB of TMA stores in flight per SM (bf16), about 2 TB/s
// over 132 SMs, well under the memory's write rate. 128x64 / 128x128 epilogue tiles hold 2x / 4x
// that (the C/D staging then takes 64 / 96 KiB of shared memory, leaving the mainloop 3 / 2
// stages, plenty for a K of a few k-blocks). Compiled for 16-bit outputs (config 9's staging
// would not fit fp32 ones).
template <>
struct Sm90TileConfig<8> : Sm90TileConfig<0> {
  using EpilogueTile = cute::Shape<cute::_128, cute::_64>;
};
template <>
struct Sm90TileConfig<9> : Sm90TileConfig<0> {
  using EpilogueTile = cute::Shape<cute::_128, cute::_128>;
};

// 10: 128x192 tile, 2-CTA cluster along M, cooperative, persistent: between config 0's 128x256
// and config 3's 128x128. A 192-row weight tile is what cuBLAS runs on many mid-size transformer
// shapes (its nvjet 192x128 / 192x192 kernels, results/cublas_kernels_h100_20261124.json); it
// changes the wave count (N = 2816: 15 tiles per token row instead of 11 or 22) and holds 40 KiB
// per pipeline stage (5 stages).
template <>
struct Sm90TileConfig<10> {
  using TileShape = cute::Shape<cute::_128, cute::_192, cute::_64>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// 11, 12: the weight gradient of a small layer over many tokens (an output of a few 128x128
// tiles, K in the thousands): 64-row tiles (one warpgroup's WGMMA height) of 64 / 32 columns,
// ping-pong, persistent, no split of K. Many small tiles fill the SMs with whole-K work (256 x
// 1024 over 4096 tokens: 64 / 128 tiles) where config 2 splits K and pays for the reduction;
// cuBLAS runs 64x32 / 128x64 tiles with deep pipelines there. 128-deep k-blocks (32 / 24 KiB per
// stage). Compiled for the wgrad layout with the input dtype out.
template <int Columns>
struct Sm90SmallWgradTileConfig {
  using TileShape = cute::Shape<cute::_64, cute::Int<Columns>, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};
template <> struct Sm90TileConfig<11> : Sm90SmallWgradTileConfig<64> {};
template <> struct Sm90TileConfig<12> : Sm90SmallWgradTileConfig<32> {};

// 13: 64x128 tile, ping-pong (each consumer warpgroup runs a whole tile with 64x128 WGMMAs),
// no cluster, persistent: a mid-size output (1024 x 1024: 128 tiles) fills the SMs with whole-K
// tiles. What cuBLAS runs on the weight gradient of a 1024 x 1024 layer over 4096 tokens (its
// nvjet "128x64 1x2" kernel, whose M is our N). Until v0.28 this configuration was a cooperative
// 128x64 tile with a 1x2 cluster, which splits the tile into one 64x64 WGMMA per warpgroup: a
// 64x64x16 WGMMA reads 4 KiB of shared memory per 32 clocks at full tensor rate, all that the
// SM's shared memory delivers, and that tile ran 0.79 of cuBLAS there against this one's 0.99
// (benchmarks/NOTES.md v0.28; with a 2x1 cluster the same tile ran 0.78). 24 KiB per stage.
template <>
struct Sm90TileConfig<13> {
  using TileShape = cute::Shape<cute::_64, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// 14: 256x128 tile, 2-CTA cluster along N, cooperative (each consumer warpgroup 128x128),
// persistent: config 0's tile turned around (256 token rows, 128 weight columns), the tile and
// cluster cuBLAS runs on most mid-size and large transformer GEMMs (nvjet 256x128 1x2 "coopA").
// 48 KiB per stage (4 stages).
template <>
struct Sm90TileConfig<14> {
  using TileShape = cute::Shape<cute::_256, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// 15: config 3's 128x128 ping-pong tile without a cluster (v0.37): the forward GEMM of a layer
// with 1024 outputs over 3073-4096 tokens (1.5-1.94 waves of 128x128 tiles), where the
// 1x2 cluster's coupled pipelines (a stage is refilled only when both CTAs released it) cost more
// than the A-tile multicast saves. Isolated on an H200 (scripts/gemm_variant_ab.sh, NOTES v0.37),
// us per call against config 3 / 14 / cuBLAS, best of rasters and swizzles: 4096 x 1024 x 1024
// 16.44 vs 16.69 / 17.28 / 15.97; 4096 x 1024 x 2816 37.33 vs 38.41 / 38.66 / 37.12 (the rule's
// choices and what they measured: gemm_dispatch.cu, pingpong_without_cluster_takes).
template <>
struct Sm90TileConfig<15> : Sm90TileConfig<3> {
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
};

// 17-19 (v0.49): tiles whose counts fill whole waves of 132 SMs at transformer shapes where the
// 128-multiple tiles leave a wave a third to half empty (what cuBLAS runs there: its nvjet
// 96x128, 192x96 and 128x192 kernels, results/cublas_kernels_h100_20261124.json). Ping-pong, no
// cluster; each consumer warpgroup holds a whole tile's accumulators (96, 144 and 192 fp32
// registers per thread).
// 17: 128x96. 512 token rows x 3072 (2816) outputs: 4 x 32 (30) = 128 (120) tiles, against 4 x 24
// = 96 of 128x128 and 48 x 4 = 192 (1.45 waves) of the transposed problem's 64x128 tiles; the
// 3072 x 1024 weight gradient: 24 x 11 = 264, two full waves.
template <>
struct Sm90TileConfig<17> {
  using TileShape = cute::Shape<cute::_128, cute::_96, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};
// 18: 192x96, three 64-row WGMMAs per k-step. The weight gradients of 768 <-> 3072 layers: 3072 x
// 768 in 16 x 8 = 128 tiles, 768 x 3072 in 4 x 32 = 128 (128x128: 144, 1.09 waves).
template <>
struct Sm90TileConfig<18> : Sm90TileConfig<17> {
  using TileShape = cute::Shape<cute::_192, cute::_96, cute::_64>;
};
// 19: 192x128. The 3072 x 1024 weight gradient (a 1024 -> 3072 layer): 16 x 8 = 128 tiles,
// against 96 of 256x128 and 192 of 128x128.
template <>
struct Sm90TileConfig<19> : Sm90TileConfig<17> {
  using TileShape = cute::Shape<cute::_192, cute::_128, cute::_64>;
};

// 20 and 21 (apart from the 16-bit configurations, which the sweep enumerates; 17 and 18 until
// v0.49): float32 operands on TF32 tensor cores, K-major A and B (the "tn" layout) only, 32-deep
// k-blocks.
// 20: TF32 matmuls (float32 matmul precision "high"): 128x256 tiles, 4 pipeline stages.
template <>
struct Sm90TileConfig<20> {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_32>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};

// 21: the 3xTF32 path of precision "highest" (operands split into TF32 parts by the binding,
// split_tf32.h). Every product of TF32 parts is exact in fp32, but WGMMA's fp32 accumulation is
// not IEEE round-to-nearest: one TF32 GEMM over the split operands measured 1.0e-5 relative error
// against cuBLAS fp32's 2.2e-7 (4096^3, H200), its results biased toward zero. So the WGMMA
// accumulator is restarted every kPromotionInterval MMAs (4 MMAs per 32-deep k-block) after its
// partial sum is added, with ordinary fp32 adds, into a second register accumulator (CUTLASS's
// promoting mainloop, written for FP8 but type-generic). Two accumulators per thread limit the
// tile to 128x128 (64 + 64 registers per consumer thread). Each promotion first waits for every
// MMA in flight, so the interval trades speed for accuracy. Measured at 8192^3 on an H200
// (benchmarks/NOTES.md v0.6; cuBLAS fp32 error 1.6e-6 against float64): every k-block (4 MMAs)
// 11.5 ms, error 6.6e-7; every second one (8 MMAs) 11.1 ms, 5.0e-7; every fourth (16 MMAs,
// 128-deep partial sums) is the setting.
template <>
struct Sm90TileConfig<21> {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_32>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  // MMAs (m64n128k8, 4 per k-block) between promotions; a multiple of the MMAs per k-block.
  static constexpr int kPromotionInterval = 16;
};

// The mainloop of a configuration: CUTLASS's builder's choice, or, where the configuration names
// a kPromotionInterval, the same collective with the promoting dispatch policy swapped in.
template <class Built>
struct WithPromotedAccumulation;
template <int Stages, class Cluster, class Schedule, class... Rest>
struct WithPromotedAccumulation<cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<Stages, Cluster, Schedule>, Rest...>> {
  using type = cutlass::gemm::collective::CollectiveMma<
      cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<Stages, Cluster, Schedule>, Rest...>;
};

template <class Cfg, class = void>
struct PromotionOf {
  static constexpr int kInterval = 0;  // WGMMA accumulates on its own
  template <class Built>
  using Mainloop = Built;
};
template <class Cfg>
struct PromotionOf<Cfg, std::void_t<decltype(Cfg::kPromotionInterval)>> {
  static constexpr int kInterval = Cfg::kPromotionInterval;
  template <class Built>
  using Mainloop = typename WithPromotedAccumulation<Built>::type;
};

// The epilogue tile of a configuration: its EpilogueTile where it names one, else CUTLASS's
// choice (128x32 for the cooperative schedule, 64x32 for ping-pong, 16-bit outputs).
template <class Cfg, class = void>
struct EpilogueTileOf {
  using type = cutlass::epilogue::collective::EpilogueTileAuto;
};
template <class Cfg>
struct EpilogueTileOf<Cfg, std::void_t<typename Cfg::EpilogueTile>> {
  using type = typename Cfg::EpilogueTile;
};

// The activation of a fused epilogue, fixed at compile time (one kernel per activation: a
// run-time switch over all of them inlined into every epilogue fragment made the first version
// of these kernels 2.3x slower than the plain GEMM, see benchmarks/NOTES.md). Evaluated on the
// fp32 value z = acc + bias with activation_math.h's epilogue form: the scalar math the
// elementwise kernels and the CPU reference share, except GELU(tanh), computed as z * sigmoid(2u)
// with the fast exponential and division (v0.46: tanhf made the fused forward 1.7x slower).
template <Activation A>
struct ActivationOf {
  template <class T>
  struct Fn {
    CUTLASS_HOST_DEVICE T operator()(T const& z) const {
      return T(activation_forward_epilogue(A, static_cast<float>(z)));
    }
  };
  template <class T, int N>
  struct Fn<cutlass::Array<T, N>> {
    CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& z) const {
      cutlass::Array<T, N> out;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i) {
        out[i] = T(activation_forward_epilogue(A, static_cast<float>(z[i])));
      }
      return out;
    }
  };
};

// The epilogue fusion of each Epilogue kind (see gemm_registry.h), and the storage order of its
// C and D.
template <EpilogueKind E>
using Sm90LayoutCD = std::conditional_t<E == EpilogueKind::kLinCombColMajorD,
                                        cutlass::layout::ColumnMajor, cutlass::layout::RowMajor>;

template <EpilogueKind E, class ElementCD, Activation A>
struct Sm90Fusion;

template <class ElementCD, Activation A>
struct Sm90Fusion<EpilogueKind::kLinComb, ElementCD, A> {
  // D = alpha * acc + beta * C + bias[n]; bias has the output dtype.
  using Op = cutlass::epilogue::fusion::LinCombPerColBias<ElementCD, float, ElementCD, ElementCD,
                                                          float>;
};

template <class ElementCD, Activation A>
struct Sm90Fusion<EpilogueKind::kLinCombNoC, ElementCD, A> {
  // D = alpha * acc: no source (the builder's ElementC is void, see Sm90Gemm), no bias.
  using Op = cutlass::epilogue::fusion::LinearCombination<ElementCD, float, void, float>;
};

template <class ElementCD, Activation A>
struct Sm90Fusion<EpilogueKind::kLinCombColMajorD, ElementCD, A> {
  // The transposed problem: D^T = alpha * acc + beta * C^T + bias[m'] (the bias of the original
  // problem's columns is one value per row now: Sm90ColBroadcast, also null-safe).
  using Op = cutlass::epilogue::fusion::LinCombPerRowBias<ElementCD, float, ElementCD, ElementCD,
                                                          float>;
};

template <class ElementCD, Activation A>
struct Sm90Fusion<EpilogueKind::kAct, ElementCD, A> {
  // D = act(alpha * acc + bias[n])
  using Op = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<
      ActivationOf<A>::template Fn, ElementCD, float, ElementCD, ElementCD, float>;
};

template <class ElementCD, Activation A>
struct Sm90Fusion<EpilogueKind::kActAux, ElementCD, A> {
  // aux = alpha * acc + bias[n] (the pre-activation, row-major like D); D = act(aux)
  using Op = cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<
      cutlass::layout::RowMajor, ActivationOf<A>::template Fn, ElementCD, float, ElementCD,
      ElementCD, ElementCD, float>;
};

// The CUTLASS type, parameterized by everything a per-shape selection may want to vary.
template <class ElementAB, class ElementCD, class LayoutA, class LayoutB, class Cfg,
          EpilogueKind Epi, Activation Act>
struct Sm90Gemm {
  using ElementAccumulator = float;
  using ElementCompute = float;
  using TileShape = typename Cfg::TileShape;
  using ClusterShape = typename Cfg::ClusterShape;
  static constexpr int kAlignmentAB = 128 / cutlass::sizeof_bits<ElementAB>::value;  // 16 bytes
  static constexpr int kAlignmentCD = 128 / cutlass::sizeof_bits<ElementCD>::value;

  using FusionOp = typename Sm90Fusion<Epi, ElementCD, Act>::Op;
  using LayoutCD = Sm90LayoutCD<Epi>;
  static constexpr bool kColumnMajorD = Epi == EpilogueKind::kLinCombColMajorD;
  // No C operand for kLinCombNoC: CUTLASS then reserves no C stages in shared memory and waits
  // for each TMA store one subtile later (DelayTmaStore).
  static constexpr bool kWithoutC = Epi == EpilogueKind::kLinCombNoC;
  using ElementC = std::conditional_t<kWithoutC, void, ElementCD>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      typename EpilogueTileOf<Cfg>::type, ElementAccumulator, ElementCompute,
      ElementC, LayoutCD, kAlignmentCD,   // C (void: none)
      ElementCD, LayoutCD, kAlignmentCD,  // D
      typename Cfg::EpilogueSchedule, FusionOp>::CollectiveOp;

  using CollectiveMainloop = typename PromotionOf<Cfg>::template Mainloop<
      typename cutlass::gemm::collective::CollectiveBuilder<
          cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignmentAB,
          ElementAB, LayoutB, kAlignmentAB, ElementAccumulator, TileShape, ClusterShape,
          cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
              sizeof(typename CollectiveEpilogue::SharedStorage))>,
          typename Cfg::KernelSchedule>::CollectiveOp>;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, typename Cfg::TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;

  // All strides are int64_t (64-bit offsets); the batch (L) strides are p.batch_stride_* (0 for
  // the single GEMM, p.batch == 1; the batched split-K's partial products otherwise, which have a
  // row-major D and no bias, aux or fused epilogue: those paths below keep a batch stride of 0).
  static typename Gemm::Arguments make_arguments(const GemmParams& p) {
    using cute::_1;
    StrideA stride_a;
    if constexpr (std::is_same<LayoutA, cutlass::layout::RowMajor>::value) {
      stride_a = cute::make_stride(p.lda, _1{}, p.batch_stride_a);  // (m, k): k contiguous
    } else {
      stride_a = cute::make_stride(_1{}, p.lda, p.batch_stride_a);  // (m, k): m contiguous
    }
    // CUTLASS 3.x views B as n x k.
    StrideB stride_b;
    if constexpr (std::is_same<LayoutB, cutlass::layout::ColumnMajor>::value) {
      stride_b = cute::make_stride(p.ldb, _1{}, p.batch_stride_b);  // element (k, n) at k + n * ldb
    } else {
      stride_b = cute::make_stride(_1{}, p.ldb, p.batch_stride_b);  // element (k, n) at k * ldb + n
    }
    StrideC stride_c;
    StrideD stride_d;
    if constexpr (kColumnMajorD) {
      stride_c = cute::make_stride(_1{}, p.ldc, int64_t(0));  // (m, n): m contiguous
      stride_d = cute::make_stride(_1{}, p.ldd, int64_t(0));
    } else {
      // C shares D's batch stride: the batched partial products read no C (beta = 0), but its
      // TMA descriptor spans the same batches.
      stride_c = cute::make_stride(p.ldc, _1{}, p.batch_stride_d);  // (m, n): n contiguous
      stride_d = cute::make_stride(p.ldd, _1{}, p.batch_stride_d);
    }

    cutlass::KernelHardwareInfo hw_info;
    int device = 0;
    cudaGetDevice(&device);
    hw_info.device_id = device;
    int sms = p.multiprocessors;
    if (sms <= 0) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    hw_info.sm_count = sms;

    const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, p.batch},
        {static_cast<const ElementAB*>(p.a), stride_a, static_cast<const ElementAB*>(p.b),
         stride_b},
        {{}, kWithoutC ? nullptr : static_cast<const ElementCD*>(p.c), stride_c,
         static_cast<ElementCD*>(p.d), stride_d},
        hw_info};
    if constexpr (PromotionOf<Cfg>::kInterval > 0) {
      args.mainloop.mma_promotion_interval = PromotionOf<Cfg>::kInterval;
    }
    // Rasterization swizzle of the tile scheduler (1 = none): neighbouring CTAs share A or B
    // tiles in L2.
    if (p.swizzle > 0) args.scheduler.max_swizzle_size = p.swizzle;
    if constexpr (std::is_same<typename Cfg::TileScheduler, StreamKScheduler>::value) {
      using Decomposition = cutlass::gemm::kernel::detail::DecompositionMode;
      if (p.splits == 1) {
        args.scheduler.decomposition_mode = Decomposition::DataParallel;
      } else if (p.splits > 1) {
        args.scheduler.splits = p.splits;
        args.scheduler.decomposition_mode = Decomposition::SplitK;
      }
    }

    auto& fusion = args.epilogue.thread;
    fusion.alpha = p.alpha;
    if constexpr (kWithoutC) {
      fusion.beta = 0.0f;  // the dispatcher picks these kernels for beta == 0 without a bias only
    } else if (p.c_row_broadcast) {
      // bias[n] added unscaled; the dispatcher guarantees beta == 1 here. The C operand itself
      // is unused (beta = 0 skips its TMA load); ptr_C still points at valid memory (D) because
      // a TMA descriptor is built for it.
      fusion.beta = 0.0f;
      fusion.bias_ptr = static_cast<const ElementCD*>(p.c);
      if constexpr (kColumnMajorD) {
        fusion.dBias = cute::make_stride(cute::_1{}, cute::_0{}, int64_t(0));  // bias[m]
      } else {
        fusion.dBias = cute::make_stride(cute::_0{}, cute::_1{}, int64_t(0));  // bias[n]
      }
      args.epilogue.ptr_C = static_cast<const ElementCD*>(p.d);
      args.epilogue.dC = stride_d;
    } else {
      fusion.beta = p.beta;
      fusion.bias_ptr = nullptr;
    }
    if constexpr (Epi == EpilogueKind::kActAux) {
      fusion.aux_ptr = static_cast<ElementCD*>(p.aux);
      fusion.dAux = cute::make_stride(p.ldaux, _1{}, int64_t(0));
    }
    return args;
  }
};

namespace detail {

// Whether a kernel's dynamic shared-memory attribute is set on a device (one flag per kernel
// instantiation and device). The attribute belongs to the function in the device's context, so
// setting it once per device is enough; CUTLASS 3.x's initialize() sets it on every call, a
// cudaFuncSetAttribute per GEMM on the host's critical path.
template <class Gemm>
struct SmemAttribute {
  static std::atomic<uint64_t>& flags() {
    static std::atomic<uint64_t> bits{0};
    return bits;
  }
  static bool ready(int device) {
    return device >= 0 && device < 64 && ((flags().load(std::memory_order_acquire) >> device) & 1u);
  }
  static void mark(int device) {
    if (device >= 0 && device < 64) flags().fetch_or(uint64_t{1} << device, std::memory_order_release);
  }
};

// Launches an SM90 kernel whose attributes are already set on this device: what
// GemmUniversalAdapter::run(params, stream, nullptr, pdl) does (no host adapter), less the
// cudaFuncSetAttribute(NonPortableClusterSizeAllowed) that CUTLASS's cluster launcher makes
// before every launch of a kernel with a cluster larger than 1x1x1.
template <class Gemm>
cutlass::Status launch_sm90(typename Gemm::Params& params, cudaStream_t stream, bool pdl) {
  using Kernel = typename Gemm::GemmKernel;
  using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
  constexpr bool kSingleCta = cute::is_static_v<Cluster> && cute::size(Cluster{}) == 1;
  if constexpr (kSingleCta) {
    return Gemm::run(params, stream, /*cuda_adapter=*/nullptr, pdl);  // no attribute calls
  } else {
    const dim3 block = Kernel::get_block_shape();
    const dim3 grid = Gemm::get_grid_shape(params);
    const dim3 cluster(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}),
                       cute::size<2>(Cluster{}));
    auto config = cutlass::ClusterLauncher::make_cluster_launch_config(
        grid, cluster, block, Kernel::SharedStorageSize, stream, pdl);
    config.launch_config.attrs = config.launch_attribute;  // this copy's own attribute array
    void* kernel_params[] = {&params};
    const cudaError_t err = cudaLaunchKernelExC(
        &config.launch_config, reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>),
        kernel_params);
    return err == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal;
  }
}

// run_cutlass for CUTLASS 3.x device operators (GemmUniversalAdapter): the first call per
// device goes through initialize() and run(), which set the kernel's attributes (dynamic shared
// memory, non-portable cluster size); later calls build the kernel parameters themselves
// (initialize_workspace + to_underlying_arguments, what initialize() does besides the
// attribute) and launch with launch_sm90, which sets none.
template <class Gemm>
GemmStatus run_cutlass3(typename Gemm::Arguments const& args, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream, const char** detail,
                        size_t* workspace_query) {
  if (workspace_query != nullptr) {
    *workspace_query = Gemm::get_workspace_size(args);
    return GemmStatus::kSuccess;
  }
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) {
    return fail(GemmStatus::kCannotImplement, detail,
                "CUTLASS can_implement() rejected the problem (sizes, strides or alignment)");
  }
  size_t needed = Gemm::get_workspace_size(args);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return fail(GemmStatus::kWorkspaceTooSmall, detail,
                "workspace smaller than gemm_workspace_size()");
  }
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  const bool pdl = programmatic_launch_enabled();
  if (!SmemAttribute<Gemm>::ready(device)) {
    Gemm gemm;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) {
      return fail(GemmStatus::kInitializeFailed, detail, "CUTLASS initialize() failed");
    }
    if (gemm.run(stream, /*cuda_adapter=*/nullptr, pdl) != cutlass::Status::kSuccess) {
      return fail(GemmStatus::kRunFailed, detail, "CUTLASS run() failed");
    }
    SmemAttribute<Gemm>::mark(device);
  } else {
    using Kernel = typename Gemm::GemmKernel;
    if (Kernel::initialize_workspace(args, workspace, stream, nullptr) !=
        cutlass::Status::kSuccess) {
      return fail(GemmStatus::kInitializeFailed, detail,
                  "CUTLASS initialize_workspace() failed");
    }
    typename Gemm::Params params = Kernel::to_underlying_arguments(args, workspace);
    if (launch_sm90<Gemm>(params, stream, pdl) != cutlass::Status::kSuccess) {
      return fail(GemmStatus::kRunFailed, detail, "CUTLASS run() failed");
    }
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(GemmStatus::kLaunchFailed, detail,
                "cudaGetLastError() after the CUTLASS kernel launch was not cudaSuccess");
  }
  return GemmStatus::kSuccess;
}

}  // namespace detail

template <DType AB, DType CD, Layout LA, Layout LB, int Align, int Config, EpilogueKind Epi,
          Activation Act>
struct KernelImpl<KernelTag<KernelFamily::kSm90TmaWs, AB, CD, LA, LB, Align, Config, Epi, Act>> {
  using Op = Sm90Gemm<detail::element_t<AB>, detail::element_t<CD>, detail::layout_t<LA>,
                      detail::layout_t<LB>, Sm90TileConfig<Config>, Epi, Act>;
  static_assert(Align == Op::kAlignmentAB, "SM90 kernels use 16-byte alignment");
  static_assert(AB != DType::kFloat32 || ((Config == 20 || Config == 21) &&
                                          LA == Layout::kRowMajor && LB == Layout::kColumnMajor),
                "float32 (TF32) SM90 kernels: config 20 or 21, K-major A and B (tn) only");
  static_assert((Epi == EpilogueKind::kLinCombColMajorD) ==
                    ((Config >= 4 && Config <= 7) || Config == 16),
                "configs 4-7 and 16 (and only they) run the transposed small-M problem");

  static GemmStatus launch(const GemmParams& p, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, const char** detail, size_t* workspace_query) {
    typename Op::Gemm::Arguments args = Op::make_arguments(p);
    return detail::run_cutlass3<typename Op::Gemm>(args, workspace, workspace_bytes, stream,
                                                   detail, workspace_query);
  }
};

}  // namespace kernels
}  // namespace cutlass_nn
