#include "op_checks.h"

#include "validation.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace cutlass_nn {

void check_linear_args(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias) {
  check_linear_args("linear", input, weight, bias);
}

void check_linear_args(const char* op, const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias) {
  check_float_dtype(op, "input", input);
  check_same_dtype(op, "weight", weight, "input", input);
  check_same_device(op, "weight", weight, "input", input);
  check_min_dim(op, "input", input, 1, "[*, in_features]");
  check_dim(op, "weight", weight, 2, "[out_features, in_features]");
  check_size(op, "input", input, input.dim() - 1, weight.size(1),
             "in_features = weight.shape[1]");
  if (bias.has_value()) {
    check_same_dtype(op, "bias", *bias, "input", input);
    check_same_device(op, "bias", *bias, "input", input);
    check_dim(op, "bias", *bias, 1, "[out_features]");
    check_size(op, "bias", *bias, 0, weight.size(0), "out_features = weight.shape[0]");
  }
}

void check_linear_dgrad_args(const at::Tensor& grad_output, const at::Tensor& weight) {
  const char* op = "linear_dgrad";
  check_float_dtype(op, "grad_output", grad_output);
  check_same_dtype(op, "weight", weight, "grad_output", grad_output);
  check_same_device(op, "weight", weight, "grad_output", grad_output);
  check_min_dim(op, "grad_output", grad_output, 1, "[*, out_features]");
  check_dim(op, "weight", weight, 2, "[out_features, in_features]");
  check_size(op, "grad_output", grad_output, grad_output.dim() - 1, weight.size(0),
             "out_features = weight.shape[0]");
}

static void check_wgrad_pair(const char* op, const at::Tensor& grad_output,
                             const at::Tensor& input) {
  check_float_dtype(op, "grad_output", grad_output);
  check_same_dtype(op, "input", input, "grad_output", grad_output);
  check_same_device(op, "input", input, "grad_output", grad_output);
  check_min_dim(op, "grad_output", grad_output, 1, "[*, out_features]");
  check_min_dim(op, "input", input, 1, "[*, in_features]");
  TORCH_CHECK(grad_output.sizes().slice(0, grad_output.dim() - 1) ==
                        input.sizes().slice(0, input.dim() - 1),
                    "cutlass_nn.", op,
                    ": arguments 'grad_output' [*, out_features] and 'input' [*, in_features] "
                    "must have the same leading (batch) dimensions, got ",
                    shape_string(grad_output.sizes()), " and ", shape_string(input.sizes()));
}

void check_linear_wgrad_args(const at::Tensor& grad_output, const at::Tensor& input) {
  check_wgrad_pair("linear_wgrad", grad_output, input);
}

void check_linear_wgrad_accumulate_args(const at::Tensor& grad_weight,
                                        const at::Tensor& grad_output, const at::Tensor& input) {
  const char* op = "linear_wgrad_accumulate_";
  check_wgrad_pair(op, grad_output, input);
  check_same_device(op, "grad_weight", grad_weight, "grad_output", grad_output);
  const auto in_dtype = grad_output.scalar_type();
  const bool half_inputs = in_dtype == c10::kHalf || in_dtype == c10::kBFloat16;
  TORCH_CHECK(grad_weight.scalar_type() == in_dtype ||
                  (half_inputs && grad_weight.scalar_type() == c10::kFloat),
              "cutlass_nn.", op, ": argument 'grad_weight' must have dtype ",
              dtype_name(in_dtype), " (the dtype of 'grad_output')",
              half_inputs ? " or float32" : "", ", got ",
              dtype_name(grad_weight.scalar_type()));
  check_dim(op, "grad_weight", grad_weight, 2, "[out_features, in_features]");
  check_size(op, "grad_weight", grad_weight, 0, grad_output.size(-1),
             "out_features = grad_output.shape[-1]");
  check_size(op, "grad_weight", grad_weight, 1, input.size(-1), "in_features = input.shape[-1]");
  check_writable(op, "grad_weight", grad_weight);
  // An operand sharing grad_weight's memory is refused rather than served: the in-place GEMM
  // would read it after parts were overwritten. The kernels' own fallback (the product formed in
  // a separate buffer when the storages are shared) stays only as a backstop for what this
  // check cannot decide; a caller asking for dW += f(dW) almost certainly has a bug.
  check_no_overlap(op, "grad_output", grad_output, "grad_weight", grad_weight);
  check_no_overlap(op, "input", input, "grad_weight", grad_weight);
}

void check_bias_grad_args(const at::Tensor& grad_output) {
  const char* op = "bias_grad";
  check_float_dtype(op, "grad_output", grad_output);
  check_min_dim(op, "grad_output", grad_output, 1, "[*, out_features]");
}

void check_mm_args(const char* op, const at::Tensor& a, const at::Tensor& b) {
  check_float_dtype(op, "a", a);
  check_same_dtype(op, "b", b, "a", a);
  check_same_device(op, "b", b, "a", a);
  check_dim(op, "a", a, 2, "[n, m]");
  check_dim(op, "b", b, 2, "[m, p]");
  check_size(op, "b", b, 0, a.size(1), "m = a.shape[1]");
}

void check_mm_out_arg(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  const char* op = "mm.out";
  check_same_dtype(op, "out", out, "a", a);
  check_same_device(op, "out", out, "a", a);
  check_not_grad_leaf(op, "out", out);
  // An `out` of another shape is resized (fresh contiguous strides) before it is written; one of
  // the result's shape is written as it is, so its elements must not share memory.
  const bool right_shape = out.dim() == 2 && out.size(0) == a.size(0) && out.size(1) == b.size(1);
  if (right_shape) check_no_internal_overlap(op, "out", out);
}

void check_add2_args(const at::Tensor& a, const at::Tensor& b) {
  const char* op = "add2";
  check_float_dtype(op, "a", a);
  check_same_dtype(op, "b", b, "a", a);
  check_same_device(op, "b", b, "a", a);
  check_same_shape(op, "b", b, "a", a);
}

void check_scale_args(const at::Tensor& x, const at::Tensor& factor) {
  const char* op = "scale_";
  check_float_dtype(op, "x", x);
  check_writable(op, "x", x);
  TORCH_CHECK(x.is_contiguous(), "cutlass_nn.", op,
              ": argument 'x' must be contiguous (it is scaled in place), got strides ",
              shape_string(x.strides()));
  const auto stat = rms_norm_stat_dtype(x.scalar_type());
  TORCH_CHECK(factor.scalar_type() == stat, "cutlass_nn.", op,
              ": argument 'factor' must have dtype ", dtype_name(stat),
              " (the statistics dtype of 'x'), got ", dtype_name(factor.scalar_type()));
  check_same_device(op, "factor", factor, "x", x);
  check_dim(op, "factor", factor, 0, "(a single value)");
  check_no_overlap(op, "factor", factor, "x", x);
}

void check_rotary_args(const char* op, const char* q_name, const char* k_name, const at::Tensor& q,
                       const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  check_float_dtype(op, q_name, q);
  check_dim(op, q_name, q, 4, "[batch, heads, seq, head_dim]");
  check_same_dtype(op, k_name, k, q_name, q);
  check_same_device(op, k_name, k, q_name, q);
  check_dim(op, k_name, k, 4, "[batch, kv_heads, seq, head_dim]");
  check_same_dtype(op, "cos", cos, q_name, q);
  check_same_device(op, "cos", cos, q_name, q);
  check_dim(op, "cos", cos, 3, "[batch or 1, seq, head_dim]");
  check_same_dtype(op, "sin", sin, q_name, q);
  check_same_device(op, "sin", sin, q_name, q);
  check_same_shape(op, "sin", sin, "cos", cos);
  const int64_t head_dim = q.size(3);
  TORCH_CHECK(head_dim % 2 == 0, "cutlass_nn.", op, ": argument '", q_name,
              "' must have an even head_dim (its last dimension, rotated in halves), got shape ",
              shape_string(q.sizes()));
  const std::string from_q = std::string("the same as '") + q_name + "'";
  check_size(op, k_name, k, 0, q.size(0), ("batch " + from_q).c_str());
  check_size(op, k_name, k, 2, q.size(2), ("seq " + from_q).c_str());
  check_size(op, k_name, k, 3, head_dim, ("head_dim " + from_q).c_str());
  TORCH_CHECK(cos.size(0) == 1 || cos.size(0) == q.size(0), "cutlass_nn.", op,
              ": argument 'cos' must have a batch dimension of 1 or ", std::to_string(q.size(0)),
              " (the batch of '", q_name, "'), got shape ", shape_string(cos.sizes()));
  check_size(op, "cos", cos, 1, q.size(2), ("seq " + from_q).c_str());
  check_size(op, "cos", cos, 2, head_dim, ("head_dim " + from_q).c_str());
}

kernels::Activation parse_activation(const char* op, c10::string_view activation) {
  if (activation == "none") return kernels::Activation::kIdentity;
  if (activation == "relu") return kernels::Activation::kReLU;
  if (activation == "gelu") return kernels::Activation::kGelu;
  if (activation == "gelu_tanh") return kernels::Activation::kGeluTanh;
  const std::string given(activation.data(), activation.size());
  TORCH_CHECK(false, "cutlass_nn.", op,
              ": argument 'activation' must be one of \"none\", \"relu\", \"gelu\", "
              "\"gelu_tanh\", got \"",
              given, "\"");
}

kernels::Activation parse_gated_activation(const char* op, c10::string_view activation) {
  if (activation == "silu") return kernels::Activation::kSilu;
  if (activation == "gelu") return kernels::Activation::kGelu;
  if (activation == "gelu_tanh") return kernels::Activation::kGeluTanh;
  const std::string given(activation.data(), activation.size());
  TORCH_CHECK(false, "cutlass_nn.", op,
              ": argument 'activation' must be one of \"silu\", \"gelu\", \"gelu_tanh\", got \"",
              given, "\"");
}

void check_gate_up_arg(const char* op, const at::Tensor& gate_up) {
  check_float_dtype(op, "gate_up", gate_up);
  check_min_dim(op, "gate_up", gate_up, 1, "[*, 2n]");
  TORCH_CHECK(gate_up.size(-1) % 2 == 0, "cutlass_nn.", op,
              ": argument 'gate_up' must have an even last dimension [*, 2n] (gate, then up), "
              "got shape ",
              shape_string(gate_up.sizes()));
}

void check_gated_act_backward_args(const at::Tensor& grad_output, const at::Tensor& gate_up,
                                   const char* op) {
  check_gate_up_arg(op, gate_up);
  check_same_dtype(op, "grad_output", grad_output, "gate_up", gate_up);
  check_same_device(op, "grad_output", grad_output, "gate_up", gate_up);
  std::vector<int64_t> shape(gate_up.sizes().begin(), gate_up.sizes().end());
  shape.back() /= 2;
  TORCH_CHECK(grad_output.sizes() == at::IntArrayRef(shape), "cutlass_nn.", op,
              ": argument 'grad_output' must have shape ", shape_string(shape),
              " (that of 'gate_up' with the last dimension halved), got ",
              shape_string(grad_output.sizes()));
}

void check_gate_up_writable(const char* op, const at::Tensor& gate_up,
                            const at::Tensor& grad_output) {
  check_writable(op, "gate_up", gate_up);
  TORCH_CHECK(gate_up.is_contiguous(), "cutlass_nn.", op,
              ": argument 'gate_up' must be contiguous (it is written in place), got strides ",
              shape_string(gate_up.strides()));
  check_no_overlap(op, "grad_output", grad_output, "gate_up", gate_up);
}

void check_cross_entropy_rows_args(const at::Tensor& logits, const at::Tensor& target,
                                   const std::optional<at::Tensor>& row_scale,
                                   double label_smoothing, bool write_grad) {
  const char* op = "cross_entropy_rows_";
  check_float_dtype(op, "logits", logits);
  check_dim(op, "logits", logits, 2, "[rows, vocab]");
  TORCH_CHECK(logits.size(1) >= 1, "cutlass_nn.", op,
              ": argument 'logits' must have at least one class (vocab >= 1), got shape ",
              shape_string(logits.sizes()));
  if (write_grad) check_writable(op, "logits", logits);
  TORCH_CHECK(logits.is_contiguous(), "cutlass_nn.", op,
              ": argument 'logits' must be contiguous (it is written in place), got strides ",
              shape_string(logits.strides()));
  TORCH_CHECK(target.scalar_type() == c10::kLong, "cutlass_nn.", op,
              ": argument 'target' must be an int64 tensor of class indices, got ",
              dtype_name(target.scalar_type()));
  check_same_device(op, "target", target, "logits", logits);
  check_dim(op, "target", target, 1, "[rows]");
  check_size(op, "target", target, 0, logits.size(0), "rows = logits.shape[0]");
  if (row_scale.has_value() && row_scale->defined()) {
    const auto stat = rms_norm_stat_dtype(logits.scalar_type());
    TORCH_CHECK(row_scale->scalar_type() == stat, "cutlass_nn.", op,
                ": argument 'row_scale' must have dtype ", dtype_name(stat),
                " (the statistics dtype of 'logits'), got ", dtype_name(row_scale->scalar_type()));
    check_same_device(op, "row_scale", *row_scale, "logits", logits);
    check_dim(op, "row_scale", *row_scale, 1, "[rows]");
    check_size(op, "row_scale", *row_scale, 0, logits.size(0), "rows = logits.shape[0]");
    check_no_overlap(op, "row_scale", *row_scale, "logits", logits);
  }
  TORCH_CHECK(std::isfinite(label_smoothing) && label_smoothing >= 0.0 && label_smoothing <= 1.0,
              "cutlass_nn.", op, ": argument 'label_smoothing' must be in [0, 1], got ",
              std::to_string(label_smoothing));  // a string: see the eps check below
}

namespace {

// The gate and up weights of the gated operators against `ref` (named `ref_name`): same dtype and
// device, gate_weight [n, in] with in = `in` (unless `in` < 0), up_weight of gate_weight's shape.
void check_gate_up_weights(const char* op, const char* ref_name, const at::Tensor& ref,
                           const at::Tensor& gate_weight, const at::Tensor& up_weight,
                           int64_t in, const char* in_what) {
  for (const auto& [name, w] : {std::pair<const char*, const at::Tensor*>{"gate_weight", &gate_weight},
                                {"up_weight", &up_weight}}) {
    check_same_dtype(op, name, *w, ref_name, ref);
    check_same_device(op, name, *w, ref_name, ref);
  }
  check_dim(op, "gate_weight", gate_weight, 2, "[n, in]");
  if (in >= 0) check_size(op, "gate_weight", gate_weight, 1, in, in_what);
  check_same_shape(op, "up_weight", up_weight, "gate_weight", gate_weight);
}

// A bias of the gated operators: input's dtype and device, [size] (`what` names the size).
void check_bias_vector(const char* op, const char* name, const at::Tensor& bias,
                       const at::Tensor& input, int64_t size, const char* what) {
  check_same_dtype(op, name, bias, "input", input);
  check_same_device(op, name, bias, "input", input);
  check_dim(op, name, bias, 1, what);
  check_size(op, name, bias, 0, size, what);
}

// gate_bias / up_bias: both or neither, each [n] of input's dtype and device.
void check_gate_up_biases(const char* op, const at::Tensor& input, int64_t n,
                          const std::optional<at::Tensor>& gate_bias,
                          const std::optional<at::Tensor>& up_bias) {
  const bool has_gate_bias = gate_bias.has_value() && gate_bias->defined();
  const bool has_up_bias = up_bias.has_value() && up_bias->defined();
  TORCH_CHECK(has_gate_bias == has_up_bias, "cutlass_nn.", op,
              ": arguments 'gate_bias' and 'up_bias' must be given both or neither, got "
              "gate_bias=",
              has_gate_bias ? "a tensor" : "None", ", up_bias=", has_up_bias ? "a tensor" : "None");
  for (const auto& [name, bias] :
       {std::pair<const char*, const std::optional<at::Tensor>*>{"gate_bias", &gate_bias},
        {"up_bias", &up_bias}}) {
    if (bias->has_value() && (*bias)->defined()) {
      check_bias_vector(op, name, **bias, input, n, "[n]");
    }
  }
}

}  // namespace

void check_gated_mlp_args(const at::Tensor& input, const at::Tensor& gate_weight,
                          const at::Tensor& up_weight, const at::Tensor& down_weight,
                          const std::optional<at::Tensor>& gate_bias,
                          const std::optional<at::Tensor>& up_bias,
                          const std::optional<at::Tensor>& down_bias) {
  const char* op = "gated_mlp";
  check_float_dtype(op, "input", input);
  check_min_dim(op, "input", input, 1, "[*, in]");
  check_gate_up_weights(op, "input", input, gate_weight, up_weight, input.size(-1),
                        "in = input.shape[-1]");
  check_same_dtype(op, "down_weight", down_weight, "input", input);
  check_same_device(op, "down_weight", down_weight, "input", input);
  check_dim(op, "down_weight", down_weight, 2, "[out, n]");
  check_size(op, "down_weight", down_weight, 1, gate_weight.size(0), "n = gate_weight.shape[0]");
  check_gate_up_biases(op, input, gate_weight.size(0), gate_bias, up_bias);
  if (down_bias.has_value() && down_bias->defined()) {
    check_bias_vector(op, "down_bias", *down_bias, input, down_weight.size(0), "[out]");
  }
}

void check_gate_up_linear_args(const at::Tensor& input, const at::Tensor& gate_weight,
                               const at::Tensor& up_weight,
                               const std::optional<at::Tensor>& gate_bias,
                               const std::optional<at::Tensor>& up_bias) {
  const char* op = "_gate_up_linear";
  check_float_dtype(op, "input", input);
  check_min_dim(op, "input", input, 1, "[*, in]");
  check_gate_up_weights(op, "input", input, gate_weight, up_weight, input.size(-1),
                        "in = input.shape[-1]");
  check_gate_up_biases(op, input, gate_weight.size(0), gate_bias, up_bias);
}

void check_gate_up_dgrad_args(const at::Tensor& grad_gate_up, const at::Tensor& gate_weight,
                              const at::Tensor& up_weight) {
  const char* op = "_gate_up_dgrad";
  check_float_dtype(op, "grad_gate_up", grad_gate_up);
  check_min_dim(op, "grad_gate_up", grad_gate_up, 1, "[*, 2n]");
  check_gate_up_weights(op, "grad_gate_up", grad_gate_up, gate_weight, up_weight, -1, "");
  // The number as a string (validation.h: an integer streamed into a message crashes the
  // process on the GPU machine's torch build; this one did, before it went through to_string).
  TORCH_CHECK(grad_gate_up.size(-1) == 2 * gate_weight.size(0), "cutlass_nn.", op,
              ": argument 'grad_gate_up' must have last dimension 2n = ",
              std::to_string(2 * gate_weight.size(0)), " (n = gate_weight.shape[0]), got shape ",
              shape_string(grad_gate_up.sizes()));
}

void check_pack_gate_up_args(const at::Tensor& gate, const at::Tensor& up, at::ScalarType dtype) {
  const char* op = "_pack_gate_up";
  check_float_dtype(op, "gate", gate);
  check_dim(op, "gate", gate, 2, "[n, in]");
  check_same_dtype(op, "up", up, "gate", gate);
  check_same_device(op, "up", up, "gate", gate);
  check_same_shape(op, "up", up, "gate", gate);
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat ||
                  dtype == at::kDouble,
              "cutlass_nn.", op,
              ": argument 'dtype' must be a floating dtype (float16, bfloat16, float32 or "
              "float64), got ",
              dtype_name(dtype));
}

void check_activation_grad_args(const at::Tensor& grad_output, const at::Tensor& preact) {
  const char* op = "activation_grad";
  check_float_dtype(op, "grad_output", grad_output);
  check_same_dtype(op, "preact", preact, "grad_output", grad_output);
  check_same_device(op, "preact", preact, "grad_output", grad_output);
  check_min_dim(op, "grad_output", grad_output, 1, "[*, features]");
  check_same_shape(op, "preact", preact, "grad_output", grad_output);
}

void check_main_grad_args(const at::Tensor& weight, const at::Tensor& buffer) {
  const char* op = "_set_main_grad";
  check_float_dtype(op, "weight", weight);
  // what grad_to_accumulate_into (csrc/autograd/autograd_kernels.cpp) adds into with the
  // weight-gradient GEMM; any other buffer would only ever be filled by the fold-in hook
  const auto dtype = weight.scalar_type();
  const bool half = dtype == c10::kHalf || dtype == c10::kBFloat16;
  TORCH_CHECK(buffer.scalar_type() == dtype || (half && buffer.scalar_type() == c10::kFloat),
              "cutlass_nn.", op, ": argument 'buffer' must have dtype ", dtype_name(dtype),
              " (the dtype of 'weight')", half ? " or float32" : "", ", got ",
              dtype_name(buffer.scalar_type()));
  check_same_device(op, "buffer", buffer, "weight", weight);
  check_same_shape(op, "buffer", buffer, "weight", weight);
  TORCH_CHECK(buffer.is_contiguous(), "cutlass_nn.", op,
              ": argument 'buffer' must be contiguous (the weight-gradient GEMM adds into it in "
              "place), got strides ",
              shape_string(buffer.strides()));
  // the gradient is added into the buffer: one that is the weight would change the weight
  check_no_overlap(op, "buffer", buffer, "weight", weight);
}

c10::ScalarType rms_norm_stat_dtype(c10::ScalarType dtype) {
  return dtype == c10::kDouble ? c10::kDouble : c10::kFloat;
}

// weight [features] of input's dtype, or float32 beside 16-bit activations (a float32 master
// weight under autocast). A features mismatch names the activations, not the weight: the weight
// is the layer's parameter (cutlass_nn.RMSNorm(4) given a [*, 5] input), so it is the input that
// does not fit, as in linear's in_features check.
static void check_norm_weight(const char* op, const at::Tensor& weight, const char* ref_arg,
                              const at::Tensor& ref) {
  const auto dtype = ref.scalar_type();
  const bool half = dtype == c10::kHalf || dtype == c10::kBFloat16;
  TORCH_CHECK(weight.scalar_type() == dtype || (half && weight.scalar_type() == c10::kFloat),
              "cutlass_nn.", op, ": argument 'weight' must have dtype ", dtype_name(dtype),
              " (the dtype of '", ref_arg, "')", half ? " or float32" : "", ", got ",
              dtype_name(weight.scalar_type()));
  check_same_device(op, "weight", weight, ref_arg, ref);
  check_dim(op, "weight", weight, 1, "[features]");
  check_size(op, ref_arg, ref, ref.dim() - 1, weight.size(0), "features = weight.shape[0]");
}

void check_rms_norm_args(const char* op, const char* input_arg, const at::Tensor& input,
                         const at::Tensor* residual, const at::Tensor& weight, double eps) {
  check_float_dtype(op, input_arg, input);
  check_min_dim(op, input_arg, input, 1, "[*, features]");
  if (residual != nullptr) {
    check_same_dtype(op, "residual", *residual, input_arg, input);
    check_same_device(op, "residual", *residual, input_arg, input);
    check_same_shape(op, "residual", *residual, input_arg, input);
  }
  check_norm_weight(op, weight, input_arg, input);
  // doubles go into messages as strings: streaming a double into the message crashed the
  // CUDA-flavor build on the GPU machine (torch 2.11)
  TORCH_CHECK(std::isfinite(eps) && eps >= 0.0, "cutlass_nn.", op,
              ": argument 'eps' must be a finite number >= 0, got ", std::to_string(eps));
}

void check_rms_norm_backward_args(const at::Tensor& grad_output,
                                  const std::optional<at::Tensor>& grad_h, const at::Tensor& h,
                                  const at::Tensor& weight, const at::Tensor& rstd) {
  const char* op = "rms_norm_backward";
  check_float_dtype(op, "h", h);
  check_min_dim(op, "h", h, 1, "[*, features]");
  check_same_dtype(op, "grad_output", grad_output, "h", h);
  check_same_device(op, "grad_output", grad_output, "h", h);
  check_same_shape(op, "grad_output", grad_output, "h", h);
  if (grad_h.has_value() && grad_h->defined()) {
    check_same_dtype(op, "grad_h", *grad_h, "h", h);
    check_same_device(op, "grad_h", *grad_h, "h", h);
    check_same_shape(op, "grad_h", *grad_h, "h", h);
  }
  check_norm_weight(op, weight, "h", h);
  const auto stat = rms_norm_stat_dtype(h.scalar_type());
  TORCH_CHECK(rstd.scalar_type() == stat, "cutlass_nn.", op, ": argument 'rstd' must have dtype ",
              dtype_name(stat), ", got ", dtype_name(rstd.scalar_type()));
  check_same_device(op, "rstd", rstd, "h", h);
  TORCH_CHECK(rstd.sizes() == h.sizes().slice(0, h.dim() - 1), "cutlass_nn.", op,
              ": argument 'rstd' must have the leading dimensions of 'h' ",
              shape_string(h.sizes().slice(0, h.dim() - 1)), ", got ",
              shape_string(rstd.sizes()));
}

}  // namespace cutlass_nn
