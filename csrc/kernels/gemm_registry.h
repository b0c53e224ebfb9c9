// Light-weight declarations shared by the GEMM dispatcher (gemm_dispatch.cu) and the generated
// per-kernel translation units (generated/*.cu). Includes no CUTLASS header: the dispatcher only
// sees a tag type per kernel and the declaration of launch<Tag>(); the heavy template bodies live
// in gemm_sm90.cuh / gemm_sm80.cuh / gemm_fallback.cuh and are instantiated once, in the
// generated file that owns the kernel.
#pragma once

#include <cstddef>

#include "gemm_params.h"

namespace cutlass_nn {
namespace kernels {

enum class KernelFamily : int {
  kSm90TmaWs = 0,     // CUTLASS 3.x, TMA + warp-specialized WGMMA (gemm_sm90.cuh), Hopper only
  kSm80TensorOp = 1,  // CUTLASS 2.x multistage tensor-op: f16/bf16 (16x8x16), tf32 (16x8x8), f64 (8x8x4)
  kSm80Simt = 2,      // CUTLASS 2.x multistage SIMT (full IEEE fp32 FMA)
  kFallback = 3,      // plain CUDA smem-tiled kernel (gemm_fallback.cuh): any alignment, runtime layout
};

// What the epilogue computes (SM90 family only; the other families are kLinComb).
enum class EpilogueKind : int {
  kLinComb = 0,  // D = alpha * acc + beta * C (+ bias[n])
  kAct = 1,      // D = act(acc + bias[n]), act = the tag's Activation
  kActAux = 2,   // the same, plus aux = acc + bias[n] (the pre-activation)
  // D = alpha * acc + beta * C (+ bias[m]) with C and D column-major: the transposed problem
  // D^T = B^T A^T that the dispatcher runs for a small M (GemmParams::d_column_major).
  kLinCombColMajorD = 3,
  // D = alpha * acc, row-major, with no C operand (CUTLASS's ElementC = void): no C stages in
  // shared memory and delayed TMA-store waits, 2-5% faster than kLinComb on the K <= 3072
  // GEMMs of transformer layers (benchmarks/NOTES.md, thirty-fourth session), 1-3% on the
  // language-model head's forward and weight gradient with config 0 (thirty-fifth session). The
  // dispatcher takes it for beta == 0 without a bias where a configuration has such a kernel.
  kLinCombNoC = 4,
};

// Compile-time identity of one kernel. Align is the A/B access width in elements; Config selects
// a tile configuration of the family (see Sm90TileConfig in gemm_sm90.cuh); Epi the
// epilogue and Act its activation (compile-time: one kernel per activation).
template <KernelFamily F, DType AB, DType CD, Layout LA, Layout LB, int Align, int Config = 0,
          EpilogueKind Epi = EpilogueKind::kLinComb, Activation Act = Activation::kIdentity>
struct KernelTag {};

// Runs (or, if workspace_query != nullptr, only sizes the workspace of) the kernel named by Tag.
// Defined in gemm_launch.cuh's family headers and explicitly instantiated by generated/*.cu.
template <class Tag>
GemmStatus launch(const GemmParams& params, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, const char** detail, size_t* workspace_query);

using LaunchFn = GemmStatus (*)(const GemmParams&, void*, size_t, cudaStream_t, const char**,
                                size_t*);

// One row of generated/kernel_registry.inc.
struct KernelEntry {
  KernelFamily family;
  DType dtype_ab;
  DType dtype_cd;
  Layout layout_a;  // ignored for kFallback (layouts are runtime there)
  Layout layout_b;
  int align_ab;     // required alignment (elements) of A and B: pointer, ld and contiguous extent
  int align_cd;     // required alignment (elements) of C and D
  int config;       // tile configuration within the family (SM90: Sm90TileConfig<config>)
  EpilogueKind epilogue;
  Activation activation;  // of a kAct / kActAux epilogue (compiled in); kIdentity otherwise
  const char* name;
  LaunchFn fn;
};

}  // namespace kernels
}  // namespace cutlass_nn
