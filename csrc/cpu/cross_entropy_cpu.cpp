// CPU implementation of cross_entropy_rows_: the shared checks, then an ATen formulation in the
// statistics dtype (float32; float64 for float64 logits). It is the reference the CUDA kernel
// (csrc/kernels/cross_entropy.cu) is tested against, and the CPU path of the fused head.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>
#include <optional>
#include <tuple>

#include "../op_checks.h"

namespace cutlass_nn {
namespace {

std::tuple<at::Tensor, at::Tensor> cross_entropy_rows_cpu(
    const at::Tensor& logits, const at::Tensor& target, const std::optional<at::Tensor>& row_scale,
    int64_t ignore_index, double label_smoothing, bool write_grad) {
  check_cross_entropy_rows_args(logits, target, row_scale, label_smoothing, write_grad);
  const auto stat = rms_norm_stat_dtype(logits.scalar_type());
  const int64_t vocab = logits.size(1);
  const double eps = label_smoothing;
  const at::Tensor z = logits.to(stat);
  // as the CUDA kernel: the loss and gradient from (z - m) and log(s), lse = m + log(s)
  const at::Tensor m = std::get<0>(z.max(1, /*keepdim=*/true));
  const at::Tensor shifted = z - m;
  const at::Tensor log_s = shifted.exp().sum(1).log();
  const at::Tensor m1 = m.squeeze(1);
  // A row whose maximum is infinite (a +inf logit, or every logit -inf) has the log-sum-exp m
  // itself, as torch.logsumexp gives; m + log(s) would be NaN there, log(s) being NaN (inf - inf
  // in `shifted`). A NaN logit makes m NaN (max propagates it), so such a row stays NaN. The loss
  // and gradient of these rows stay NaN, as F.cross_entropy's are (its log_softmax is NaN).
  const at::Tensor lse = at::where(m1.isinf(), m1, m1 + log_s);
  const at::Tensor valid = target.ne(ignore_index);
  const at::Tensor bad = valid.logical_and(target.lt(0).logical_or(target.ge(vocab)));
  const at::Tensor safe = at::where(valid.logical_and(bad.logical_not()), target, at::zeros_like(target));
  const at::Tensor zt = z.gather(1, safe.unsqueeze(1)).squeeze(1);
  at::Tensor loss = eps == 0.0 ? log_s + (m1 - zt)
                               : log_s + (1.0 - eps) * (m1 - zt) + eps * (m1 - z.mean(1));
  const at::Tensor nan = at::full({}, std::numeric_limits<double>::quiet_NaN(), loss.options());
  loss = at::where(bad, nan, at::where(valid, loss, at::zeros_like(loss)));
  if (write_grad) {
    at::Tensor g = at::exp(shifted - log_s.unsqueeze(1));
    if (eps != 0.0) g.sub_(eps / vocab);
    const at::Tensor rows = at::arange(logits.size(0), target.options());
    g.index_put_({rows, safe}, at::full({}, -(1.0 - eps), g.options()), /*accumulate=*/true);
    at::Tensor scale = valid.to(stat);
    if (row_scale.has_value() && row_scale->defined()) scale = scale * *row_scale;
    scale = at::where(bad, nan, scale);
    // ignored rows are exact zeros whatever their logits hold
    g = at::where(valid.unsqueeze(1), g * scale.unsqueeze(1), at::zeros_like(g));
    logits.copy_(g);
  }
  return {loss, lse};
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlass_nn, CPU, m) {
  m.impl("cross_entropy_rows_", &cross_entropy_rows_cpu);
}

}  // namespace cutlass_nn
