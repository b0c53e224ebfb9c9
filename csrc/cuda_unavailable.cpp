// The CPU flavor's CUDA kernels: one clear error instead of the dispatcher's "Could not run
// 'cutlass_nn::linear' with arguments from the 'CUDA' backend" and its list of registered keys.
//
// A CPU-flavor build loaded by a CUDA build of torch receives CUDA tensors; this says what is
// wrong and how to fix it. The CUDA flavor registers its real kernels (csrc/cuda/) and compiles
// nothing here.
#ifndef CUTLASS_NN_WITH_CUDA

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

namespace cutlass_nn {
namespace {

// The device of the first tensor argument on the stack, for the message.
std::string first_tensor_device(const torch::jit::Stack& stack, size_t num_arguments) {
  for (size_t i = stack.size() - num_arguments; i < stack.size(); ++i) {
    if (stack[i].isTensor()) return stack[i].toTensor().device().str();
  }
  return "cuda";
}

void no_cuda_kernels(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = op.schema().name();  // "cutlass_nn::linear"
  const std::string short_name = name.substr(name.find("::") + 2);
  const std::string overload = op.schema().overload_name();
  TORCH_CHECK(false, "cutlass_nn.", short_name, overload.empty() ? "" : ".", overload,
              ": got a tensor on ",
              first_tensor_device(*stack, op.schema().arguments().size()),
              ", but this cutlass_nn build has no CUDA kernels (it was built as the CPU "
              "flavor). Rebuild with a CUDA build of torch and CUDA_HOME pointing at a CUDA "
              "toolkit: `pip install --no-build-isolation -e .`");
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CUDA, m) {
  for (const char* op : {"linear", "linear_dgrad", "linear_wgrad", "linear_wgrad_accumulate_",
                         "bias_grad", "mm", "mm.out", "add2", "scale_", "linear_act", "linear_act_aux",
                         "activation_grad", "rms_norm", "add_rms_norm", "rms_norm_backward",
                         "gated_act", "gated_act_backward", "gated_act_backward_",
                         "gated_mlp", "_gate_up_linear", "_gate_up_dgrad", "_pack_gate_up",
                         "cross_entropy_rows_", "rotary_embedding",
                         "rotary_embedding_backward", "fp8_scaled_mm", "fp8_quantize",
                         "fp8_quantize_both", "fp8_cast"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&no_cuda_kernels>());
  }
}

}  // namespace cutlass_nn

#endif  // CUTLASS_NN_WITH_CUDA
