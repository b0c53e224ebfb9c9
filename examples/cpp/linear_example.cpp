// Calls the cutlass_nn operators from C++ (LibTorch) and checks them against torch's own:
// cutlass_nn::linear vs torch::linear, cutlass_nn::mm vs torch::mm, cutlass_nn::add2 vs a + b,
// on CPU tensors, and on CUDA tensors too when a GPU is visible and the library is the CUDA flavor.
// Prints one line per check; exits 1 on a mismatch (or if the operators are not registered).
//
// Built by csrc/CMakeLists.txt with -DCUTLASS_NN_BUILD_EXAMPLES=ON (see scripts/cmake_build_check.sh).
#include <torch/cuda.h>
#include <torch/types.h>

#include <cutlass_nn/ops.h>

#include <cstdio>
#include <exception>
#include <string>

namespace {

int failures = 0;

void check(const std::string& name, const at::Tensor& got, const at::Tensor& expected,
           double rtol, double atol) {
  const bool ok = got.sizes() == expected.sizes() && got.dtype() == expected.dtype() &&
                  torch::allclose(got, expected, rtol, atol);
  if (!ok) ++failures;
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", name.c_str());
}

void run_checks(const torch::Device& device, torch::Dtype dtype, double rtol, double atol) {
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  const std::string tag = std::string(" [") + device.str() + ", " +
                          std::string(c10::toString(dtype)) + "]";
  torch::manual_seed(0);
  const auto x = torch::randn({4, 8, 32}, opts);
  const auto w = torch::randn({16, 32}, opts);
  const auto b = torch::randn({16}, opts);
  check("cutlass_nn::linear(x, w, b) == torch::linear" + tag, cutlass_nn::linear(x, w, b),
        torch::linear(x, w, b), rtol, atol);
  check("cutlass_nn::linear(x, w) == torch::linear (no bias)" + tag, cutlass_nn::linear(x, w),
        torch::linear(x, w), rtol, atol);
  check("cutlass_nn::linear_act(x, w, b, \"gelu_tanh\") == gelu(linear, tanh)" + tag,
        cutlass_nn::linear_act(x, w, b, "gelu_tanh"),
        torch::gelu(torch::linear(x, w, b), "tanh"), rtol, atol);

  const auto a = torch::randn({24, 40}, opts);
  const auto m = torch::randn({40, 12}, opts);
  check("cutlass_nn::mm(a, b) == torch::mm" + tag, cutlass_nn::mm(a, m), torch::mm(a, m), rtol,
        atol);

  const auto p = torch::randn({5, 7}, opts);
  const auto q = torch::randn({5, 7}, opts);
  check("cutlass_nn::add2(a, b) == a + b" + tag, cutlass_nn::add2(p, q), p + q, rtol, atol);
}

}  // namespace

int main() {
  if (!cutlass_nn::is_loaded()) {
    std::printf("FAIL the cutlass_nn operators are not registered (libcutlass_nn_ops not loaded)\n");
    return 1;
  }
  try {
    std::string info = cutlass_nn::build_info();
    for (auto& c : info) c = c == '\n' ? ' ' : c;
    std::printf("cutlass_nn build: %s\n", info.c_str());
    run_checks(torch::kCPU, torch::kFloat32, 1e-5, 1e-5);
    run_checks(torch::kCPU, torch::kFloat64, 1e-10, 1e-10);

    const bool cuda_flavor = info.find("flavor=cuda") != std::string::npos;
    if (torch::cuda::is_available() && cuda_flavor) {
      // 16-bit and TF32-rounded results differ from cuBLAS's within these tolerances.
      run_checks(torch::Device(torch::kCUDA, 0), torch::kFloat32, 1e-2, 1e-2);
      run_checks(torch::Device(torch::kCUDA, 0), torch::kFloat16, 2e-2, 2e-2);
    } else {
      std::printf("SKIP CUDA checks (%s)\n", cuda_flavor ? "no GPU visible"
                                                         : "CPU flavor of libcutlass_nn_ops");
    }
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    return 1;
  }
  std::printf("%s: %d check(s) failed\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
