// Host check of activation_forward_epilogue (activation_math.h): the form of each activation
// that the SM90 GEMM epilogue evaluates, over a sweep of z and the special values. Compiled and
// run by tests/test_activation_epilogue.py with a host C++ compiler; the GPU path (the fast
// exponential and division) is checked against float64 by the GPU tests
// (tests/test_activation.py, tests/test_cuda_kernel_selection.py).
//
// Prints one line per activation:
//   name max_rel_err max_abs_err worst_z differs_from_activation_forward
// (the errors against a double reference written without cancellation: GELU(tanh) as
// z / (1 + e^(-2u)), GELU as 0.5 z erfc(-z / sqrt 2); relative where |reference| >= 1e-30;
// the last field counts the z where the epilogue form and activation_forward(float) differ),
// then one line per special value:  special name z result
#include <cmath>
#include <cstdio>
#include <limits>

#include "../activation_math.h"

using cutlass_nn::kernels::Activation;
using cutlass_nn::kernels::activation_forward;
using cutlass_nn::kernels::activation_forward_epilogue;

double accurate(Activation act, double z) {
  switch (act) {
    case Activation::kReLU:
      return z < 0.0 ? 0.0 : z;
    case Activation::kGelu:
      return 0.5 * z * std::erfc(-z * 0.70710678118654752440);
    case Activation::kGeluTanh: {
      const double u = 0.79788456080286535588 * (z + 0.044715 * z * z * z);
      return z / (1.0 + std::exp(-2.0 * u));
    }
    default:
      return z;
  }
}

int main() {
  const struct {
    const char* name;
    Activation act;
  } acts[] = {{"relu", Activation::kReLU},
              {"gelu", Activation::kGelu},
              {"gelu_tanh", Activation::kGeluTanh}};
  for (const auto& a : acts) {
    double max_rel = 0.0, max_abs = 0.0, worst = 0.0;
    long differs = 0;
    // z from -12 to 12 in steps of 2^-10
    for (int i = -12 * 1024; i <= 12 * 1024; ++i) {
      const float z = static_cast<float>(i) / 1024.0f;
      const double ref = accurate(a.act, static_cast<double>(z));
      const float got = activation_forward_epilogue(a.act, z);
      if (got != activation_forward(a.act, z)) ++differs;
      const double abs_err = std::fabs(static_cast<double>(got) - ref);
      if (abs_err > max_abs) max_abs = abs_err;
      if (std::fabs(ref) >= 1e-30 && abs_err / std::fabs(ref) > max_rel) {
        max_rel = abs_err / std::fabs(ref);
        worst = z;
      }
    }
    std::printf("%s %.3e %.3e %.6f %ld\n", a.name, max_rel, max_abs, worst, differs);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), -30.0f, 30.0f,
                            0.0f};
  for (const auto& a : acts) {
    for (float z : specials) {
      std::printf("special %s %g %g\n", a.name, z, activation_forward_epilogue(a.act, z));
    }
  }
  return 0;
}
