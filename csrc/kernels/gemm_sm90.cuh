// CUTLASS 3.x SM90 (Hopper) GEMM: TMA loads, warp-specialized WGMMA mainloop, TMA epilogue.
//
//   D = alpha * (A @ B) + beta * C + bias[n]        (fusion::LinCombPerColBias)
//
// A/B are 16-bit (f16 / bf16), accumulation is fp32, C/D are RowMajor with the A/B dtype or fp32.
// "PerColBias" in CUTLASS is a Sm90RowBroadcast with stride (_0, _1): one value per column n,
// i.e. exactly nn.Linear's bias. A null bias pointer reads as 0 (EnableNullptr), so the same kernel
// serves plain GEMMs. With beta == 0 the epilogue skips the C load entirely.
//
// The dispatcher (gemm_dispatch.cu) only routes here when every operand is 16-byte aligned
// (TMA requirement) and, for the row-broadcast bias, when beta == 1 (the bias is not scaled).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"
#include "gemm_launch.cuh"

namespace cutlass_nn {
namespace kernels {

// Tile configurations of the SM90 family. Config 0 is the default (best single config measured
// on H200 for large bf16 GEMMs, see GUIDE.md). Add a specialization + a generator entry to add one.
template <int Config>
struct Sm90TileConfig;

template <>
struct Sm90TileConfig<0> {
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

// The CUTLASS type, parameterized by everything a per-shape selection may want to vary.
template <class ElementAB, class ElementCD, class LayoutA, class LayoutB, class TileShape,
          class ClusterShape, class KernelSchedule, class EpilogueSchedule>
struct Sm90Gemm {
  using ElementAccumulator = float;
  using ElementCompute = float;
  static constexpr int kAlignmentAB = 128 / cutlass::sizeof_bits<ElementAB>::value;  // 16 bytes
  static constexpr int kAlignmentCD = 128 / cutlass::sizeof_bits<ElementCD>::value;

  // D = alpha * acc + beta * C + bias[n]; bias has the output dtype.
  using FusionOp =
      cutlass::epilogue::fusion::LinCombPerColBias<ElementCD, ElementCompute, ElementCD, ElementCD,
                                                   ElementCompute>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementCompute,
      ElementCD, cutlass::layout::RowMajor, kAlignmentCD,  // C
      ElementCD, cutlass::layout::RowMajor, kAlignmentCD,  // D
      EpilogueSchedule, FusionOp>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, kAlignmentAB,
      ElementAB, LayoutB, kAlignmentAB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;

  // All strides are int64_t (64-bit offsets); the batch (L) stride is 0 since L == 1.
  static typename Gemm::Arguments make_arguments(const GemmParams& p) {
    using cute::_1;
    StrideA stride_a;
    if constexpr (std::is_same<LayoutA, cutlass::layout::RowMajor>::value) {
      stride_a = cute::make_stride(p.lda, _1{}, int64_t(0));  // (m, k): k contiguous
    } else {
      stride_a = cute::make_stride(_1{}, p.lda, int64_t(0));  // (m, k): m contiguous
    }
    // CUTLASS 3.x views B as n x k.
    StrideB stride_b;
    if constexpr (std::is_same<LayoutB, cutlass::layout::ColumnMajor>::value) {
      stride_b = cute::make_stride(p.ldb, _1{}, int64_t(0));  // element (k, n) at k + n * ldb
    } else {
      stride_b = cute::make_stride(_1{}, p.ldb, int64_t(0));  // element (k, n) at k * ldb + n
    }
    StrideC stride_c = cute::make_stride(p.ldc, _1{}, int64_t(0));
    StrideD stride_d = cute::make_stride(p.ldd, _1{}, int64_t(0));

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
        {m, n, k, 1},
        {static_cast<const ElementAB*>(p.a), stride_a, static_cast<const ElementAB*>(p.b),
         stride_b},
        {{}, static_cast<const ElementCD*>(p.c), stride_c, static_cast<ElementCD*>(p.d), stride_d},
        hw_info};

    auto& fusion = args.epilogue.thread;
    fusion.alpha = p.alpha;
    if (p.c_row_broadcast) {
      // bias[n] added unscaled; the dispatcher guarantees beta == 1 here. The C operand itself
      // is unused (beta = 0 skips its TMA load); ptr_C still points at valid memory (D) because
      // a TMA descriptor is built for it.
      fusion.beta = 0.0f;
      fusion.bias_ptr = static_cast<const ElementCD*>(p.c);
      fusion.dBias = cute::make_stride(cute::_0{}, cute::_1{}, int64_t(0));
      args.epilogue.ptr_C = static_cast<const ElementCD*>(p.d);
      args.epilogue.dC = stride_d;
    } else {
      fusion.beta = p.beta;
      fusion.bias_ptr = nullptr;
    }
    return args;
  }
};

template <DType AB, DType CD, Layout LA, Layout LB, int Align, int Config>
struct KernelImpl<KernelTag<KernelFamily::kSm90TmaWs, AB, CD, LA, LB, Align, Config>> {
  using Cfg = Sm90TileConfig<Config>;
  using Op = Sm90Gemm<detail::element_t<AB>, detail::element_t<CD>, detail::layout_t<LA>,
                      detail::layout_t<LB>, typename Cfg::TileShape, typename Cfg::ClusterShape,
                      typename Cfg::KernelSchedule, typename Cfg::EpilogueSchedule>;
  static_assert(Align == Op::kAlignmentAB, "SM90 kernels use 16-byte alignment");

  static GemmStatus launch(const GemmParams& p, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, const char** detail, size_t* workspace_query) {
    typename Op::Gemm::Arguments args = Op::make_arguments(p);
    return detail::run_cutlass<typename Op::Gemm>(args, workspace, workspace_bytes, stream, detail,
                                                  workspace_query);
  }
};

}  // namespace kernels
}  // namespace cutlass_nn
