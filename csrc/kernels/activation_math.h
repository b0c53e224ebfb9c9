// The activations cutlass_nn fuses into linear layers, as scalar float math shared by every
// implementation: the SM90 GEMM epilogue (gemm_sm90.cuh), the CUDA elementwise kernels
// (activation.cu) and the CPU reference (cpu/). One definition keeps the three bit-compatible up
// to float rounding order, and matches torch's formulas (torch.nn.functional.relu / gelu with
// approximate="none" | "tanh" and their backward). One exception: the epilogue evaluates
// GELU(tanh) in an equivalent, cheaper form (activation_forward_epilogue), which agrees with
// the others to within a few float roundings, well inside one rounding of a 16-bit output.
//
// Torch-free and CUDA-optional: compiles as host code with g++ and as host+device code with nvcc.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define CUTLASS_NN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CUTLASS_NN_HOST_DEVICE inline
#endif

namespace cutlass_nn {
namespace kernels {

// Values are part of the kernel interface (GemmParams::activation); keep them stable.
enum class Activation : int {
  kIdentity = 0,  // "none"
  kReLU = 1,      // "relu"
  kGelu = 2,      // "gelu": x * Phi(x), exact (erf) form
  kGeluTanh = 3,  // "gelu_tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  kSilu = 4,      // "silu": x * sigmoid(x) (the gated operators only; not a GEMM epilogue)
};

namespace activation_constants {
constexpr float kSqrtHalf = 0.70710678118654752f;      // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143268f;    // 1 / sqrt(2 pi)
constexpr float kSqrt2OverPi = 0.79788456080286536f;   // sqrt(2 / pi)
constexpr float kGeluTanhKappa = 0.044715f;
}  // namespace activation_constants

// act(z)
CUTLASS_NN_HOST_DEVICE float activation_forward(Activation act, float z) {
  using namespace activation_constants;
  switch (act) {
    case Activation::kReLU:
      // Exactly torch.relu: NaN propagates (NaN < 0 is false) and -0.0 stays -0.0.
      return z < 0.0f ? 0.0f : z;
    case Activation::kGelu:
      return 0.5f * z * (1.0f + erff(z * kSqrtHalf));
    case Activation::kGeluTanh: {
      const float inner = kSqrt2OverPi * (z + kGeluTanhKappa * z * z * z);
      return 0.5f * z * (1.0f + tanhf(inner));
    }
    case Activation::kSilu:
      // z / (1 + e^-z): for z -> -inf the quotient goes to -0, not NaN (e^-z = inf, z / inf).
      return z / (1.0f + expf(-z));
    case Activation::kIdentity:
    default:
      return z;
  }
}

// act(z) in the SM90 GEMM epilogue (gemm_sm90.cuh), where the math runs between the tiles'
// mainloops and its instructions cost time (the elementwise kernels are bound by memory instead):
// GELU(tanh) as z * sigmoid(2u) = z / (1 + e^(-2u)), u = sqrt(2/pi) (z + 0.044715 z^3), the same
// function as 0.5 z (1 + tanh(u)) without tanh's cancellation for negative z, on the GPU with the
// fast exponential and division (two special-function instructions instead of tanhf's branches
// and IEEE division). Measured on an H100 (2026-12-07): the fused forward took 59.3 us with
// tanhf against 35.2 us for ReLU on the same tile (benchmarks/NOTES.md, forty-fifth session).
// Every other activation as activation_forward. Edge values as torch: +inf -> +inf, -inf and
// NaN -> NaN, large negative z -> -0.
CUTLASS_NN_HOST_DEVICE float activation_forward_epilogue(Activation act, float z) {
  if (act != Activation::kGeluTanh) return activation_forward(act, z);
  using namespace activation_constants;
  const float u = kSqrt2OverPi * (z + kGeluTanhKappa * z * z * z);
#if defined(__CUDA_ARCH__)
  return __fdividef(z, 1.0f + __expf(-2.0f * u));
#else
  return z / (1.0f + expf(-2.0f * u));
#endif
}

// d act / d z at z (torch's convention for relu: 0 at z == 0, 1 at NaN).
CUTLASS_NN_HOST_DEVICE float activation_derivative(Activation act, float z) {
  using namespace activation_constants;
  switch (act) {
    case Activation::kReLU:
      // torch's threshold_backward: 0 where z <= 0, else 1 -- so 1 for NaN (the gradient
      // passes through, as torch.relu's backward does).
      return z <= 0.0f ? 0.0f : 1.0f;
    case Activation::kGelu: {
      const float cdf = 0.5f * (1.0f + erff(z * kSqrtHalf));
      const float pdf = kInvSqrt2Pi * expf(-0.5f * z * z);
      return cdf + z * pdf;
    }
    case Activation::kGeluTanh: {
      const float z2 = z * z;
      const float t = tanhf(kSqrt2OverPi * (z + kGeluTanhKappa * z2 * z));
      const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhKappa * z2);
      return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * dinner;
    }
    case Activation::kSilu: {
      // s (1 + z (1 - s)) with s = sigmoid(z)
      const float s = 1.0f / (1.0f + expf(-z));
      return s * (1.0f + z * (1.0f - s));
    }
    case Activation::kIdentity:
    default:
      return 1.0f;
  }
}

// Double-precision versions for float64 tensors (same formulas).
CUTLASS_NN_HOST_DEVICE double activation_forward(Activation act, double z) {
  switch (act) {
    case Activation::kReLU:
      return z < 0.0 ? 0.0 : z;
    case Activation::kGelu:
      return 0.5 * z * (1.0 + erf(z * 0.70710678118654752440));
    case Activation::kGeluTanh: {
      const double inner = 0.79788456080286535588 * (z + 0.044715 * z * z * z);
      return 0.5 * z * (1.0 + tanh(inner));
    }
    case Activation::kSilu:
      return z / (1.0 + exp(-z));
    case Activation::kIdentity:
    default:
      return z;
  }
}

CUTLASS_NN_HOST_DEVICE double activation_derivative(Activation act, double z) {
  switch (act) {
    case Activation::kReLU:
      return z <= 0.0 ? 0.0 : 1.0;
    case Activation::kGelu: {
      const double cdf = 0.5 * (1.0 + erf(z * 0.70710678118654752440));
      const double pdf = 0.39894228040143267794 * exp(-0.5 * z * z);
      return cdf + z * pdf;
    }
    case Activation::kGeluTanh: {
      const double z2 = z * z;
      const double t = tanh(0.79788456080286535588 * (z + 0.044715 * z2 * z));
      const double dinner = 0.79788456080286535588 * (1.0 + 3.0 * 0.044715 * z2);
      return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * dinner;
    }
    case Activation::kSilu: {
      const double s = 1.0 / (1.0 + exp(-z));
      return s * (1.0 + z * (1.0 - s));
    }
    case Activation::kIdentity:
    default:
      return 1.0;
  }
}

// (act(g) * u, d/dg, d/du) pieces of the gated activation out = act(g) * u: given the output
// gradient go, writes out, grad_g = go * u * act'(g) and grad_u = go * act(g).
template <typename F>
CUTLASS_NN_HOST_DEVICE void gated_backward(Activation act, F go, F g, F u, F& out, F& grad_g,
                                           F& grad_u) {
  const F a = activation_forward(act, g);
  out = a * u;
  grad_u = go * a;
  grad_g = go * u * activation_derivative(act, g);
}

// grad * act'(z): the backward of the activation. For relu a select, like torch's
// threshold_backward, so that z <= 0 gives exactly 0 even where grad is inf or NaN.
CUTLASS_NN_HOST_DEVICE float activation_backward(Activation act, float grad, float z) {
  if (act == Activation::kReLU) return z <= 0.0f ? 0.0f : grad;
  if (act == Activation::kIdentity) return grad;
  return grad * activation_derivative(act, z);
}

CUTLASS_NN_HOST_DEVICE double activation_backward(Activation act, double grad, double z) {
  if (act == Activation::kReLU) return z <= 0.0 ? 0.0 : grad;
  if (act == Activation::kIdentity) return grad;
  return grad * activation_derivative(act, z);
}

}  // namespace kernels
}  // namespace cutlass_nn
