// Calls the cutlass_nn operators from C++ (LibTorch) and checks them against torch's own:
// cutlass_nn::linear vs torch::linear, cutlass_nn::mm vs torch::mm, cutlass_nn::add2 vs a + b,
// and a training step (forward, loss.backward(), an SGD step) of a two-layer MLP built on
// cutlass_nn::linear / linear_act against the same MLP on torch::linear: the autograd formulas
// are registered in C++, so backward works from LibTorch. On CPU tensors, and on CUDA tensors
// too when a GPU is visible and the library is the CUDA flavor.
// Prints one line per check; exits 1 on a mismatch (or if the operators are not registered).
//
// Built by csrc/CMakeLists.txt with -DCUTLASS_NN_BUILD_EXAMPLES=ON (see scripts/cmake_build_check.sh).
#include <torch/cuda.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <cutlass_nn/ops.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

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

// Parameters of a 2-layer MLP (hidden layer with a GELU), leaves that require gradients.
struct Mlp {
  at::Tensor w1, b1, w2, b2;
  std::vector<at::Tensor> parameters() const { return {w1, b1, w2, b2}; }
};

Mlp make_mlp(const torch::TensorOptions& opts) {
  torch::manual_seed(1);
  Mlp mlp{torch::randn({64, 32}, opts) * 0.2, torch::randn({64}, opts) * 0.1,
          torch::randn({10, 64}, opts) * 0.2, torch::randn({10}, opts) * 0.1};
  for (auto& p : {&mlp.w1, &mlp.b1, &mlp.w2, &mlp.b2}) p->requires_grad_(true);
  return mlp;
}

// One training step: cross-entropy of the MLP's logits, backward, an SGD step; returns the loss.
at::Tensor train_step(const Mlp& mlp, bool use_cutlass, const at::Tensor& x,
                      const at::Tensor& target, torch::optim::SGD& opt) {
  opt.zero_grad();
  at::Tensor logits;
  if (use_cutlass) {
    const at::Tensor h = cutlass_nn::linear_act(x, mlp.w1, mlp.b1, "gelu");
    logits = cutlass_nn::linear(h, mlp.w2, mlp.b2);
  } else {
    logits = torch::linear(torch::gelu(torch::linear(x, mlp.w1, mlp.b1)), mlp.w2, mlp.b2);
  }
  at::Tensor loss = torch::cross_entropy_loss(logits, target);
  loss.backward();
  opt.step();
  return loss.detach();
}

void run_training_checks(const torch::Device& device, torch::Dtype dtype, double rtol,
                         double atol) {
  const auto opts = torch::TensorOptions().device(device).dtype(dtype);
  const std::string tag = std::string(" [") + device.str() + ", " +
                          std::string(c10::toString(dtype)) + "]";
  torch::manual_seed(2);
  const auto x = torch::randn({16, 32}, opts);
  const auto target = torch::randint(0, 10, {16}, torch::TensorOptions().device(device).dtype(torch::kLong));
  const Mlp ours = make_mlp(opts), ref = make_mlp(opts);
  torch::optim::SGD opt_ours(ours.parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD opt_ref(ref.parameters(), torch::optim::SGDOptions(0.1));
  const at::Tensor loss_ours = train_step(ours, true, x, target, opt_ours);
  const at::Tensor loss_ref = train_step(ref, false, x, target, opt_ref);
  check("training step: loss == torch" + tag, loss_ours, loss_ref, rtol, atol);
  const char* names[] = {"w1", "b1", "w2", "b2"};
  const auto ours_p = ours.parameters(), ref_p = ref.parameters();
  for (size_t i = 0; i < ours_p.size(); ++i) {
    const bool has_grad = ours_p[i].grad().defined();
    if (!has_grad) ++failures;
    std::printf("%s training step: %s has a gradient%s\n", has_grad ? "PASS" : "FAIL", names[i],
                tag.c_str());
    if (!has_grad) continue;
    check(std::string("training step: grad ") + names[i] + " == torch" + tag, ours_p[i].grad(),
          ref_p[i].grad(), rtol, atol);
    check(std::string("training step: SGD-updated ") + names[i] + " == torch" + tag,
          ours_p[i].detach(), ref_p[i].detach(), rtol, atol);
  }
  // The same step again with the updated parameters (the optimizer saw real gradients).
  const at::Tensor loss2_ours = train_step(ours, true, x, target, opt_ours);
  const at::Tensor loss2_ref = train_step(ref, false, x, target, opt_ref);
  check("training step 2: loss == torch" + tag, loss2_ours, loss2_ref, rtol, atol);
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
    run_training_checks(torch::kCPU, torch::kFloat32, 1e-4, 1e-5);
    run_training_checks(torch::kCPU, torch::kFloat64, 1e-10, 1e-12);

    const bool cuda_flavor = info.find("flavor=cuda") != std::string::npos;
    if (torch::cuda::is_available() && cuda_flavor) {
      // 16-bit and TF32-rounded results differ from cuBLAS's within these tolerances.
      run_checks(torch::Device(torch::kCUDA, 0), torch::kFloat32, 1e-2, 1e-2);
      run_checks(torch::Device(torch::kCUDA, 0), torch::kFloat16, 2e-2, 2e-2);
      run_training_checks(torch::Device(torch::kCUDA, 0), torch::kFloat32, 1e-2, 1e-3);
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
