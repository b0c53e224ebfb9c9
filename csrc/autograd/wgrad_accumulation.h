// The process-wide switch of fused weight-gradient accumulation (csrc/autograd/autograd_kernels.cpp):
// when on, the backward of linear / linear_act / gated_mlp adds each weight gradient into the
// weight's existing .grad with a linear_wgrad_accumulate_ GEMM (beta = 1) instead of returning a
// new tensor that autograd's AccumulateGrad then adds (a second pass over the gradient and a
// transient buffer).
#pragma once

namespace cutlass_nn {

// Sets the switch; returns its previous state.
bool set_fused_wgrad_accumulation_flag(bool enable);

// Its current state (off by default).
bool fused_wgrad_accumulation_flag();

}  // namespace cutlass_nn
