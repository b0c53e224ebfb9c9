// CUTLASS 3.x SM90 FP8 GEMM: TMA loads, warp-specialized WGMMA on e4m3 / e5m2 operands, and an
// epilogue that applies the dequantization scales and the bias (fp8_gemm.h states the contract):
//
//   D = b_scale[n] * (a_scale[m] * acc) + bias[n]
//
// Each scale is a CUTLASS broadcast with a run-time stride (Sm90ColBroadcast / Sm90RowBroadcast
// with a `bool` stride): stride true reads one value per row (column), false reads element 0 for
// all, so one kernel serves tensorwise, rowwise and mixed scaling. A null bias reads as 0.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/float8.h"
#include "fp8_gemm.h"
#include "fp8_overlapped_promotion.cuh"
#include "gemm_sm90.cuh"  // detail::run_cutlass3 (the launch without per-call attribute calls)

namespace cutlass_nn {
namespace kernels {

// Tile configurations of the FP8 kernels (index = Fp8GemmParams::config; names in
// fp8_gemm_dispatch.cu). K-blocks are 128 deep (128 bytes of FP8 per row, one TMA box row).
// With accumulation promoted every 128-deep block, each consumer thread holds two fp32
// accumulators on CUTLASS's mainloop (a consumer warpgroup's tile at most 64x192: 96 + 96
// registers) and three on the overlapped one (fp8_overlapped_promotion.cuh: at most 64x128,
// 3 x 64 registers); the unpromoted ("fast accumulation") schedule allows 64x256 per warpgroup.
// Which configuration runs where: choose_fp8_config (fp8_gemm_dispatch.cu).
template <int Config>
struct Fp8TileConfig;

// 0: 128x128 tile, 2-CTA cluster along M, cooperative (each consumer warpgroup 64x128),
// persistent, promoted accumulation; also the float32-output kernel.
template <>
struct Fp8TileConfig<0> {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  static constexpr bool kOverlappedPromotion = false;
};

// 1: 64x128 tile, no cluster, ping-pong (the two consumer warpgroups alternate tiles, one's
// epilogue overlapping the other's mainloop), persistent, promoted: twice config 0's tile count.
template <>
struct Fp8TileConfig<1> {
  using TileShape = cute::Shape<cute::_64, cute::_128, cute::_128>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  static constexpr bool kOverlappedPromotion = false;
};

// 2: 128x256 tile, 2-CTA cluster along M, cooperative, fast accumulation (WGMMA's own FP8
// accumulation, no promotion): what an explicit use_fast_accum asks for.
template <>
struct Fp8TileConfig<2> {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_128>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
  static constexpr bool kOverlappedPromotion = false;
};

// 3: config 0 with the stream-K scheduler: over a long K, the tiles of a last partial wave are
// split along K across the SMs that whole tiles would leave idle, the partial sums reduced in the
// workspace.
template <>
struct Fp8TileConfig<3> : Fp8TileConfig<0> {
  using TileScheduler = StreamKScheduler;  // stream_k_scheduler.cuh
};

// 4: 128x192 tile, 2-CTA cluster along M, cooperative, persistent, promoted: each consumer
// warpgroup holds 64x192 (96 + 96 accumulator registers per thread, the widest promoted tile
// that fits the register file); 1.5x config 0's arithmetic per byte of shared memory read.
template <>
struct Fp8TileConfig<4> : Fp8TileConfig<0> {
  using TileShape = cute::Shape<cute::_128, cute::_192, cute::_128>;
};

// 5, 6, 7: configurations 0, 1 and 3 on the mainloop whose promotions overlap the next k-tile's
// WGMMAs (fp8_overlapped_promotion.cuh): the same arithmetic, a third 64x128 register buffer per
// consumer thread (3 x 64 accumulator registers).
template <>
struct Fp8TileConfig<5> : Fp8TileConfig<0> {
  static constexpr bool kOverlappedPromotion = true;
};
template <>
struct Fp8TileConfig<6> : Fp8TileConfig<1> {
  static constexpr bool kOverlappedPromotion = true;
};
template <>
struct Fp8TileConfig<7> : Fp8TileConfig<3> {
  static constexpr bool kOverlappedPromotion = true;
};

template <Fp8Format F>
struct Fp8Element;
template <>
struct Fp8Element<Fp8Format::kE4M3> {
  using type = cutlass::float_e4m3_t;
};
template <>
struct Fp8Element<Fp8Format::kE5M2> {
  using type = cutlass::float_e5m2_t;
};

// The epilogue visitor tree of D = b_scale[n] * (a_scale[m] * acc) + bias[n], fp32 math, one
// rounding to ElementD.
template <class TileShape, class ElementD>
struct Fp8ScaledEpilogue {
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using AScale = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, TileShape, float, float, cute::Stride<bool, cute::_0, int64_t>>;
  using BScale = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, TileShape, float, float, cute::Stride<cute::_0, bool, int64_t>>;
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, TileShape, ElementD, float, cute::Stride<cute::_0, cute::_1, int64_t>>;
  using ScaledRows = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, AScale,
      cutlass::epilogue::fusion::Sm90AccFetch>;
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementD, float,
                                             kRound>,
      BScale, ScaledRows, Bias>;
};

template <Fp8Format FA, DType D, int Config>
struct Fp8Gemm {
  using Cfg = Fp8TileConfig<Config>;
  using ElementA = typename Fp8Element<FA>::type;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = detail::element_t<D>;
  using TileShape = typename Cfg::TileShape;
  using ClusterShape = typename Cfg::ClusterShape;
  static constexpr int kAlignmentAB = 16;  // 16 bytes of FP8
  static constexpr int kAlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, cutlass::layout::RowMajor, kAlignmentD,  // no C operand
      ElementD, cutlass::layout::RowMajor, kAlignmentD, typename Cfg::EpilogueSchedule,
      typename Fp8ScaledEpilogue<TileShape, ElementD>::Tree>::CollectiveOp;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cutlass::layout::RowMajor,
      kAlignmentAB, ElementB, cutlass::layout::ColumnMajor, kAlignmentAB, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;
  using CollectiveMainloop =
      std::conditional_t<Cfg::kOverlappedPromotion, Fp8OverlappedPromotionMma<BuiltMainloop>,
                         BuiltMainloop>;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, typename Cfg::TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments make_arguments(const Fp8GemmParams& p) {
    using cute::_0;
    using cute::_1;
    using StrideA = typename GemmKernel::StrideA;
    using StrideB = typename GemmKernel::StrideB;
    using StrideC = typename GemmKernel::StrideC;
    using StrideD = typename GemmKernel::StrideD;
    const StrideA stride_a = cute::make_stride(p.lda, _1{}, int64_t(0));  // (m, k): k contiguous
    const StrideB stride_b = cute::make_stride(p.ldb, _1{}, int64_t(0));  // (n, k): k contiguous
    const StrideC stride_c = cute::make_stride(p.ldd, _1{}, int64_t(0));
    const StrideD stride_d = cute::make_stride(p.ldd, _1{}, int64_t(0));

    cutlass::KernelHardwareInfo hw_info;
    int device = 0;
    cudaGetDevice(&device);
    hw_info.device_id = device;
    int sms = p.multiprocessors;
    if (sms <= 0) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    hw_info.sm_count = sms;

    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), 1},
        {static_cast<const ElementA*>(p.a), stride_a, static_cast<const ElementB*>(p.b),
         stride_b},
        {{}, nullptr, stride_c, static_cast<ElementD*>(p.d), stride_d},
        hw_info};
    // Rasterization swizzle (fp8_gemm.h): neighbouring tiles share an operand block in L2.
    if (p.swizzle > 0) args.scheduler.max_swizzle_size = p.swizzle;
    // The visitor tree's arguments, children first, in the order of Fp8ScaledEpilogue::Tree.
    args.epilogue.thread = {
        {p.b_scale, 1.0f, {_0{}, p.b_scale_per_col, int64_t(0)}},  // BScale
        {
            {p.a_scale, 1.0f, {p.a_scale_per_row, _0{}, int64_t(0)}},  // AScale
            {},                                                        // acc
            {},                                                        // multiplies
        },
        {static_cast<const ElementD*>(p.bias), ElementD(0), {_0{}, _1{}, int64_t(0)}},  // Bias
        {},  // multiply_add
    };
    return args;
  }
};

template <Fp8Format A, DType D, int Config>
GemmStatus fp8_gemm_launch(const Fp8GemmParams& params, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, const char** detail, size_t* workspace_query) {
  using Op = Fp8Gemm<A, D, Config>;
  typename Op::Gemm::Arguments args = Op::make_arguments(params);
  return detail::run_cutlass3<typename Op::Gemm>(args, workspace, workspace_bytes, stream, detail,
                                                 workspace_query);
}

}  // namespace kernels
}  // namespace cutlass_nn
