// Opt-in autotune of the SM90 GEMM configuration per problem (cutlass_nn/autotune.py is its
// Python front).
//
// The per-shape rule of csrc/kernels/gemm_dispatch.cu serves most shapes; for the others, a
// tuning run times every candidate configuration (tile, stream-K / split-K factor, transposed
// small-M kernels) on the problem's real shape, checks each candidate's result against the rule's,
// and stores the fastest in a process-wide table keyed by device and problem. From then on every
// GEMM of that problem runs the stored choice (deterministic: the table never changes an entry on
// its own). Tuning happens only in "first-call" mode (set_autotune_mode), on the first call of a
// problem that has no entry, and never while the stream is being captured into a CUDA graph (that
// call runs the rule's choice and the problem is tuned at its next uncaptured call).
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <string>
#include <tuple>
#include <vector>

#include "gemm_params.h"

namespace cutlass_nn {
namespace cuda {

// Sets p's configuration overrides (sm90_config, swizzle, splits) from the table when it holds
// the problem, tuning it first in first-call mode. Leaves p alone for problems the table does
// not cover: not an SM90 16-bit GEMM, overrides already forced (the benchmark sweep), a fused
// epilogue, or less work than kMinTuneWork. p must be complete (pointers included); `like` gives
// the device and is used for the tuning buffers' options. Cheap when the table is empty and
// first-call mode is off (two atomic loads).
void apply_autotuned_choice(kernels::GemmParams& p, const at::Tensor& like, cudaStream_t stream);

// First-call mode on (1) / off (0) / unchanged (-1); returns the previous setting. Process-wide.
bool set_autotune_mode(int mode);

// The table, one entry per row: ints [device, m, n, k, layout_a, layout_b, dtype_ab, dtype_cd,
// bias, accumulate, config, swizzle, splits, transposed, rule_config, rule_swizzle, rule_splits,
// rule_transposed, candidates] (kAutotuneIntFields) and floats [best_us, rule_us]
// (kAutotuneFloatFields), both flattened row after row; the third list names the kernel each
// entry runs ("" for entries loaded with add_autotune_entries).
constexpr int kAutotuneIntFields = 19;
constexpr int kAutotuneFloatFields = 2;
std::tuple<std::vector<int64_t>, std::vector<double>, std::vector<std::string>> autotune_entries();

// Adds (or replaces) entries given in autotune_entries()'s layout; the kernel names may be
// omitted. Validates every field first and adds nothing when one is out of range.
void add_autotune_entries(const std::vector<int64_t>& ints, const std::vector<double>& floats);

// Removes every entry; returns how many there were.
int64_t clear_autotune_entries();

}  // namespace cuda
}  // namespace cutlass_nn
