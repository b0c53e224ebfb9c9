// The kernel-selection rule without a GPU: gemm_dispatch.cu compiled with a host C++ compiler, every
// kernel launch replaced by a stub that succeeds and needs no workspace, so that plan_gemm() (the
// rule, the transposed problem, the fallbacks, the overrides) runs on any machine. Used by
// tests/test_gemm_rule.py; needs only the CUDA runtime header (for cudaStream_t), not a GPU or
// CUTLASS.
//
// Reads one query per line from stdin:  op m n k out_f32 fused config swizzle splits sms
//   op: fwd (A row-major, B column-major: nn.Linear's forward), dgrad (both row-major), wgrad
//   (A column-major, B row-major); out_f32: 1 for a float32 output (bf16 otherwise); fused: the
//   Activation of a bias + activation epilogue (0: none, 1: ReLU, 2: GELU, 3: GELU tanh);
//   config / swizzle / splits: the overrides (-1 / 0 / 0 = the rule's); sms: the
//   multiprocessor count. Four optional trailing fields: c_mode (0: D = A @ B, the default; 1:
//   plus a row-broadcast bias; 2: plus beta = 1 times C), without_c (1, the default: plain
//   products may take the kernels without a C operand; 0: not), memory_gbps (the device's peak
//   DRAM bandwidth in GB/s; 0, the default: unknown) and aux (1: the fused epilogue also
//   stores the pre-activation, as linear_act_aux; 0, the default: not).
// Writes one line per query:  rule_config rule_swizzle rule_splits | plan_config plan_swizzle
//   plan_splits transposed kernel_name   (kernel_name "-" where no kernel fits; plan_config -1
//   then means the fused epilogue is left to the caller: GEMM + activation pass; plan_splits -s
//   for a batched split-K into s slices).
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>

#include "gemm_registry.h"

namespace cutlass_nn {
namespace kernels {
template <class Tag>
GemmStatus launch(const GemmParams&, void*, size_t, cudaStream_t, const char**,
                  size_t* workspace_query) {
  if (workspace_query != nullptr) *workspace_query = 0;
  return GemmStatus::kSuccess;
}
// The batched split-K's reduction pass (split_k_reduce.cu, a CUDA unit): never run here.
GemmStatus reduce_k_slices(const float*, int, const GemmParams&, cudaStream_t) {
  return GemmStatus::kSuccess;
}
}  // namespace kernels
}  // namespace cutlass_nn

#define CUTLASS_NN_HAS_SM90 1
#include "../gemm_dispatch.cu"

using namespace cutlass_nn::kernels;

alignas(256) static char g_buffer[256];  // every operand: 256-byte aligned, never read

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string op;
    long long m, n, k;
    int out_f32, fused, config, swizzle, splits, sms;
    if (!(in >> op >> m >> n >> k >> out_f32 >> fused >> config >> swizzle >> splits >> sms)) {
      std::printf("bad query\n");
      continue;
    }
    int c_mode = 0, without_c = 1, memory_gbps = 0, aux = 0;
    if (!(in >> c_mode)) c_mode = 0;
    if (!(in >> without_c)) without_c = 1;
    if (!(in >> memory_gbps)) memory_gbps = 0;
    if (!(in >> aux)) aux = 0;
    if (fused < 0 || fused > static_cast<int>(Activation::kGeluTanh)) {
      std::printf("bad query\n");
      continue;
    }
    GemmParams p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.sm = 90;
    p.multiprocessors = sms;
    p.memory_gbps = memory_gbps;
    p.dtype_ab = DType::kBFloat16;
    p.dtype_cd = out_f32 ? DType::kFloat32 : DType::kBFloat16;
    p.a = p.b = p.d = g_buffer;
    if (op == "fwd") {
      p.layout_a = Layout::kRowMajor;
      p.layout_b = Layout::kColumnMajor;
      p.lda = k;
      p.ldb = k;
    } else if (op == "dgrad") {
      p.layout_a = Layout::kRowMajor;
      p.layout_b = Layout::kRowMajor;
      p.lda = k;
      p.ldb = n;
    } else {
      p.layout_a = Layout::kColumnMajor;
      p.layout_b = Layout::kRowMajor;
      p.lda = m;
      p.ldb = n;
    }
    p.ldd = n;
    if (fused || c_mode == 1) {
      if (fused) p.activation = static_cast<Activation>(fused);
      if (fused && aux) {
        p.aux = g_buffer;
        p.ldaux = n;
      }
      p.c = g_buffer;
      p.c_row_broadcast = true;
      p.beta = 1.0f;
    } else if (c_mode == 2) {
      p.c = g_buffer;
      p.ldc = n;
      p.beta = 1.0f;
    }
    p.epilogue_without_c = without_c != 0;
    p.sm90_config = config;
    p.swizzle = swizzle;
    p.splits = splits;
    const Sm90Choice rule = choose_sm90_config(p);
    const GemmPlan plan = plan_gemm(p);
    std::printf("%d %d %d | %d %d %d %d %s\n", rule.config, rule.swizzle, rule.splits,
                plan.params.sm90_config, plan.params.swizzle,
                plan.k_slices > 1 ? -plan.k_slices : plan.params.splits,
                plan.params.d_column_major ? 1 : 0,
                plan.name != nullptr && plan.name[0] != 0 ? plan.name : "-");
  }
  return 0;
}
