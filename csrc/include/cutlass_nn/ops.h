// C++ API of cutlass_nn for LibTorch programs: the cutlass_nn operators, called through the
// PyTorch dispatcher (so the CPU or CUDA implementation is picked from the inputs' device, and
// the calls are the same ones Python's torch.ops.cutlass_nn.* makes).
//
// Header-only: it needs libcutlass_nn_ops.so (csrc/CMakeLists.txt) to be loaded, which registers
// the operators. Link the CMake target cutlass_nn::ops (it keeps the library on the link line with
// -Wl,--no-as-needed), or dlopen it / torch::ops.load_library it before the first call; otherwise
// the first call throws c10::Error "Could not find schema for cutlass_nn::...".
//
//   #include <cutlass_nn/ops.h>
//   at::Tensor y = cutlass_nn::linear(x, w, b);   // x [*, in], w [out, in], b [out] or nullopt
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>

namespace cutlass_nn {

// y = input @ weight.T + bias; input [*, in], weight [out, in], bias [out] -> y [*, out]
// (torch::nn::functional::linear / torch::linear).
inline at::Tensor linear(const at::Tensor& input, const at::Tensor& weight,
                         const std::optional<at::Tensor>& bias = std::nullopt) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("cutlass_nn::linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&)>();
  return op.call(input, weight, bias);
}

// y = act(input @ weight.T + bias) with the activation fused into the GEMM epilogue where the
// GPU allows; activation: "none", "relu", "gelu", "gelu_tanh" (forward only: the C++ API does
// not register autograd).
inline at::Tensor linear_act(const at::Tensor& input, const at::Tensor& weight,
                             const std::optional<at::Tensor>& bias, const std::string& activation) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("cutlass_nn::linear_act", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, c10::string_view)>();
  return op.call(input, weight, bias, activation);
}

// a @ b for 2-D a [n, m], b [m, p] (torch::mm).
inline at::Tensor mm(const at::Tensor& a, const at::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlass_nn::mm", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

// a + b for tensors of the same shape, dtype and device.
inline at::Tensor add2(const at::Tensor& a, const at::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlass_nn::add2", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(a, b);
}

// What the loaded library was built with, as "key=value" lines (flavor=cpu|cuda, cuda_archs=,
// cutlass_version=, torch_version=).
inline std::string build_info() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlass_nn::build_info", "")
                             .typed<std::string()>();
  return op.call();
}

// True when the operators are registered, i.e. libcutlass_nn_ops.so is loaded.
inline bool is_loaded() {
  return c10::Dispatcher::singleton().findSchema({"cutlass_nn::linear", ""}).has_value();
}

}  // namespace cutlass_nn
