// CPU implementations of the fused-activation operators: linear_act, linear_act_aux and
// activation_grad (schemas in csrc/ops_registry.cpp).
//
// They are the reference for the CUDA kernels and follow the GPU numerics: the GEMM accumulates
// in float (double for float64) -- 16-bit operands are widened first, so the products are exact
// and only the sum rounds, as in the tensor-core kernels' fp32 accumulator -- the bias is added
// in that precision, and the pre-activation z and the output act(z) are each rounded once to the
// tensor dtype from the unrounded z (what the fused GEMM epilogue does). The activation math is
// the one shared with the CUDA code (csrc/kernels/activation_math.h).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

#include "../kernels/activation_math.h"
#include "../op_checks.h"
#include "../tensor_shapes.h"

namespace cutlass_nn {
namespace {

using kernels::Activation;

// Rows of the fixed-size blocks of activation_grad's bias-gradient partial sums. Fixed (not the
// thread count), so the summation order and hence the result do not depend on the number of
// threads.
constexpr int64_t kBiasRowBlock = 256;
constexpr int64_t kElementwiseGrain = 4096;

c10::ScalarType compute_dtype(c10::ScalarType dtype) {
  return dtype == c10::kDouble ? c10::kDouble : c10::kFloat;
}

// z = input @ weight.T + bias in the compute dtype (float, double for float64), written into
// `z_acc` ([rows, out_features] view of a contiguous tensor of that dtype).
void preact_into(at::Tensor& z_acc, const at::Tensor& input, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias) {
  const auto acc = compute_dtype(input.scalar_type());
  const at::Tensor x = flatten_leading(input).to(acc);
  const at::Tensor w = weight.to(acc);
  if (bias.has_value()) {
    at::addmm_out(z_acc, bias->to(acc), x, w.t());
  } else {
    at::mm_out(z_acc, x, w.t());
  }
}

// out[i] = round(act(z[i])) and, when z_out is given, z_out[i] = round(z[i]), for contiguous
// buffers of n elements; z is in the compute type Acc, the outputs in the tensor type T.
template <typename T, typename Acc>
void round_and_activate(const Acc* z, T* z_out, T* out, int64_t n, Activation act) {
  at::parallel_for(0, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Acc v = z[i];
      if (z_out != nullptr) z_out[i] = static_cast<T>(v);
      out[i] = static_cast<T>(kernels::activation_forward(act, v));
    }
  });
}

// (act(z), z) with z = input @ weight.T + bias, both [*, out_features] in input's dtype.
// `want_preact` = false skips z's rounded copy (linear_act) and returns an undefined tensor.
std::tuple<at::Tensor, at::Tensor> linear_act_impl(const char* op, const at::Tensor& input,
                                                  const at::Tensor& weight,
                                                  const std::optional<at::Tensor>& bias,
                                                  c10::string_view activation,
                                                  bool want_preact) {
  check_linear_args(op, input, weight, bias);
  const Activation act = parse_activation(op, activation);

  const int64_t out_features = weight.size(0);
  const std::vector<int64_t> out_shape = with_last_dim(input, out_features);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < input.dim(); ++d) rows *= input.size(d);

  const auto dtype = input.scalar_type();
  const auto acc = compute_dtype(dtype);
  // The outputs are allocated in their final shape (they are not views, so in-place ops on them
  // work); for float32 / float64 the accumulator tensor is itself the returned z.
  at::Tensor z_acc = at::empty(out_shape, input.options().dtype(acc));
  at::Tensor z_acc2d = z_acc.view({rows, out_features});
  preact_into(z_acc2d, input, weight, bias);

  at::Tensor out = at::empty(out_shape, input.options());
  at::Tensor z;
  if (want_preact) z = dtype == acc ? z_acc : at::empty(out_shape, input.options());
  const bool round_z = want_preact && dtype != acc;

  AT_DISPATCH_FLOATING_TYPES_AND2(c10::kHalf, c10::kBFloat16, dtype, "cutlass_nn.linear_act", [&] {
    using Acc = at::opmath_type<scalar_t>;
    round_and_activate<scalar_t, Acc>(z_acc.const_data_ptr<Acc>(),
                                      round_z ? z.mutable_data_ptr<scalar_t>() : nullptr,
                                      out.mutable_data_ptr<scalar_t>(), z_acc.numel(), act);
  });
  return {out, z};
}

at::Tensor linear_act_cpu(const at::Tensor& input, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias, c10::string_view activation) {
  return std::get<0>(linear_act_impl("linear_act", input, weight, bias, activation,
                                     /*want_preact=*/false));
}

std::tuple<at::Tensor, at::Tensor> linear_act_aux_cpu(const at::Tensor& input,
                                                      const at::Tensor& weight,
                                                      const std::optional<at::Tensor>& bias,
                                                      c10::string_view activation) {
  return linear_act_impl("linear_act_aux", input, weight, bias, activation,
                         /*want_preact=*/true);
}

// grad_z = round(grad_out * act'(z)), computed in Acc. With bias: partial[b][c] = sum of the
// rounded grad_z over rows [b * kBiasRowBlock, ...) of block b, in row order, then
// bias[c] = round(sum_b partial[b][c]) in block order: the same result for any thread count.
template <typename T>
void activation_grad_kernel(const T* g, const T* z, T* dz, int64_t rows, int64_t cols,
                            T* bias, Activation act) {
  using Acc = at::opmath_type<T>;
  if (bias == nullptr) {
    at::parallel_for(0, rows * cols, kElementwiseGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        dz[i] = static_cast<T>(kernels::activation_backward(act, static_cast<Acc>(g[i]),
                                                            static_cast<Acc>(z[i])));
      }
    });
    return;
  }
  const int64_t blocks = (rows + kBiasRowBlock - 1) / kBiasRowBlock;
  std::vector<Acc> partial(static_cast<size_t>(blocks * cols), Acc(0));
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      Acc* part = partial.data() + b * cols;
      const int64_t r1 = std::min(rows, (b + 1) * kBiasRowBlock);
      for (int64_t r = b * kBiasRowBlock; r < r1; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t i = r * cols + c;
          const T d = static_cast<T>(kernels::activation_backward(act, static_cast<Acc>(g[i]),
                                                                  static_cast<Acc>(z[i])));
          dz[i] = d;
          part[c] += static_cast<Acc>(d);
        }
      }
    }
  });
  at::parallel_for(0, cols, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      Acc s = Acc(0);
      for (int64_t b = 0; b < blocks; ++b) s += partial[static_cast<size_t>(b * cols + c)];
      bias[c] = static_cast<T>(s);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> activation_grad_cpu(const at::Tensor& grad_output,
                                                       const at::Tensor& preact,
                                                       c10::string_view activation,
                                                       bool bias_grad) {
  check_activation_grad_args(grad_output, preact);
  const Activation act = parse_activation("activation_grad", activation);

  const at::Tensor g = grad_output.contiguous();
  const at::Tensor z = preact.contiguous();
  const int64_t cols = preact.size(-1);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < preact.dim(); ++d) rows *= preact.size(d);

  at::Tensor dz =
      at::empty(preact.sizes(), preact.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor db = at::empty({bias_grad ? cols : 0}, preact.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(
      c10::kHalf, c10::kBFloat16, preact.scalar_type(), "cutlass_nn.activation_grad", [&] {
        activation_grad_kernel<scalar_t>(g.const_data_ptr<scalar_t>(),
                                         z.const_data_ptr<scalar_t>(),
                                         dz.mutable_data_ptr<scalar_t>(), rows, cols,
                                         bias_grad ? db.mutable_data_ptr<scalar_t>() : nullptr,
                                         act);
      });
  return {dz, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CPU, m) {
  m.impl("linear_act", &linear_act_cpu);
  m.impl("linear_act_aux", &linear_act_aux_cpu);
  m.impl("activation_grad", &activation_grad_cpu);
}

}  // namespace cutlass_nn
