// Torch-free interface of the cutlass_nn GEMM kernels.
//
// The binding layer (csrc/cuda/*.cu) validates tensors, fills a GemmParams and calls run_gemm();
// nothing in csrc/kernels/ includes ATen or knows about torch::Tensor.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "activation_math.h"  // Activation

namespace cutlass_nn {
namespace kernels {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3 };

// Storage order of an operand matrix. RowMajor: element (i, j) at ptr[i * ld + j];
// ColumnMajor: element (i, j) at ptr[i + j * ld].
enum class Layout : int { kRowMajor = 0, kColumnMajor = 1 };

// How float32 GEMMs may compute (ignored for the other dtypes).
enum class Fp32Math : int {
  kIeee = 0,  // full fp32 FMA (torch.get_float32_matmul_precision() == "highest")
  kTf32 = 1,  // TF32 tensor cores ("high" / "medium", allow_tf32 = True)
  // The operands are the TF32 parts of a 3xTF32 split (split_tf32.h): TF32 products, summed
  // with fp32 accuracy. On SM90 the kernel (config 21) adds WGMMA's partial sums into separate
  // fp32 registers every 128 products, since WGMMA's own fp32 accumulation loses low-order bits.
  kTf32Split = 2,
};

// Which generation of kernels to use.
enum class ArchPath : int {
  kAuto = 0,  // SM90 TMA warp-specialized kernel where it fits, else SM80
  kSm80 = 1,  // force the CUTLASS 2.x (Ampere-class) kernels, also on Hopper
};

// D[m, n] = alpha * sum_k A[m, k] * B[k, n] + beta * C[m, n]
//   or, with an activation: Z = A @ B + bias, D = act(Z), and Z also written to `aux` if set.
//
// A is m x k, B is k x n, C and D are m x n and RowMajor. C may alias D (in-place
// accumulation, beta = 1). C may be a row vector broadcast over rows: c_row_broadcast = true
// means C[i, j] = c[j] (a bias of length n), ldc is then ignored.
struct GemmParams {
  int64_t m = 0, n = 0, k = 0;

  const void* a = nullptr;
  int64_t lda = 0;
  Layout layout_a = Layout::kRowMajor;

  const void* b = nullptr;
  int64_t ldb = 0;
  Layout layout_b = Layout::kRowMajor;

  const void* c = nullptr;  // nullptr means beta is treated as 0
  int64_t ldc = 0;
  bool c_row_broadcast = false;

  void* d = nullptr;
  int64_t ldd = 0;

  float alpha = 1.0f;
  float beta = 0.0f;

  DType dtype_ab = DType::kFloat16;  // dtype of A and B
  DType dtype_cd = DType::kFloat16;  // dtype of C and D (dtype_ab, or kFloat32 for 16-bit A/B)

  Fp32Math fp32_math = Fp32Math::kTf32;
  ArchPath arch_path = ArchPath::kAuto;
  int sm = 0;              // compute capability of the device, major * 10 + minor
  int multiprocessors = 0;  // number of SMs of the device (for kernels that size grids by it)
  // Peak DRAM bandwidth of the device in GB/s (memory clock x bus width), 0 when unknown. The
  // rule reads it where two GPUs of the same SM count and L2 (H100: 3.35 TB/s, H200: 4.8 TB/s)
  // measured different winners; 0 takes the choice measured on the H200.
  int memory_gbps = 0;

  // Fused epilogue (SM90 kernels only; run_gemm() returns kUnsupported where no kernel fuses it,
  // and the caller then applies the activation itself). Needs alpha == 1 and beta == 0 or a
  // row-broadcast bias. aux: optional RowMajor [m, n] output of the pre-activation, ldaux apart.
  Activation activation = Activation::kIdentity;
  void* aux = nullptr;
  int64_t ldaux = 0;

  // Kernel-selection overrides (benchmark sweep, tests): sm90_config >= 0 forces that SM90 tile
  // configuration (Sm90TileConfig<N>); swizzle > 0 sets the tile scheduler's swizzle. The
  // defaults (-1, 0) follow the per-shape rule of gemm_dispatch.cu.
  int sm90_config = -1;
  int swizzle = 0;
  // K decomposition of the stream-K configurations: 0 = the rule's choice, 1 = data-parallel
  // (no split), s > 1 = split-K into s slices (reduced deterministically in the workspace).
  // s < 0 = batched split-K into -s slices where the problem allows it (16-bit A and B in the
  // weight gradient's layout, 16-byte aligned, K a multiple of -s, no fused epilogue; else the
  // rule's choice): -s independent GEMMs over consecutive K ranges write fp32 partial products
  // into the workspace and a second kernel sums them into D in a fixed order (no inter-CTA
  // waits, unlike the stream-K split, whose splits of a tile reduce one after another).
  int splits = 0;
  // Whether a plain product (beta == 0, no bias, no activation) may run on a kernel without a C
  // operand (EpilogueKind::kLinCombNoC) where its configuration has one. Off: the kLinComb
  // kernel of the same configuration (for A/B timing: cutlass_nn._set_epilogue_without_c).
  bool epilogue_without_c = true;

  // Set by the dispatcher only (callers leave it false): the params describe the transposed
  // problem D^T = B^T A^T of a small-M GEMM, so C and D are ColumnMajor (element (i, j) at
  // d[i + j * ldd]) and a broadcast bias (c_row_broadcast) holds one value per row i.
  bool d_column_major = false;
  // Set by the dispatcher only (callers leave the defaults): the params describe `batch` GEMMs
  // (CUTLASS's L mode), batch l's A, B and D at a, b, d plus l times the strides (in elements).
  // The batched split-K's partial products: batch l is the K range [l k, (l + 1) k).
  int batch = 1;
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_d = 0;
};

// True when params ask for a fused epilogue (an activation or an aux output).
inline bool has_fused_epilogue(const GemmParams& p) {
  return p.activation != Activation::kIdentity || p.aux != nullptr;
}

enum class GemmStatus : int {
  kSuccess = 0,
  kUnsupported = 1,       // no compiled kernel handles this dtype / layout / arch combination
  kCannotImplement = 2,   // the selected kernel's can_implement() refused the problem
  kWorkspaceTooSmall = 3,
  kInitializeFailed = 4,
  kRunFailed = 5,
  kLaunchFailed = 6,      // cudaGetLastError() after the launch was not cudaSuccess
};

const char* gemm_status_string(GemmStatus status);

// Number of SM90 tile configurations of the 16-bit kernels, and the name of one (nullptr past
// the end); index = GemmParams::sm90_config. Configs 4-7 and 16 run the transposed problem (small M),
// 8 and 9 are the short-K (wgrad) ones, 10 the 128x192 tile (1 the same without a cluster, v0.30;
// a 128x256 stream-K tile before), 11 and 12 the small-wgrad ones, 13 the 64x128 ping-pong tile,
// 14 the 256x128 tile with a 1x2 cluster, 15 config 3's ping-pong tile without a cluster (v0.37),
// 16 the transposed problem's 64-token tile with 64-deep k-blocks (config 6's, v0.41), 17-19 the
// 128x96, 192x96 and 192x128 ping-pong tiles without a cluster (v0.49); configs 20 (TF32) and 21
// (3xTF32 parts, promoted accumulation) are float32 only and not counted.
constexpr int kSm90ConfigCount = 20;
const char* sm90_config_name(int config);

// What the per-shape rule picks for these params (ignores the overrides in them).
struct Sm90Choice {
  int config = 0;   // Sm90TileConfig<config>
  int swizzle = 0;  // 0: CUTLASS's default
  int splits = 0;   // 0: the stream-K scheduler's own heuristic
  // A row-major tile the rule runs where it would otherwise transpose the problem (configs 4-7, 16):
  // a fused bias + activation then runs unfused there too (the plain GEMM, then the activation).
  bool stands_in_for_transposed = false;
};
Sm90Choice choose_sm90_config(const GemmParams& params);

// One GEMM with its kernel chosen: select once (plan_gemm), then size the workspace and run it
// without selecting again.
struct GemmPlan {
  GemmParams params;             // as the kernel runs it (normalized; maybe the transposed problem)
  const void* kernel = nullptr;  // the registry row (opaque); nullptr: no kernel fits
  const char* name = "";         // the kernel's name ("" if none)
  size_t workspace_bytes = 0;    // device workspace the kernel needs (and the partial products)
  // Batched split-K (k_slices > 1): `params` is the GEMM of the fp32 partial products (its C
  // and D are placed in the workspace by run_gemm_plan), `output` the caller's normalized
  // problem, whose D the reduction pass writes (with its C, beta or bias, and dtype).
  int k_slices = 0;
  GemmParams output;
};
GemmPlan plan_gemm(const GemmParams& params);

// Runs a plan on `stream`. `workspace` must hold plan.workspace_bytes bytes. On failure,
// *detail (if not null) receives a static string naming the failing step.
GemmStatus run_gemm_plan(const GemmPlan& plan, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream, const char** detail);

// Conveniences over plan_gemm (each selects anew): the kernel's name ("" if none; error
// messages, tests that check the dispatch), its workspace size, and plan + run in one call.
const char* gemm_kernel_name(const GemmParams& params);
size_t gemm_workspace_size(const GemmParams& params);
GemmStatus run_gemm(const GemmParams& params, void* workspace, size_t workspace_bytes,
                    cudaStream_t stream, const char** detail);

}  // namespace kernels
}  // namespace cutlass_nn
