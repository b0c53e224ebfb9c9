// Torch-free interface of the rotary position embedding kernel (the "rotate half" form used by
// Llama, Mistral, Qwen and most current decoders). For each row x of a query or key head, with
// the row split in halves x = [x1, x2] (each of head_dim / 2) and the row's cos = [c1, c2],
// sin = [s1, s2]:
//
//   forward:  out1 = x1 * c1 - x2 * s1       out2 = x2 * c2 + x1 * s2
//   backward: out1 = x1 * c1 + x2 * s2       out2 = x2 * c2 - x1 * s1
//
// (the backward is the transposed rotation, applied to the output gradient; it is exact for any
// cos / sin, not only for the usual halves that repeat). Each product and the sum are rounded
// in float (double for float64) in that order, without contraction into FMAs, and the result is
// rounded once to the storage type: bitwise what the ATen formulation of csrc/rotary_aten.h
// computes on the CPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm_params.h"  // DType

namespace cutlass_nn {
namespace kernels {

// One [batch, heads, seq, head_dim] operand (query or key): input and output with their own
// element strides over (batch, head, position); the last dim has unit stride in both.
struct RotaryOperand {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t heads = 0;
  int64_t in_stride[3] = {0, 0, 0};
  int64_t out_stride[3] = {0, 0, 0};
};

// cos or sin [batch or 1, seq, head_dim]: element strides over (batch, position) (a batch
// stride of 0 broadcasts one table over the batch); unit stride in the last dim.
struct RotaryTable {
  const void* data = nullptr;
  int64_t stride[2] = {0, 0};
};

// Rotates q and k (one launch for both) by the same cos / sin. All of `dtype`; outputs do not
// overlap inputs. 16-byte accesses where head_dim / 2, the pointers and the strides allow.
// `multiprocessors` sizes the grid (<= 0: queried). Returns the launch status.
cudaError_t launch_rotary(DType dtype, bool backward, const RotaryOperand& q,
                          const RotaryOperand& k, const RotaryTable& cos, const RotaryTable& sin,
                          int64_t batch, int64_t seq, int64_t head_dim, int multiprocessors,
                          cudaStream_t stream);

}  // namespace kernels
}  // namespace cutlass_nn
