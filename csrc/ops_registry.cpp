// The one place where every cutlass_nn operator schema is declared.
//
// Each dispatch key registers its kernels beside them, one folder per key: csrc/cpu/ (CPU, always
// built), csrc/cuda/ (CUDA, built when the CUDA flavor is compiled; the CPU flavor registers
// csrc/cuda_unavailable.cpp's clear error instead), csrc/autograd/ (the backward formulas, every
// backend) and csrc/autocast/ (AutocastCUDA / AutocastCPU). Only the fake (meta) implementations
// for torch.compile are registered from Python, in cutlass_nn/ops.py.
//
// The Python builds (setup.py) make this file the module cutlass_nn._C; the CMake build for
// LibTorch C++ users (csrc/CMakeLists.txt) defines CUTLASS_NN_NO_PYTHON and gets a plain shared
// library with the same operators and no dependency on Python.
#ifndef CUTLASS_NN_NO_PYTHON
#define CUTLASS_NN_PYTHON_MODULE 1
#endif

#ifdef CUTLASS_NN_PYTHON_MODULE
#include <Python.h>
#endif
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "autograd/main_grad_registry.h"
#include "autograd/wgrad_accumulation.h"
#include "op_checks.h"

#ifdef CUTLASS_NN_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/device_info.h"
#include "cuda/fp8_cuda.h"
#include "cuda/gemm_autotune.h"
#include "cuda/gemm_binding.h"
#endif

#ifndef CUTLASS_NN_FLAVOR
#define CUTLASS_NN_FLAVOR "cpu"
#endif
#ifndef CUTLASS_NN_CUDA_ARCHS
#define CUTLASS_NN_CUDA_ARCHS ""
#endif
#ifndef CUTLASS_NN_CUTLASS_VERSION
#define CUTLASS_NN_CUTLASS_VERSION ""
#endif
#ifndef CUTLASS_NN_KERNEL_SET
#define CUTLASS_NN_KERNEL_SET ""  // the CPU flavor has no GEMM kernels
#endif
#ifndef CUTLASS_NN_TORCH_VERSION
#define CUTLASS_NN_TORCH_VERSION ""
#endif

#ifdef CUTLASS_NN_PYTHON_MODULE
extern "C" {
// Importing cutlass_nn._C from Python only needs to load this shared library: loading it runs
// the static TORCH_LIBRARY registrations below. The module itself is empty, and built against
// Python's limited API so one binary serves every CPython >= 3.10.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
#endif  // CUTLASS_NN_PYTHON_MODULE

namespace cutlass_nn {

// What this binary was built with, as "key=value" lines (read by `python -m cutlass_nn.info`).
static std::string build_info() {
  return std::string("flavor=") + CUTLASS_NN_FLAVOR + "\ncuda_archs=" + CUTLASS_NN_CUDA_ARCHS +
         "\ncutlass_version=" + CUTLASS_NN_CUTLASS_VERSION +
         "\ntorch_version=" + CUTLASS_NN_TORCH_VERSION +
         "\nkernel_set=" + CUTLASS_NN_KERNEL_SET + "\n";
}

// Whether the backward pass running on this thread keeps its graph (retain_graph / create_graph:
// a later backward may read the saved tensors again). Python backward formulas that would
// otherwise overwrite a saved tensor in place (cutlass_nn/linear_cross_entropy.py) ask it;
// outside a backward pass it answers true (the safe answer).
static bool autograd_keeps_graph() {
  return torch::autograd::get_current_graph_task_keep_graph();
}

// Test / debugging hooks of the CUDA flavor (no-ops in the CPU flavor): force the CUTLASS 2.x
// (SM80) kernels on Hopper, and name the GEMM kernel the last call on this thread ran.
static bool set_force_sm80(bool enable) {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::set_force_sm80(enable);
#else
  (void)enable;
  return false;
#endif
}

// Programmatic dependent launch of the SM90 GEMMs (csrc/kernels/launch_settings.h; initially on
// unless CUTLASS_NN_PDL=0); returns the previous setting (false in the CPU flavor, which has no
// such launches).
static bool set_programmatic_launch(bool enable) {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::set_programmatic_launch(enable);
#else
  (void)enable;
  return false;
#endif
}

// The current setting, read without changing it (a set-and-restore would let another thread's
// launch in between see the wrong value).
static bool programmatic_launch_enabled() {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::programmatic_launch_enabled();
#else
  return false;
#endif
}

// Force one SM90 tile configuration (index into gemm_configs(), -1 = the per-shape rule), a
// tile-scheduler swizzle and a split-K factor for the stream-K configurations (0 = the rule's
// choice); returns the previous [config, swizzle, splits]. For the benchmark's configuration
// sweep and the dispatch tests.
static std::vector<int64_t> set_gemm_config(int64_t config, int64_t swizzle, int64_t splits) {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::set_gemm_config(config, swizzle, splits);
#else
  (void)config;
  (void)swizzle;
  (void)splits;
  return {-1, 0, 0};
#endif
}

// Whether a plain product (beta = 0, no bias) may run on a GEMM kernel without a C operand where
// its configuration has one (the default); returns the previous setting (true in the CPU flavor,
// which has no such kernels and ignores it). For A/B timing and the dispatch tests.
static bool set_epilogue_without_c(bool enabled) {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::set_epilogue_without_c(enabled);
#else
  (void)enabled;
  return true;
#endif
}

// Names of the SM90 tile configurations, one per line, in index order ("" in the CPU flavor).
static std::string gemm_configs() {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::gemm_config_names();
#else
  return "";
#endif
}

// Force one FP8 tile configuration (index into fp8_configs(), -1 = the per-shape rule); returns
// the previous one. For the FP8 kernel tests and the benchmark.
static int64_t set_fp8_config(int64_t config) {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::set_fp8_config(config);
#else
  TORCH_CHECK(config >= -1, "cutlass_nn._set_fp8_config: argument 'config' must be >= -1, got ",
              std::to_string(config));
  return -1;
#endif
}

// Force one rasterization swizzle of the FP8 kernels (1, 2, 4, 8; 0 = the rule's); returns the
// previous one. For the FP8 kernel tests and the benchmark's sweep.
static int64_t set_fp8_swizzle(int64_t swizzle) {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::set_fp8_swizzle(swizzle);
#else
  TORCH_CHECK(swizzle == 0 || swizzle == 1 || swizzle == 2 || swizzle == 4 || swizzle == 8,
              "cutlass_nn._set_fp8_swizzle: argument 'swizzle' must be 0 (the rule's), 1, 2, 4 "
              "or 8, got ", std::to_string(swizzle));
  return 0;
#endif
}

// Names of the FP8 tile configurations, one per line, in index order ("" in the CPU flavor).
static std::string fp8_configs() {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::fp8_config_names();
#else
  return "";
#endif
}

// The peak DRAM bandwidth (GB/s) the GEMM rule sees for CUDA device `device` (0: unknown; always
// 0 in the CPU flavor). Tests use it to expect the rule's device-dependent choices.
static int64_t device_memory_gbps(int64_t device) {
#ifdef CUTLASS_NN_WITH_CUDA
  int count = 0;
  const bool listed = cudaGetDeviceCount(&count) == cudaSuccess;
  if (!listed) (void)cudaGetLastError();
  TORCH_CHECK(listed && device >= 0 && device < count,
              "cutlass_nn._device_memory_gbps: argument 'device' must be a CUDA device index in "
              "[0, ", std::to_string(listed ? count : 0), "), got ", std::to_string(device));
  return cuda::device_info(static_cast<int>(device)).memory_gbps;
#else
  TORCH_CHECK(false, "cutlass_nn._device_memory_gbps: needs the CUDA flavor (this build is the CPU "
              "flavor), got device ", std::to_string(device));
  return 0;
#endif
}

static std::string last_kernel_name() {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::last_kernel_name();
#else
  return "";
#endif
}

// The autotune table of the CUDA flavor (csrc/cuda/gemm_autotune.h; cutlass_nn/autotune.py is the
// public front). The CPU flavor has no table: the mode stays off and no entry is kept.
// mode: 1 = first-call tuning on, 0 = off, -1 = leave as is; returns the previous mode.
static int64_t autotune_mode(int64_t mode) {
  TORCH_CHECK(mode >= -1 && mode <= 1,
              "cutlass_nn._autotune_mode: argument 'mode' must be -1 (query), 0 (off) or 1 (on), "
              "got ", std::to_string(mode));
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::set_autotune_mode(static_cast<int>(mode)) ? 1 : 0;
#else
  return 0;
#endif
}

static std::tuple<std::vector<int64_t>, std::vector<double>, std::vector<std::string>>
autotune_entries() {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::autotune_entries();
#else
  return {};
#endif
}

static void autotune_add_entries(const std::vector<int64_t>& ints,
                                 const std::vector<double>& floats) {
#ifdef CUTLASS_NN_WITH_CUDA
  cuda::add_autotune_entries(ints, floats);
#else
  (void)ints;
  (void)floats;
#endif
}

// The switch of fused weight-gradient accumulation (csrc/autograd/wgrad_accumulation.h):
// mode 1 = on, 0 = off, -1 = leave as is; returns the previous state.
static bool fused_wgrad_accumulation_mode(int64_t mode) {
  TORCH_CHECK(mode >= -1 && mode <= 1,
              "cutlass_nn._fused_wgrad_accumulation: argument 'mode' must be -1 (query), 0 (off) "
              "or 1 (on), got ", std::to_string(mode));
  if (mode == -1) return fused_wgrad_accumulation_flag();
  return set_fused_wgrad_accumulation_flag(mode == 1);
}

// The main-gradient registry (csrc/autograd/main_grad_registry.h) behind
// cutlass_nn.attach_main_grads / detach_main_grads.
static void set_main_grad_op(const at::Tensor& weight, const std::optional<at::Tensor>& buffer) {
  if (buffer.has_value() && buffer->defined()) check_main_grad_args(weight, *buffer);
  set_main_grad(weight, buffer.has_value() ? *buffer : at::Tensor());
}

static std::optional<at::Tensor> main_grad_op(const at::Tensor& weight) {
  at::Tensor buffer = main_grad_of(weight);
  if (!buffer.defined()) return std::nullopt;
  return buffer;
}

static int64_t autotune_clear() {
#ifdef CUTLASS_NN_WITH_CUDA
  return cuda::clear_autotune_entries();
#else
  return 0;
#endif
}

TORCH_LIBRARY(cutlass_nn, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};

  // y = input @ weight.T + bias; input [*, in], weight [out, in], bias [out] -> y [*, out]
  m.def("linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor", tags);
  // The backward GEMMs take their gradient (and saved input) contiguous from torch.compile:
  // under Inductor's default for custom operators (the traced strides exactly) a compiled BERT
  // step handed them gradients whose leading dimensions do not flatten, which each of the three
  // operators then copied with a strided ATen copy (6 copies, 0.19 ms of a 7.9 ms step; H100,
  // benchmarks/NOTES.md v0.22). With this tag Inductor writes the producing kernel's output
  // contiguous instead (no copy in the measured step).
  const std::vector<at::Tag> contiguous_tags{at::Tag::pt2_compliant_tag,
                                             at::Tag::needs_contiguous_strides};
  // grad_input = grad_output @ weight; [*, out] x [out, in] -> [*, in]
  m.def("linear_dgrad(Tensor grad_output, Tensor weight) -> Tensor", contiguous_tags);
  // grad_weight = grad_output^T @ input over all leading dims; -> [out, in]
  m.def("linear_wgrad(Tensor grad_output, Tensor input) -> Tensor", contiguous_tags);
  // grad_weight += grad_output^T @ input, in place (grad_weight may be float32 for 16-bit inputs)
  m.def(
      "linear_wgrad_accumulate_(Tensor(a!) grad_weight, Tensor grad_output, Tensor input) -> ()",
      tags);
  // grad_bias = grad_output summed over all leading dims; [*, out] -> [out]
  m.def("bias_grad(Tensor grad_output) -> Tensor", contiguous_tags);
  // torch.mm equivalents
  m.def("mm(Tensor a, Tensor b) -> Tensor", tags);
  // mm.out returns nothing: AOTAutograd cannot functionalize a custom op whose output aliases an
  // input; the Python wrapper (cutlass_nn.mm(..., out=)) returns `out` itself.
  m.def("mm.out(Tensor a, Tensor b, *, Tensor(a!) out) -> ()", tags);
  // elementwise a + b for same-shape tensors
  m.def("add2(Tensor a, Tensor b) -> Tensor", tags);
  // x *= factor in place (x contiguous; factor a 0-dim float32 tensor, float64 for float64 x),
  // computed in the factor's dtype and rounded once. The factor is read where it lives, so a
  // gradient can be scaled by a device value without a host synchronization; on CUDA a factor of
  // exactly 1 leaves x untouched without a pass over it (the fused head's backward scales its
  // saved gradients by the incoming gradient, which is 1 after a plain loss.backward()).
  m.def("scale_(Tensor(a!) x, Tensor factor) -> ()", tags);

  // Linear layer with a fused activation: out = act(input @ weight.T + bias), act one of
  // "none", "relu", "gelu", "gelu_tanh" (torch.nn.functional.gelu approximate="none" / "tanh").
  m.def("linear_act(Tensor input, Tensor weight, Tensor? bias, str activation) -> Tensor", tags);
  // The same, also returning the pre-activation z = input @ weight.T + bias that the backward
  // needs: (out, z). The autograd path of cutlass_nn.functional.linear(activation=...) uses it.
  m.def(
      "linear_act_aux(Tensor input, Tensor weight, Tensor? bias, str activation) -> "
      "(Tensor, Tensor)",
      tags);
  // grad_preact = grad_output * act'(preact); with bias_grad, also its sum over all leading dims
  // (the bias gradient) from the same pass, else an empty [0] tensor: -> (grad_preact, grad_bias)
  m.def(
      "activation_grad(Tensor grad_output, Tensor preact, str activation, bool bias_grad) -> "
      "(Tensor, Tensor)",
      tags);

  // RMSNorm over the last dim with float statistics: (out, rstd), out = h * rstd * weight with
  // h = input and rstd = 1 / sqrt(mean(h^2) + eps) ([*], float32; float64 for float64 input).
  // weight has input's dtype, or float32 beside 16-bit input.
  m.def("rms_norm(Tensor input, Tensor weight, float eps) -> (Tensor, Tensor)", tags);
  // The same of h = x + residual (the residual stream of a pre-norm transformer block):
  // (out, h, rstd), h being the new residual. (x, not input: the name of
  // cutlass_nn.add_rms_norm's argument, which the errors name.)
  m.def(
      "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> "
      "(Tensor, Tensor, Tensor)",
      tags);
  // Their backward: (grad_h, grad_weight) for output gradient grad_output plus grad_h (the
  // gradient reaching h from elsewhere, or None); grad_weight is an empty [0] tensor unless
  // weight_grad.
  m.def(
      "rms_norm_backward(Tensor grad_output, Tensor? grad_h, Tensor h, Tensor weight, "
      "Tensor rstd, bool weight_grad) -> (Tensor, Tensor)",
      tags);

  // Gated activation of a gate+up projection output: gate_up [*, 2n] holds the gate in its
  // first n columns and the up projection in its last n; out [*, n] = act(gate) * up, computed
  // in float (double for float64) and rounded once. activation: "silu", "gelu", "gelu_tanh".
  m.def("gated_act(Tensor gate_up, str activation) -> Tensor", tags);
  // Its backward for output gradient grad_output [*, n]: (grad_gate_up [*, 2n], out [*, n]),
  // out being the recomputed forward (the gated MLP's backward needs it for the down
  // projection's weight gradient instead of keeping it from the forward).
  m.def(
      "gated_act_backward(Tensor grad_output, Tensor gate_up, str activation) -> "
      "(Tensor, Tensor)",
      tags);
  // The same, writing grad_gate_up over gate_up (contiguous) and returning out: the gated MLP's
  // backward uses it on its own saved gate+up output when no second backward can read that.
  m.def("gated_act_backward_(Tensor grad_output, Tensor(a!) gate_up, str activation) -> Tensor",
        tags);
  // Cross-entropy of each row of logits [rows, vocab] (contiguous) against target [rows]
  // (int64): (loss, lse), both [rows] in float32 (float64 for float64 logits). loss is
  // lse - (1 - label_smoothing) * z_target - label_smoothing / vocab * sum(z), 0 where target ==
  // ignore_index, NaN where the target is out of range; lse the row's log-sum-exp. With
  // write_grad, the row is overwritten with d loss / d z times row_scale (1 when None): 0 for
  // ignored rows. The fused language-model head runs it on each chunk of its logits.
  m.def(
      "cross_entropy_rows_(Tensor(a!) logits, Tensor target, Tensor? row_scale, "
      "int ignore_index, float label_smoothing, bool write_grad) -> (Tensor, Tensor)",
      tags);
  // Gated MLP: down(act(gate(x)) * up(x)) with gate, up [n, in] and down [out, n] (biases
  // optional; gate_bias and up_bias both or neither). The gate and up projections run as one
  // GEMM (zero-copy when up_weight directly follows gate_weight in one storage, as
  // cutlass_nn.GatedMLP lays them out); its autograd keeps only input and the gate+up output.
  m.def(
      "gated_mlp(Tensor input, Tensor gate_weight, Tensor up_weight, Tensor down_weight, "
      "Tensor? gate_bias=None, Tensor? up_bias=None, Tensor? down_bias=None, "
      "str activation=\"silu\") -> Tensor",
      tags);

  // Internal (gated_mlp's; no autograd): its gate+up GEMM and that GEMM's input gradient, with
  // the two weights as arguments: linear(input, [gate_weight; up_weight], [gate_bias; up_bias])
  // -> [*, 2n] and linear_dgrad(grad_gate_up, [gate_weight; up_weight]) -> [*, in]. One GEMM
  // over the weights' own storage where up_weight directly follows gate_weight (GatedMLP's
  // layout), else over their concatenation. gated_mlp's forward and backward call them so that
  // a graph traced through gated_mlp (torch.compile) holds these calls, which see the real,
  // adjacent weights when they run, instead of a recorded concatenation (a copy of both weights
  // per layer, kept for the backward: 0.17 ms of a compiled Llama step at hidden 4096 on an H200,
  // benchmarks/NOTES.md v0.33).
  m.def(
      "_gate_up_linear(Tensor input, Tensor gate_weight, Tensor up_weight, "
      "Tensor? gate_bias=None, Tensor? up_bias=None) -> Tensor",
      tags);
  m.def("_gate_up_dgrad(Tensor grad_gate_up, Tensor gate_weight, Tensor up_weight) -> Tensor",
        contiguous_tags);
  // Internal (gated_mlp's autocast kernel): gate [n, in] and up [n, in] cast to `dtype` into the
  // two halves of one new [2n, in] buffer, differentiable (each half's gradient goes back to its
  // weight in the weight's dtype). Autocast passes the halves to gated_mlp, which then reads them
  // as one GEMM operand; an operator of its own so that in a traced graph the halves stay views
  // of one buffer (cast separately, or concatenated with aten ops that Inductor splits again,
  // they reached _gate_up_linear and _gate_up_dgrad as two buffers, each then concatenated).
  m.def("_pack_gate_up(Tensor gate, Tensor up, ScalarType dtype) -> Tensor", tags);

  // Rotary position embedding of queries and keys, the "rotate half" form of transformers'
  // apply_rotary_pos_emb (unsqueeze_dim=1): q [B, Hq, S, D], k [B, Hk, S, D], cos and sin
  // [B or 1, S, D] of q's dtype -> (q * cos + rotate_half(q) * sin, the same of k) with
  // rotate_half(x) = [-x2, x1] (the halves of D), computed in float (double for float64) and
  // rounded once. Each output keeps its input's strides when that is dense with a unit-stride
  // last dim (csrc/rotary_layout.h), else it is contiguous.
  m.def("rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)", tags);
  // Its backward for the output gradients: the transposed rotation, (g * cos + [g2 * s2, -g1 *
  // s1]) for each; exact for any cos and sin. cos and sin get no gradient here.
  m.def(
      "rotary_embedding_backward(Tensor grad_q, Tensor grad_k, Tensor cos, Tensor sin) -> "
      "(Tensor, Tensor)",
      tags);

  // FP8 GEMM with dequantization scales: out = (a * a_scale) @ (b * b_scale) (+ bias), a [M, K]
  // and b [K, N] float8 (float8_e4m3fn / float8_e5m2), a_scale float32 [] / [1] (one value) or
  // [M, 1] (per row of a), b_scale [] / [1] or [1, N] (per column of b), float32 accumulation,
  // one rounding to out_dtype (bfloat16, float16 or float32; bias of out_dtype). On Hopper, SM90
  // FP8 kernels (the scales and bias applied in the epilogue) for e4m3 or e5m2 a and e4m3 b with
  // K a multiple of 16; use_fast_accum lets the forward kernel skip promoting the tensor cores'
  // partial sums (faster, less accurate over a long K). Elsewhere the same arithmetic in ATen.
  m.def(
      "fp8_scaled_mm(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, Tensor? bias, "
      "ScalarType out_dtype, bool use_fast_accum) -> Tensor",
      tags);
  // Dynamic FP8 quantization of a 2-d float16 / bfloat16 / float32 x: (data, scale) with
  // x ~= data.float() * scale, the scale from the absolute maximum over the tensor ("tensor":
  // scale []), each row ("row": [R, 1]) or each column ("column": [1, C]) mapped onto the
  // format's largest value (format "e4m3" or "e5m2"); with transpose, data is x^T's ([C, R],
  // contiguous) and the scale transposed alike. Bitwise cutlass_nn.fp8_reference's
  // quantize_unchecked (two passes over x on CUDA: the maximum, then the scaled cast).
  m.def("fp8_quantize(Tensor x, str format, str axis, bool transpose) -> (Tensor, Tensor)", tags);
  // One quantization in both layouts: (data [R, C], data_t [C, R], scale) = fp8_quantize's
  // data with transpose false and true (bitwise), scale as with transpose false; on CUDA one
  // maximum pass and one cast pass writing both (the output gradient of an FP8 layer, which the
  // data gradient reads by rows and the weight gradient by columns).
  m.def("fp8_quantize_both(Tensor x, str format, str axis) -> (Tensor, Tensor, Tensor)", tags);
  // x cast with known dequantization scales (one value, [R, 1] or [1, C], e.g. those an earlier
  // fp8_quantize of the same tensor returned): data = cast(clamp(x * (1 / scale))), optionally
  // transposed; no maximum pass. Bitwise cutlass_nn.fp8_reference.cast_with_scale.
  m.def("fp8_cast(Tensor x, Tensor scale, str format, bool transpose) -> Tensor", tags);

  m.def("build_info() -> str", &build_info);
  m.def("_autograd_keeps_graph() -> bool", &autograd_keeps_graph);
  m.def("_set_force_sm80(bool enable) -> bool", &set_force_sm80);
  m.def("_set_programmatic_launch(bool enable) -> bool", &set_programmatic_launch);
  m.def("_programmatic_launch_enabled() -> bool", &programmatic_launch_enabled);
  m.def("_last_kernel_name() -> str", &last_kernel_name);
  m.def("_device_memory_gbps(int device) -> int", &device_memory_gbps);
  m.def("_set_gemm_config(int config, int swizzle, int splits=0) -> int[]", &set_gemm_config);
  m.def("_set_epilogue_without_c(bool enabled) -> bool", &set_epilogue_without_c);
  m.def("_gemm_configs() -> str", &gemm_configs);
  m.def("_set_fp8_config(int config) -> int", &set_fp8_config);
  m.def("_set_fp8_swizzle(int swizzle) -> int", &set_fp8_swizzle);
  m.def("_fp8_configs() -> str", &fp8_configs);
  m.def("_autotune_mode(int mode) -> int", &autotune_mode);
  m.def("_autotune_entries() -> (int[], float[], str[])", &autotune_entries);
  m.def("_autotune_add_entries(int[] ints, float[] floats) -> ()", &autotune_add_entries);
  m.def("_autotune_clear() -> int", &autotune_clear);
  m.def("_fused_wgrad_accumulation(int mode) -> bool", &fused_wgrad_accumulation_mode);
  m.def("_set_main_grad(Tensor weight, Tensor? buffer) -> ()", &set_main_grad_op);
  m.def("_main_grad(Tensor weight) -> Tensor?", &main_grad_op);
}

}  // namespace cutlass_nn
