// CUTLASS 2.x (Ampere-class, cp.async multistage) GEMMs: cutlass::gemm::device::GemmUniversal
// with ArchTag Sm80. Compiled for sm_80 and sm_90a, so they also run on Hopper.
//
//   D = alpha * (A @ B) + beta * C,  D/C RowMajor
//
// Families (see gemm_registry.h):
//   kSm80TensorOp: f16/bf16 -> mma 16x8x16, fp32 accumulate; f32 -> TF32 mma 16x8x8;
//                  f64 -> DMMA 8x8x4 (double accumulate)
//                  f32 with Config 1 -> 3xTF32 (OpMultiplyAddFastF32): each fp32 operand is split
//                  into a TF32 "big" part and a TF32 remainder, and big*big + big*small +
//                  small*big are accumulated in fp32: fp32-level accuracy on tensor cores, the
//                  path for float32 matmul precision "highest"
//   kSm80Simt:     f32 SIMT FMA (full IEEE fp32; operands that 3xTF32 cannot take)
//
// Row-broadcast bias (C[i, j] = c[j]) uses ldc = 0 (the trick of CUTLASS example
// 12_gemm_bias_relu): the epilogue's source iterator then re-reads row 0 for every row.
// C may alias D: each epilogue thread reads its C fragment before writing the same D fragment.
//
// 64-bit safety: lda/ldb/ldc/ldd are passed as LongIndex (int64); the 2.x iterators hold strides
// and pointer increments as LongIndex, and coordinates (< 2^31) are multiplied in 64 bits. The
// grid puts M tiles in grid.x (unbounded) and N tiles in grid.y (<= 65535 * 128 columns);
// can_implement rejects larger N.
#pragma once

#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/device/gemm_universal.h"
#include "cutlass/gemm/gemm.h"
#include "gemm_launch.cuh"

namespace cutlass_nn {
namespace kernels {
namespace detail {

// Per (family, dtype) tile configuration.
template <KernelFamily F, DType AB>
struct Sm80Config;

template <DType AB>
struct Sm80Config<KernelFamily::kSm80TensorOp, AB> {  // f16 / bf16
  static_assert(AB == DType::kFloat16 || AB == DType::kBFloat16, "16-bit types only");
  using OpClass = cutlass::arch::OpClassTensorOp;
  using ElementAccumulator = float;
  using ThreadblockShape = cutlass::gemm::GemmShape<128, 128, 32>;
  using WarpShape = cutlass::gemm::GemmShape<64, 64, 32>;
  using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;
  static constexpr int kStages = 4;
};

template <>
struct Sm80Config<KernelFamily::kSm80TensorOp, DType::kFloat32> {  // TF32
  using OpClass = cutlass::arch::OpClassTensorOp;
  using ElementAccumulator = float;
  using ThreadblockShape = cutlass::gemm::GemmShape<128, 128, 16>;
  using WarpShape = cutlass::gemm::GemmShape<64, 64, 16>;
  using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;
  static constexpr int kStages = 4;
};

template <>
struct Sm80Config<KernelFamily::kSm80TensorOp, DType::kFloat64> {  // DMMA
  using OpClass = cutlass::arch::OpClassTensorOp;
  using ElementAccumulator = double;
  using ThreadblockShape = cutlass::gemm::GemmShape<64, 64, 16>;
  using WarpShape = cutlass::gemm::GemmShape<32, 32, 16>;
  using InstructionShape = cutlass::gemm::GemmShape<8, 8, 4>;
  static constexpr int kStages = 4;
};

template <>
struct Sm80Config<KernelFamily::kSm80Simt, DType::kFloat32> {  // IEEE fp32 SIMT
  using OpClass = cutlass::arch::OpClassSimt;
  using ElementAccumulator = float;
  using ThreadblockShape = cutlass::gemm::GemmShape<128, 128, 8>;
  using WarpShape = cutlass::gemm::GemmShape<32, 64, 8>;
  using InstructionShape = cutlass::gemm::GemmShape<1, 1, 1>;
  static constexpr int kStages = 3;
};

template <KernelFamily F, DType AB, DType CD, Layout LA, Layout LB, int Align, int Config>
struct Sm80Gemm {
  static_assert(Config == 0 || (F == KernelFamily::kSm80TensorOp && AB == DType::kFloat32),
                "Config 1 (3xTF32) exists for the fp32 tensor-op kernels only");
  using MathOperator = typename std::conditional<Config == 1, cutlass::arch::OpMultiplyAddFastF32,
                                                 cutlass::arch::OpMultiplyAdd>::type;
  using Cfg = Sm80Config<F, AB>;
  using ElementA = element_t<AB>;
  using ElementB = element_t<AB>;
  using ElementC = element_t<CD>;
  using ElementAccumulator = typename Cfg::ElementAccumulator;
  using ElementCompute = ElementAccumulator;
  // C/D access width: the A/B alignment, capped at 16 bytes of the output type.
  static constexpr int kAlignmentC =
      Align < (128 / cutlass::sizeof_bits<ElementC>::value)
          ? Align
          : (128 / cutlass::sizeof_bits<ElementC>::value);

  using EpilogueOp = cutlass::epilogue::thread::LinearCombination<ElementC, kAlignmentC,
                                                                  ElementAccumulator, ElementCompute>;

  using Gemm = cutlass::gemm::device::GemmUniversal<
      ElementA, layout_t<LA>, ElementB, layout_t<LB>, ElementC, cutlass::layout::RowMajor,
      ElementAccumulator, typename Cfg::OpClass, cutlass::arch::Sm80,
      typename Cfg::ThreadblockShape, typename Cfg::WarpShape, typename Cfg::InstructionShape,
      EpilogueOp, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, Cfg::kStages,
      Align, Align, MathOperator>;

  static typename Gemm::Arguments make_arguments(const GemmParams& p) {
    // ldc = 0 broadcasts row 0 of C (the bias vector) over all rows.
    const int64_t ldc = p.c_row_broadcast ? 0 : p.ldc;
    typename EpilogueOp::Params epilogue(static_cast<ElementCompute>(p.alpha),
                                         static_cast<ElementCompute>(p.beta));
    return typename Gemm::Arguments(
        cutlass::gemm::GemmUniversalMode::kGemm,
        cutlass::gemm::GemmCoord(static_cast<int>(p.m), static_cast<int>(p.n),
                                 static_cast<int>(p.k)),
        /*batch_count=*/1, epilogue, p.a, p.b, p.c, p.d,
        /*batch strides=*/0, 0, 0, 0, p.lda, p.ldb, ldc, p.ldd);
  }
};

}  // namespace detail

template <KernelFamily F, DType AB, DType CD, Layout LA, Layout LB, int Align, int Config>
struct KernelImpl<KernelTag<F, AB, CD, LA, LB, Align, Config, EpilogueKind::kLinComb>> {
  static_assert(F == KernelFamily::kSm80TensorOp || F == KernelFamily::kSm80Simt,
                "gemm_sm80.cuh implements the SM80 families only");
  using Op = detail::Sm80Gemm<F, AB, CD, LA, LB, Align, Config>;

  static GemmStatus launch(const GemmParams& p, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, const char** detail, size_t* workspace_query) {
    typename Op::Gemm::Arguments args = Op::make_arguments(p);
    return detail::run_cutlass<typename Op::Gemm>(args, workspace, workspace_bytes, stream, detail,
                                                  workspace_query);
  }
};

}  // namespace kernels
}  // namespace cutlass_nn
