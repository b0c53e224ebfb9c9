"""The ``torch.ops.cutlass_nn`` operators, as typed Python functions, with their fake (meta)
implementations for ``torch.compile``.

Everything else lives in C++ beside the kernels: the backward formulas (``csrc/autograd/``,
one ``torch::autograd::Function`` per operator whose backward calls other cutlass_nn operators,
so gradients -- and double backward -- run on cutlass_nn's kernels, from Python and LibTorch
alike) and the autocast policy (``csrc/autocast/``: under ``torch.autocast``, ``linear``,
``linear_act``, ``linear_act_aux`` and ``mm`` cast floating inputs other than float64 to the
autocast dtype, as ``nn.Linear`` and ``torch.mm`` do). A wrapper here is one operator call.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Iterator

import torch
from torch import Tensor

from cutlass_nn import _checks
from cutlass_nn import _extension
from cutlass_nn import _inductor_lowerings

_ops = torch.ops.cutlass_nn
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: The activation names of ``linear_act``, ``linear_act_aux`` and ``activation_grad``:
#: identity, ``F.relu``, ``F.gelu(approximate="none")``, ``F.gelu(approximate="tanh")``.
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh")


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias`` on cutlass_nn kernels; input [*, in], weight [out, in].
    Follows ``torch.autocast`` like ``nn.Linear``."""
    return _ops.linear.default(input, weight, bias)


def linear_dgrad(grad_output: Tensor, weight: Tensor) -> Tensor:
    """``grad_output @ weight``: the input gradient of linear; [*, out] -> [*, in]."""
    return _ops.linear_dgrad.default(grad_output, weight)


def linear_wgrad(grad_output: Tensor, input: Tensor) -> Tensor:
    """``grad_output^T @ input`` over all leading dims: the weight gradient of linear."""
    return _ops.linear_wgrad.default(grad_output, input)


def linear_wgrad_accumulate_(grad_weight: Tensor, grad_output: Tensor, input: Tensor) -> None:
    """``grad_weight += grad_output^T @ input`` in place; ``grad_weight`` may be float32 while
    the inputs are 16-bit (an fp32 main gradient)."""
    _ops.linear_wgrad_accumulate_.default(grad_weight, grad_output, input)


def bias_grad(grad_output: Tensor) -> Tensor:
    """``grad_output`` summed over every leading dim: the bias gradient of linear; -> [out]."""
    try:
        return _ops.bias_grad.default(grad_output)
    except Exception:  # None reaches the operator as no tensor at all: name the argument
        _checks.check_tensors("bias_grad", {"grad_output": grad_output})
        raise


def mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for 2-D tensors, like ``torch.mm`` (autocast included)."""
    return _ops.mm.default(a, b)


def mm_out(a: Tensor, b: Tensor, out: Tensor) -> Tensor:
    """``torch.mm(a, b, out=out)`` semantics: ``out`` is resized if needed (with torch's
    warning when it had elements) and returned."""
    return _mm_out(a, b, out, stacklevel=3)


def _mm_out(a: Tensor, b: Tensor, out: Tensor, *, stacklevel: int) -> Tensor:
    """``mm_out``; ``stacklevel`` (of the resize warning, counted from here) names the user's
    frame: 3 from ``mm_out`` and from ``cutlass_nn.functional.mm``."""
    old_shape = tuple(out.shape)
    had_elements = out.numel() > 0
    _ops.mm.out(a, b, out=out)
    if had_elements and tuple(out.shape) != old_shape:
        warnings.warn(
            f"cutlass_nn.mm: an output with one or more elements was resized since it had shape "
            f"{list(old_shape)}, which does not match the required output shape "
            f"{list(out.shape)}. As with torch.mm, reuse an out tensor by resizing it to zero "
            "elements first (t.resize_(0)).",
            UserWarning,
            stacklevel=stacklevel,
        )
    return out


def add2(a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` for tensors of the same shape, dtype and device."""
    return _ops.add2.default(a, b)


def scale_(x: Tensor, factor: Tensor) -> None:
    """``x *= factor`` in place: ``x`` contiguous, ``factor`` a 0-dim float32 tensor (float64 for
    float64 ``x``) on ``x``'s device; the product is formed in float and rounded once. The
    factor is read on the device, so scaling by a value the host does not know needs no
    synchronization, and on CUDA a factor of exactly 1 costs one launch and no pass over ``x``
    (what the fused head's backward relies on after a plain ``loss.backward()``)."""
    _ops.scale_.default(x, factor)


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype when autocast is on for ``device_type``, else None; also None for
    meta tensors, whose device type autocast does not know (torch.is_autocast_enabled raises).
    Not torch.amp.is_autocast_available: Dynamo cannot trace it (torch 2.11 breaks the graph
    there, and fullgraph compilation fails), while it traces is_autocast_enabled."""
    if device_type != "meta" and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _activation_message(op: str, activation) -> str:
    """The message of csrc/op_checks.cpp's parse_activation."""
    allowed = ", ".join(f'"{a}"' for a in ACTIVATIONS)
    given = f'"{activation}"' if isinstance(activation, str) else repr(activation)
    return f"cutlass_nn.{op}: argument 'activation' must be one of {allowed}, got {given}"


def _check_activation_type(op: str, activation) -> None:
    # A non-string would otherwise fail in the dispatcher's argument parsing with a message that
    # does not name the argument; the values themselves are checked by the operators.
    if not isinstance(activation, str):
        raise RuntimeError(_activation_message(op, activation))


def linear_act(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none"
) -> Tensor:
    """``act(input @ weight.T + bias)`` with ``act`` one of :data:`ACTIVATIONS`; the bias add and
    the activation are computed in float (float64 for float64) from the GEMM's accumulator --
    on the GPU in the GEMM epilogue where the kernel fuses it -- and rounded once. Follows
    ``torch.autocast`` like ``linear``. Its backward recomputes the pre-activation; a forward
    that is to be differentiated should call :func:`linear_act_aux` (as
    ``cutlass_nn.functional.linear`` does)."""
    _check_activation_type("linear_act", activation)
    return _ops.linear_act.default(input, weight, bias, activation)


def linear_act_aux(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none"
) -> tuple[Tensor, Tensor]:
    """``(act(z), z)`` with the pre-activation ``z = input @ weight.T + bias``, both rounded once
    from the fp32 (float64) epilogue; ``z`` is what the backward needs. Follows
    ``torch.autocast`` like ``linear``."""
    _check_activation_type("linear_act_aux", activation)
    return _ops.linear_act_aux.default(input, weight, bias, activation)


def activation_grad(
    grad_output: Tensor, preact: Tensor, activation: str, bias_grad: bool = False
) -> tuple[Tensor, Tensor]:
    """``grad_preact = grad_output * act'(preact)`` (computed in float, float64 for float64,
    rounded once) and, with ``bias_grad``, its sum over all leading dims from the same pass
    (deterministic), else an empty ``[0]`` tensor: ``(grad_preact, grad_bias)``.

    Differentiable twice over: its own backward is ``activation_grad`` again for
    ``grad_output`` and, for ``preact``, ``G * grad_output * act''(preact)`` written with torch
    elementwise ops (second-order gradients only)."""
    _check_activation_type("activation_grad", activation)
    return _ops.activation_grad.default(grad_output, preact, activation, bias_grad)


def rms_norm(input: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """RMSNorm over the last dim: ``(out, rstd)`` with ``rstd = 1 / sqrt(mean(input^2, -1) +
    eps)`` in float32 (float64 for float64 input) and ``out = input * rstd * weight`` rounded
    once to ``input``'s dtype. ``weight`` ``[features]`` has ``input``'s dtype, or float32
    beside 16-bit ``input``. Differentiable in ``input`` and ``weight``."""
    return _ops.rms_norm.default(input, weight, eps)


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`rms_norm` of ``h = x + residual`` (rounded to the dtype, as the unfused add
    is) in one pass: ``(out, h, rstd)``; ``h`` is the new residual stream."""
    return _ops.add_rms_norm.default(x, residual, weight, eps)


def rms_norm_backward(
    grad_output: Tensor,
    grad_h: Tensor | None,
    h: Tensor,
    weight: Tensor,
    rstd: Tensor,
    weight_grad: bool = True,
) -> tuple[Tensor, Tensor]:
    """The backward of :func:`rms_norm` / :func:`add_rms_norm` at ``h`` (their input, or the sum
    they formed) with their ``rstd``: ``(grad_h, grad_weight)``; ``grad_h`` includes the
    incoming gradient ``grad_h`` of ``h`` itself (None: none). ``grad_weight`` (in ``weight``'s
    dtype, summed in float in a fixed order) is an empty ``[0]`` tensor unless
    ``weight_grad``. Not differentiable itself."""
    return _ops.rms_norm_backward.default(grad_output, grad_h, h, weight, rstd, weight_grad)


#: The activation names of the gated operators (``gated_act``, ``gated_act_backward``,
#: ``gated_mlp``): ``F.silu``, ``F.gelu(approximate="none")``, ``F.gelu(approximate="tanh")``.
GATED_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def gated_act(gate_up: Tensor, activation: str = "silu") -> Tensor:
    """``act(gate) * up`` for ``gate_up = [gate | up]`` of shape ``[*, 2n]`` (gate in the first
    ``n`` columns): ``[*, n]``, computed in float (double for float64) and rounded once.
    ``activation`` is one of :data:`GATED_ACTIVATIONS`. Differentiable in ``gate_up``."""
    return _ops.gated_act.default(gate_up, activation)


def gated_act_backward(
    grad_output: Tensor, gate_up: Tensor, activation: str = "silu"
) -> tuple[Tensor, Tensor]:
    """The backward of :func:`gated_act`: ``(grad_gate_up, out)`` with ``out`` the recomputed
    forward, from one pass over ``grad_output`` and ``gate_up``. Not differentiable itself."""
    return _ops.gated_act_backward.default(grad_output, gate_up, activation)


def gated_act_backward_(grad_output: Tensor, gate_up: Tensor, activation: str = "silu") -> Tensor:
    """:func:`gated_act_backward` writing ``grad_gate_up`` over ``gate_up`` (which must be
    contiguous and not share memory with ``grad_output``); returns ``out``. What the gated
    MLP's backward runs on its own saved gate+up output when the graph is not kept."""
    return _ops.gated_act_backward_.default(grad_output, gate_up, activation)


def rotary_embedding(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Rotary position embedding of queries ``q`` ``[B, Hq, S, D]`` and keys ``k``
    ``[B, Hk, S, D]`` by ``cos`` and ``sin`` ``[B or 1, S, D]`` (all of one dtype and device):
    ``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)``, ``rotate_half(x) =
    [-x2, x1]`` over the halves of ``D`` -- the form of ``transformers``' ``apply_rotary_pos_emb``
    with ``unsqueeze_dim=1``. Computed in float (double for float64) and rounded once, in one
    pass over both. Each output keeps its input's strides when the input is dense with a
    unit-stride last dim (else it is contiguous). Differentiable in all four arguments."""
    return _ops.rotary_embedding.default(q, k, cos, sin)


def rotary_embedding_backward(
    grad_q: Tensor, grad_k: Tensor, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor]:
    """The backward of :func:`rotary_embedding` for the output gradients: the transposed
    rotation ``g * cos + [g2 * s2, -(g1 * s1)]`` of each, in one pass. Not differentiable
    itself; gives no gradients of ``cos`` and ``sin``."""
    return _ops.rotary_embedding_backward.default(grad_q, grad_k, cos, sin)


def cross_entropy_rows_(
    logits: Tensor,
    target: Tensor,
    row_scale: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    write_grad: bool = True,
) -> tuple[Tensor, Tensor]:
    """Cross-entropy of each row of ``logits`` ``[rows, vocab]`` (contiguous) against
    ``target`` ``[rows]`` (int64): ``(loss, lse)``, both ``[rows]`` in float32 (float64 for
    float64 logits), ``lse`` being each row's log-sum-exp. ``loss`` follows
    ``F.cross_entropy(..., reduction="none", label_smoothing=...)``: 0 where ``target ==
    ignore_index``; NaN where the target is outside ``[0, vocab)``. With ``write_grad``, each
    row is overwritten in place with ``d loss / d logits`` times ``row_scale`` (``[rows]`` in
    the statistics dtype; 1 when None), in float and rounded once: zeros for ignored rows, NaN
    for out-of-range ones. One read for the statistics, one read and one write for the
    gradient. The building block of :func:`cutlass_nn.functional.linear_cross_entropy`; not
    differentiable itself."""
    op = "cross_entropy_rows_"
    _checks.check_bool(op, "write_grad", write_grad)
    return _ops.cross_entropy_rows_.default(
        logits, target, row_scale,
        _checks.check_int(op, "ignore_index", ignore_index, _checks.INT64_MIN, _checks.INT64_MAX,
                          expected=_checks.INT64_TEXT),
        _checks.check_real(op, "label_smoothing", label_smoothing), write_grad,
    )


def gated_mlp(
    input: Tensor,
    gate_weight: Tensor,
    up_weight: Tensor,
    down_weight: Tensor,
    gate_bias: Tensor | None = None,
    up_bias: Tensor | None = None,
    down_bias: Tensor | None = None,
    activation: str = "silu",
) -> Tensor:
    """The gated MLP ``down(act(gate(input)) * up(input))`` as one operator: ``gate_weight`` and
    ``up_weight`` ``[n, in]``, ``down_weight`` ``[out, n]``; biases optional (``gate_bias`` and
    ``up_bias`` both or neither). The gate and up projections run as one GEMM -- without a copy
    of the weights when ``up_weight`` directly follows ``gate_weight`` in one storage (the
    layout :class:`cutlass_nn.GatedMLP` keeps) -- and the backward keeps only ``input`` and the
    gate+up output, recomputing the rest. Differentiable in every tensor argument."""
    return _ops.gated_mlp.default(
        input, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias, activation
    )


def fp8_scaled_mm(
    a: Tensor,
    b: Tensor,
    a_scale: Tensor,
    b_scale: Tensor,
    bias: Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
) -> Tensor:
    """``(a * a_scale) @ (b * b_scale) (+ bias)`` for float8 ``a`` ``[M, K]`` and ``b``
    ``[K, N]`` (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``): ``a_scale`` float32 ``[]`` /
    ``[1]`` (one value) or ``[M, 1]`` (one per row of ``a``), ``b_scale`` ``[]`` / ``[1]`` or
    ``[1, N]`` (one per column of ``b``) -- the dequantization factors of
    :func:`cutlass_nn.fp8_reference.quantize` --, float32 accumulation, one rounding to
    ``out_dtype`` (bfloat16, float16 or float32); ``bias`` ``[N]`` of ``out_dtype``.

    On Hopper with an e4m3 or e5m2 ``a``, an e4m3 ``b``, ``K`` a multiple of 16 and ``N`` of 8
    (bfloat16 out) or 4 (float32 out), it runs cutlass_nn's SM90 FP8 kernels, which apply the
    scales and the bias in the epilogue and promote the tensor cores' partial sums to float32
    every 128-deep block of ``K``; ``b`` is read in place when column-major (``w.t()`` of a
    row-major ``[N, K]`` weight), else copied so. ``use_fast_accum`` lets the e4m3 x e4m3 ->
    bfloat16 kernel skip that promotion (faster, less accurate over a long ``K``). Every other
    case, and the CPU, computes the same arithmetic with ATen operations (the dequantized
    operands multiplied in float32). Not differentiable (float8 tensors carry no gradient)."""
    _checks.check_bool("fp8_scaled_mm", "use_fast_accum", use_fast_accum)
    return _ops.fp8_scaled_mm.default(a, b, a_scale, b_scale, bias, out_dtype, use_fast_accum)


def fp8_quantize(
    x: Tensor, format: str = "e4m3", axis: str = "tensor", transpose: bool = False
) -> tuple[Tensor, Tensor]:
    """Dynamic FP8 quantization of a 2-d float16 / bfloat16 / float32 ``x``: ``(data, scale)``
    with ``x ~= data.float() * scale``, ``format`` ``"e4m3"`` (``torch.float8_e4m3fn``) or
    ``"e5m2"``, one scale for the tensor (``axis="tensor"``: ``scale`` ``[]``), per row
    (``"row"``: ``[R, 1]``) or per column (``"column"``: ``[1, C]``), each from its slice's
    absolute maximum mapped onto the format's largest value. With ``transpose``, ``data`` is the
    quantized ``x^T`` (``[C, R]``, contiguous) and ``scale`` is transposed alike: the K-major
    operand a backward GEMM needs, written in the same pass as the cast. Bitwise
    :func:`cutlass_nn.fp8_reference.quantize_unchecked` (the CPU computes exactly that; CUDA
    runs two passes over ``x``: the maximum, then the scaled cast). No host synchronization; a
    non-finite element gives its slice a non-finite scale and NaN data. Not differentiable."""
    _checks.check_bool("fp8_quantize", "transpose", transpose)  # bool("no") would be True
    return _ops.fp8_quantize.default(x, format, axis, transpose)


def fp8_quantize_both(
    x: Tensor, format: str = "e4m3", axis: str = "tensor"
) -> tuple[Tensor, Tensor, Tensor]:
    """One :func:`fp8_quantize` of ``x`` in both layouts: ``(data, data_t, scale)`` where
    ``data`` (``[R, C]``) and ``data_t`` (``[C, R]``, contiguous) are bitwise the data of
    ``fp8_quantize(x, format, axis, transpose=False)`` and ``transpose=True``, and ``scale`` is
    the untransposed one (``[]``, ``[R, 1]`` or ``[1, C]``; ``scale.t()`` goes with ``data_t``).
    CUDA reads ``x`` twice (the maximum, then one cast writing both layouts) instead of four
    times for two calls: what an FP8 layer's backward needs of a tensorwise-scaled output
    gradient, which the data gradient reads by rows and the weight gradient by columns.
    Not differentiable."""
    return _ops.fp8_quantize_both.default(x, format, axis)


def fp8_cast(x: Tensor, scale: Tensor, format: str = "e4m3", transpose: bool = False) -> Tensor:
    """``x`` (2-d float16 / bfloat16 / float32) cast to FP8 with known dequantization scales:
    ``cast(clamp(x * (1 / scale)))``, ``scale`` float32 of shape ``[]`` / ``[1]`` (one value),
    ``[R, 1]`` (per row) or ``[1, C]`` (per column) on ``x``'s device, e.g. the scale an earlier
    :func:`fp8_quantize` of the same tensor returned; with ``transpose`` the data of ``x^T``
    (``[C, R]``, contiguous). One pass over ``x`` (no maximum). Bitwise
    :func:`cutlass_nn.fp8_reference.cast_with_scale`. Not differentiable."""
    _checks.check_bool("fp8_cast", "transpose", transpose)  # bool("False") would be True
    return _ops.fp8_cast.default(x, scale, format, transpose)


def fp8_configs() -> list[str]:
    """Names of the SM90 FP8 tile configurations, in index order (empty in the CPU flavor)."""
    return [n for n in _ops._fp8_configs.default().splitlines() if n]


@contextlib.contextmanager
def force_fp8_config(config: int, swizzle: int = 0) -> Iterator[None]:
    """Within the block, every FP8 GEMM whose kernel takes the problem runs tile configuration
    ``config`` (an index into :func:`fp8_configs`, or -1 for the per-shape rule; where that
    configuration has no kernel for the formats and output dtype, the ATen path runs) with the
    tile scheduler's rasterization ``swizzle`` (1, 2, 4 or 8; 0: the rule's for the rule's
    configuration, none for a forced one). For tests and benchmarks; process-wide."""
    previous_swizzle = _ops._set_fp8_swizzle.default(int(swizzle))
    try:
        previous = _ops._set_fp8_config.default(int(config))
    except Exception:
        _ops._set_fp8_swizzle.default(previous_swizzle)
        raise
    try:
        yield
    finally:
        _ops._set_fp8_config.default(previous)
        _ops._set_fp8_swizzle.default(previous_swizzle)


# ---------------------------------------------------------------------------------------------
# Fake implementations: output metadata for FakeTensor tracing (torch.compile, export). They
# repeat the shape checks of csrc/op_checks.cpp so that a traced program fails like eager does.
# ---------------------------------------------------------------------------------------------


def _check(cond, op: str, msg: str) -> None:
    torch._check(cond, lambda: f"cutlass_nn.{op}: {msg}")


def _dtype_name(dtype: torch.dtype) -> str:
    # "float32", not "torch.float32": the spelling of the C++ checks (csrc/validation.cpp)
    return str(dtype).removeprefix("torch.")


def _fake_common(op: str, ref_name: str, ref: Tensor, others: dict[str, Tensor]) -> None:
    # Every fake implementation passes here; Dynamo runs them while it traces, before Inductor
    # compiles the graph: the moment to give Inductor its lowerings (cheap once done).
    _inductor_lowerings.register()
    torch._check(
        ref.dtype in _FLOAT_DTYPES,
        lambda: f"cutlass_nn.{op}: argument '{ref_name}' must have a floating dtype "
        f"(float16, bfloat16, float32 or float64), got {_dtype_name(ref.dtype)}",
    )
    for name, t in others.items():
        torch._check(
            t.dtype == ref.dtype,
            lambda: f"cutlass_nn.{op}: argument '{name}' must have dtype "
            f"{_dtype_name(ref.dtype)} (the dtype of '{ref_name}'), got {_dtype_name(t.dtype)}",
        )
        _fake_same_device(op, name, t, ref_name, ref)


# The checks of csrc/validation.cpp, with its messages.


def _fake_dim(op: str, arg: str, t: Tensor, dim: int, what: str) -> None:
    _check(
        t.dim() == dim,
        op,
        f"argument '{arg}' must be a {dim}-D tensor {what}, got a {t.dim()}-D tensor of shape "
        f"{list(t.shape)}",
    )


def _fake_min_dim(op: str, arg: str, t: Tensor, dim: int, what: str) -> None:
    _check(
        t.dim() >= dim,
        op,
        f"argument '{arg}' must have at least {dim} dimension(s) {what}, got a {t.dim()}-D "
        f"tensor of shape {list(t.shape)}",
    )


def _fake_size(op: str, arg: str, t: Tensor, dim: int, expected, what: str) -> None:
    _check(
        t.shape[dim] == expected,
        op,
        f"argument '{arg}' must have size {expected} in dimension {dim} ({what}), got shape "
        f"{list(t.shape)}",
    )


def _fake_same_device(op: str, arg: str, t: Tensor, ref_arg: str, ref: Tensor) -> None:
    _check(
        t.device == ref.device,
        op,
        f"argument '{arg}' must be on device {ref.device} (the device of '{ref_arg}'), got "
        f"{t.device}",
    )


def _overlaps_itself(t: Tensor) -> bool:
    """at::has_internal_overlap(t) == MemOverlap::Yes: a dimension of size > 1 with stride 0 (an
    expand()ed or stride-0 view; such a tensor is never non-overlapping and dense). Only what
    is known without a guard counts: symbolic strides of a traced tensor are left to the
    kernel's check at run time rather than specialized here."""
    # imported here: it pulls in sympy, which `import cutlass_nn` does not otherwise need
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return any(
        statically_known_true(st == 0) and statically_known_true(sz > 1)
        for sz, st in zip(t.shape, t.stride())
    )


def _fake_no_internal_overlap(op: str, arg: str, t: Tensor) -> None:
    _check(
        not _overlaps_itself(t),
        op,
        f"argument '{arg}' must not have elements that share memory (it is written in place), "
        f"got shape {list(t.shape)} with strides {list(t.stride())} (an expand()ed or stride-0 "
        "view; pass a copy, e.g. .contiguous())",
    )


def _fake_linear_shape(op, input, weight, bias):
    # the order and messages of csrc/op_checks.cpp's check_linear_args
    _fake_common(op, "input", input, {"weight": weight})
    _fake_min_dim(op, "input", input, 1, "[*, in_features]")
    _fake_dim(op, "weight", weight, 2, "[out_features, in_features]")
    _fake_size(op, "input", input, input.dim() - 1, weight.shape[1], "in_features = weight.shape[1]")
    if bias is not None:
        _fake_common(op, "input", input, {"bias": bias})
        _fake_dim(op, "bias", bias, 1, "[out_features]")
        _fake_size(op, "bias", bias, 0, weight.shape[0], "out_features = weight.shape[0]")
    return (*input.shape[:-1], weight.shape[0])


def _fake_activation(op, activation):
    if activation not in ACTIVATIONS:
        raise RuntimeError(_activation_message(op, activation))


@torch.library.register_fake("cutlass_nn::linear")
def _linear_fake(input, weight, bias=None):
    return input.new_empty(_fake_linear_shape("linear", input, weight, bias))


@torch.library.register_fake("cutlass_nn::linear_act")
def _linear_act_fake(input, weight, bias, activation):
    shape = _fake_linear_shape("linear_act", input, weight, bias)
    _fake_activation("linear_act", activation)
    return input.new_empty(shape)


@torch.library.register_fake("cutlass_nn::linear_act_aux")
def _linear_act_aux_fake(input, weight, bias, activation):
    shape = _fake_linear_shape("linear_act_aux", input, weight, bias)
    _fake_activation("linear_act_aux", activation)
    return input.new_empty(shape), input.new_empty(shape)


@torch.library.register_fake("cutlass_nn::activation_grad")
def _activation_grad_fake(grad_output, preact, activation, bias_grad):
    op = "activation_grad"
    _fake_common(op, "grad_output", grad_output, {"preact": preact})
    _check(
        grad_output.dim() >= 1,
        op,
        "argument 'grad_output' must have at least 1 dimension(s) [*, features], got a "
        f"{grad_output.dim()}-D tensor of shape {list(grad_output.shape)}",
    )
    _check(
        preact.shape == grad_output.shape,
        op,
        f"argument 'preact' must have the shape of 'grad_output' {list(grad_output.shape)}, "
        f"got {list(preact.shape)}",
    )
    _fake_activation(op, activation)
    grad_preact = preact.new_empty(preact.shape)  # contiguous, like the kernels' output
    grad_bias = preact.new_empty((preact.shape[-1] if bias_grad else 0,))
    return grad_preact, grad_bias


@torch.library.register_fake("cutlass_nn::linear_dgrad")
def _linear_dgrad_fake(grad_output, weight):
    # the order and messages of csrc/op_checks.cpp's check_linear_dgrad_args
    op = "linear_dgrad"
    _fake_common(op, "grad_output", grad_output, {"weight": weight})
    _fake_min_dim(op, "grad_output", grad_output, 1, "[*, out_features]")
    _fake_dim(op, "weight", weight, 2, "[out_features, in_features]")
    _fake_size(op, "grad_output", grad_output, grad_output.dim() - 1, weight.shape[0],
               "out_features = weight.shape[0]")
    return grad_output.new_empty((*grad_output.shape[:-1], weight.shape[1]))


def _fake_wgrad_shape(op, grad_output, input):
    # the order and messages of csrc/op_checks.cpp's check_wgrad_pair
    _fake_common(op, "grad_output", grad_output, {"input": input})
    _fake_min_dim(op, "grad_output", grad_output, 1, "[*, out_features]")
    _fake_min_dim(op, "input", input, 1, "[*, in_features]")
    _check(
        grad_output.shape[:-1] == input.shape[:-1],
        op,
        "arguments 'grad_output' [*, out_features] and 'input' [*, in_features] must have the "
        f"same leading (batch) dimensions, got {list(grad_output.shape)} and {list(input.shape)}",
    )
    return (grad_output.shape[-1], input.shape[-1])


@torch.library.register_fake("cutlass_nn::linear_wgrad")
def _linear_wgrad_fake(grad_output, input):
    return grad_output.new_empty(_fake_wgrad_shape("linear_wgrad", grad_output, input))


@torch.library.register_fake("cutlass_nn::linear_wgrad_accumulate_")
def _linear_wgrad_accumulate_fake(grad_weight, grad_output, input):
    shape = _fake_wgrad_shape("linear_wgrad_accumulate_", grad_output, input)
    # the grad_weight checks of csrc/op_checks.cpp (device, then dtype: its own, or float32 for
    # 16-bit inputs)
    _check(
        grad_weight.device == grad_output.device,
        "linear_wgrad_accumulate_",
        f"argument 'grad_weight' must be on device {grad_output.device} (the device of "
        f"'grad_output'), got {grad_weight.device}",
    )
    half_inputs = grad_output.dtype in (torch.float16, torch.bfloat16)
    _check(
        grad_weight.dtype == grad_output.dtype or (half_inputs and grad_weight.dtype == torch.float32),
        "linear_wgrad_accumulate_",
        f"argument 'grad_weight' must have dtype {_dtype_name(grad_output.dtype)} (the dtype of "
        f"'grad_output'){' or float32' if half_inputs else ''}, got {_dtype_name(grad_weight.dtype)}",
    )
    op = "linear_wgrad_accumulate_"
    _fake_dim(op, "grad_weight", grad_weight, 2, "[out_features, in_features]")
    _fake_size(op, "grad_weight", grad_weight, 0, shape[0], "out_features = grad_output.shape[-1]")
    _fake_size(op, "grad_weight", grad_weight, 1, shape[1], "in_features = input.shape[-1]")
    _fake_no_internal_overlap(op, "grad_weight", grad_weight)
    return None


@torch.library.register_fake("cutlass_nn::bias_grad")
def _bias_grad_fake(grad_output):
    _fake_common("bias_grad", "grad_output", grad_output, {})
    _check(grad_output.dim() >= 1, "bias_grad", "argument 'grad_output' must have at least 1 dim")
    return grad_output.new_empty((grad_output.shape[-1],))


def _fake_mm_shape(op, a, b):
    _fake_common(op, "a", a, {"b": b})
    _check(a.dim() == 2, op, f"argument 'a' must be a 2-D tensor [n, m], got {a.dim()}-D")
    _check(b.dim() == 2, op, f"argument 'b' must be a 2-D tensor [m, p], got {b.dim()}-D")
    _check(
        b.shape[0] == a.shape[1],
        op,
        f"argument 'b' must have size {a.shape[1]} in dimension 0 (m = a.shape[1]), "
        f"got shape {list(b.shape)}",
    )
    return (a.shape[0], b.shape[1])


@torch.library.register_fake("cutlass_nn::mm")
def _mm_fake(a, b):
    return a.new_empty(_fake_mm_shape("mm", a, b))


@torch.library.register_fake("cutlass_nn::mm.out")
def _mm_out_fake(a, b, *, out):
    shape = _fake_mm_shape("mm.out", a, b)
    _fake_common("mm.out", "a", a, {"out": out})
    if tuple(out.shape) == tuple(shape):
        _fake_no_internal_overlap("mm.out", "out", out)
    else:
        out.resize_(shape)  # like the CPU / CUDA kernels (fresh contiguous strides)
    return None


@torch.library.register_fake("cutlass_nn::add2")
def _add2_fake(a, b):
    _fake_common("add2", "a", a, {"b": b})
    _check(
        a.shape == b.shape,
        "add2",
        f"argument 'b' must have the shape of 'a' {list(a.shape)}, got {list(b.shape)}",
    )
    return torch.empty_like(a)


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.register_fake("cutlass_nn::scale_")
def _scale_fake(x, factor):
    op = "scale_"
    _fake_common(op, "x", x, {})
    _fake_no_internal_overlap(op, "x", x)
    _check(
        x.is_contiguous(),
        op,
        f"argument 'x' must be contiguous (it is scaled in place), got strides {list(x.stride())}",
    )
    stat = _stat_dtype(x.dtype)
    # the order and messages of csrc/op_checks.cpp's check_scale_args
    _check(
        factor.dtype == stat,
        op,
        f"argument 'factor' must have dtype {_dtype_name(stat)} (the statistics dtype of 'x'), "
        f"got {_dtype_name(factor.dtype)}",
    )
    _check(
        factor.device == x.device,
        op,
        f"argument 'factor' must be on device {x.device} (the device of 'x'), got {factor.device}",
    )
    _check(
        factor.dim() == 0,
        op,
        f"argument 'factor' must be a 0-D tensor (a single value), got a {factor.dim()}-D tensor "
        f"of shape {list(factor.shape)}",
    )


def _fake_norm_weight(op: str, weight: Tensor, ref_name: str, ref: Tensor) -> None:
    # csrc/op_checks.cpp's check_norm_weight: a features mismatch names the activations
    half = ref.dtype in (torch.float16, torch.bfloat16)
    torch._check(
        weight.dtype == ref.dtype or (half and weight.dtype == torch.float32),
        lambda: f"cutlass_nn.{op}: argument 'weight' must have dtype {_dtype_name(ref.dtype)} "
        f"(the dtype of '{ref_name}'){' or float32' if half else ''}, got "
        f"{_dtype_name(weight.dtype)}",
    )
    _fake_same_device(op, "weight", weight, ref_name, ref)
    _fake_dim(op, "weight", weight, 1, "[features]")
    _fake_size(op, ref_name, ref, ref.dim() - 1, weight.shape[0], "features = weight.shape[0]")


def _fake_rms_norm_args(op, input_name, input, residual, weight, eps):
    # the order and messages of csrc/op_checks.cpp's check_rms_norm_args
    _fake_common(op, input_name, input, {})
    _fake_min_dim(op, input_name, input, 1, "[*, features]")
    if residual is not None:
        _fake_common(op, input_name, input, {"residual": residual})
        _check(
            residual.shape == input.shape,
            op,
            f"argument 'residual' must have the shape of '{input_name}' {list(input.shape)}, got "
            f"{list(residual.shape)}",
        )
    _fake_norm_weight(op, weight, input_name, input)
    # f"{eps:f}": the C++ message's std::to_string spelling
    _check(
        math.isfinite(eps) and eps >= 0.0, op, f"argument 'eps' must be a finite number >= 0, got {eps:f}"
    )


def _fake_rstd(input: Tensor) -> Tensor:
    return input.new_empty(input.shape[:-1], dtype=_stat_dtype(input.dtype))


@torch.library.register_fake("cutlass_nn::rms_norm")
def _rms_norm_fake(input, weight, eps):
    _fake_rms_norm_args("rms_norm", "input", input, None, weight, eps)
    return torch.empty_like(input, memory_format=torch.contiguous_format), _fake_rstd(input)


@torch.library.register_fake("cutlass_nn::add_rms_norm")
def _add_rms_norm_fake(x, residual, weight, eps):
    _fake_rms_norm_args("add_rms_norm", "x", x, residual, weight, eps)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    return out, h, _fake_rstd(x)


@torch.library.register_fake("cutlass_nn::rms_norm_backward")
def _rms_norm_backward_fake(grad_output, grad_h, h, weight, rstd, weight_grad):
    # the order and messages of csrc/op_checks.cpp's check_rms_norm_backward_args
    op = "rms_norm_backward"
    _fake_common(op, "h", h, {})
    _fake_min_dim(op, "h", h, 1, "[*, features]")
    others = {"grad_output": grad_output, **({"grad_h": grad_h} if grad_h is not None else {})}
    for name, t in others.items():
        _fake_common(op, "h", h, {name: t})
        _check(
            t.shape == h.shape,
            op,
            f"argument '{name}' must have the shape of 'h' {list(h.shape)}, got {list(t.shape)}",
        )
    _fake_norm_weight(op, weight, "h", h)
    stat = _stat_dtype(h.dtype)
    _check(
        rstd.dtype == stat,
        op,
        f"argument 'rstd' must have dtype {_dtype_name(stat)}, got {_dtype_name(rstd.dtype)}",
    )
    _fake_same_device(op, "rstd", rstd, "h", h)
    _check(
        rstd.shape == h.shape[:-1],
        op,
        f"argument 'rstd' must have the leading dimensions of 'h' {list(h.shape[:-1])}, got "
        f"{list(rstd.shape)}",
    )
    grad_input = torch.empty_like(h, memory_format=torch.contiguous_format)
    grad_weight = weight.new_empty((weight.shape[0],) if weight_grad else (0,))
    return grad_input, grad_weight


def _fake_gated_activation(op: str, activation) -> None:
    _check(
        activation in GATED_ACTIVATIONS,
        op,
        "argument 'activation' must be one of "
        + ", ".join(f'"{a}"' for a in GATED_ACTIVATIONS)
        + f', got "{activation}"',
    )


def _fake_gate_up(op: str, gate_up: Tensor) -> None:
    _fake_common(op, "gate_up", gate_up, {})
    _fake_min_dim(op, "gate_up", gate_up, 1, "[*, 2n]")
    _check(
        gate_up.shape[-1] % 2 == 0,
        op,
        "argument 'gate_up' must have an even last dimension [*, 2n] (gate, then up), got "
        f"shape {list(gate_up.shape)}",
    )


@torch.library.register_fake("cutlass_nn::gated_act")
def _gated_act_fake(gate_up, activation):
    _fake_gate_up("gated_act", gate_up)
    _fake_gated_activation("gated_act", activation)
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


def _fake_gated_act_backward_args(op: str, grad_output: Tensor, gate_up: Tensor):
    # the order and messages of csrc/op_checks.cpp's check_gated_act_backward_args; `op` is
    # "gated_act_backward" or "gated_act_backward_"
    _fake_gate_up(op, gate_up)
    _fake_common(op, "gate_up", gate_up, {"grad_output": grad_output})
    shape = (*gate_up.shape[:-1], gate_up.shape[-1] // 2)
    _check(
        tuple(grad_output.shape) == tuple(shape),
        op,
        f"argument 'grad_output' must have shape {list(shape)} (that of 'gate_up' with the last "
        f"dimension halved), got {list(grad_output.shape)}",
    )
    return shape


@torch.library.register_fake("cutlass_nn::gated_act_backward")
def _gated_act_backward_fake(grad_output, gate_up, activation):
    op = "gated_act_backward"
    shape = _fake_gated_act_backward_args(op, grad_output, gate_up)
    _fake_gated_activation(op, activation)
    return torch.empty_like(gate_up, memory_format=torch.contiguous_format), gate_up.new_empty(shape)


@torch.library.register_fake("cutlass_nn::gated_act_backward_")
def _gated_act_backward_inplace_fake(grad_output, gate_up, activation):
    op = "gated_act_backward_"
    shape = _fake_gated_act_backward_args(op, grad_output, gate_up)
    # check_gate_up_writable (shared memory with grad_output cannot be seen on fake tensors)
    _fake_no_internal_overlap(op, "gate_up", gate_up)
    _check(
        gate_up.is_contiguous(),
        op,
        "argument 'gate_up' must be contiguous (it is written in place), got strides "
        f"{list(gate_up.stride())}",
    )
    _fake_gated_activation(op, activation)
    return gate_up.new_empty(shape)


@torch.library.register_fake("cutlass_nn::cross_entropy_rows_")
def _cross_entropy_rows_fake(logits, target, row_scale, ignore_index, label_smoothing, write_grad):
    # the order and messages of csrc/op_checks.cpp's check_cross_entropy_rows_args
    op = "cross_entropy_rows_"
    _fake_common(op, "logits", logits, {})
    _fake_dim(op, "logits", logits, 2, "[rows, vocab]")
    _check(
        logits.shape[1] >= 1,
        op,
        "argument 'logits' must have at least one class (vocab >= 1), got shape "
        f"{list(logits.shape)}",
    )
    if write_grad:
        _fake_no_internal_overlap(op, "logits", logits)
    _check(
        logits.is_contiguous(),
        op,
        f"argument 'logits' must be contiguous (it is written in place), got strides {list(logits.stride())}",
    )
    _check(
        target.dtype == torch.int64,
        op,
        f"argument 'target' must be an int64 tensor of class indices, got {_dtype_name(target.dtype)}",
    )
    _fake_same_device(op, "target", target, "logits", logits)
    _fake_dim(op, "target", target, 1, "[rows]")
    _fake_size(op, "target", target, 0, logits.shape[0], "rows = logits.shape[0]")
    stat = _stat_dtype(logits.dtype)
    if row_scale is not None:
        _check(
            row_scale.dtype == stat,
            op,
            f"argument 'row_scale' must have dtype {_dtype_name(stat)} (the statistics dtype of "
            f"'logits'), got {_dtype_name(row_scale.dtype)}",
        )
        _fake_same_device(op, "row_scale", row_scale, "logits", logits)
        _fake_dim(op, "row_scale", row_scale, 1, "[rows]")
        _fake_size(op, "row_scale", row_scale, 0, logits.shape[0], "rows = logits.shape[0]")
    # f"{...:f}": the C++ message's std::to_string spelling
    _check(
        math.isfinite(label_smoothing) and 0.0 <= label_smoothing <= 1.0,
        op,
        f"argument 'label_smoothing' must be in [0, 1], got {label_smoothing:f}",
    )
    rows = logits.shape[0]
    return logits.new_empty((rows,), dtype=stat), logits.new_empty((rows,), dtype=stat)


def _fake_bias(op: str, name: str, bias: Tensor | None, size, ref: Tensor, what: str) -> None:
    # the order and messages of the bias checks of csrc/op_checks.cpp's gated operators
    if bias is None:
        return
    _fake_common(op, "input", ref, {name: bias})
    _fake_dim(op, name, bias, 1, what)
    _fake_size(op, name, bias, 0, size, what)


def _fake_gate_up_biases(op: str, input: Tensor, n, gate_bias, up_bias) -> None:
    # the order and messages of csrc/op_checks.cpp's check_gate_up_biases
    _check(
        (gate_bias is None) == (up_bias is None),
        op,
        "arguments 'gate_bias' and 'up_bias' must be given both or neither, got "
        f"gate_bias={'a tensor' if gate_bias is not None else 'None'}, "
        f"up_bias={'a tensor' if up_bias is not None else 'None'}",
    )
    _fake_bias(op, "gate_bias", gate_bias, n, input, "[n]")
    _fake_bias(op, "up_bias", up_bias, n, input, "[n]")


@torch.library.register_fake("cutlass_nn::gated_mlp")
def _gated_mlp_fake(
    input,
    gate_weight,
    up_weight,
    down_weight,
    gate_bias=None,
    up_bias=None,
    down_bias=None,
    activation="silu",
):
    # the order and messages of csrc/op_checks.cpp's check_gated_mlp_args, then the activation
    # (checked after the arguments, as the kernels do)
    op = "gated_mlp"
    _fake_common(op, "input", input, {})
    _fake_min_dim(op, "input", input, 1, "[*, in]")
    _fake_gate_up_weights(op, "input", input, gate_weight, up_weight, input.shape[-1],
                          "in = input.shape[-1]")
    _fake_common(op, "input", input, {"down_weight": down_weight})
    n = gate_weight.shape[0]
    _fake_dim(op, "down_weight", down_weight, 2, "[out, n]")
    _fake_size(op, "down_weight", down_weight, 1, n, "n = gate_weight.shape[0]")
    _fake_gate_up_biases(op, input, n, gate_bias, up_bias)
    _fake_bias(op, "down_bias", down_bias, down_weight.shape[0], input, "[out]")
    _fake_gated_activation(op, activation)
    return input.new_empty((*input.shape[:-1], down_weight.shape[0]))


def _fake_gate_up_weights(op: str, ref_name: str, ref: Tensor, gate_weight, up_weight, in_size,
                          in_what: str) -> None:
    # the order and messages of csrc/op_checks.cpp's check_gate_up_weights
    _fake_common(op, ref_name, ref, {"gate_weight": gate_weight, "up_weight": up_weight})
    _fake_dim(op, "gate_weight", gate_weight, 2, "[n, in]")
    if in_size is not None:
        _fake_size(op, "gate_weight", gate_weight, 1, in_size, in_what)
    _check(
        tuple(up_weight.shape) == tuple(gate_weight.shape),
        op,
        f"argument 'up_weight' must have the shape of 'gate_weight' {list(gate_weight.shape)}, "
        f"got {list(up_weight.shape)}",
    )


@torch.library.register_fake("cutlass_nn::_gate_up_linear")
def _gate_up_linear_fake(input, gate_weight, up_weight, gate_bias=None, up_bias=None):
    # the order and messages of csrc/op_checks.cpp's check_gate_up_linear_args
    op = "_gate_up_linear"
    _fake_common(op, "input", input, {})
    _fake_min_dim(op, "input", input, 1, "[*, in]")
    _fake_gate_up_weights(op, "input", input, gate_weight, up_weight, input.shape[-1],
                          "in = input.shape[-1]")
    n = gate_weight.shape[0]
    _fake_gate_up_biases(op, input, n, gate_bias, up_bias)
    return input.new_empty((*input.shape[:-1], 2 * n))


@torch.library.register_fake("cutlass_nn::_pack_gate_up")
def _pack_gate_up_fake(gate, up, dtype):
    # the order and messages of csrc/op_checks.cpp's check_pack_gate_up_args
    op = "_pack_gate_up"
    _fake_common(op, "gate", gate, {})
    _fake_dim(op, "gate", gate, 2, "[n, in]")
    _fake_common(op, "gate", gate, {"up": up})
    _check(
        tuple(up.shape) == tuple(gate.shape),
        op,
        f"argument 'up' must have the shape of 'gate' {list(gate.shape)}, got {list(up.shape)}",
    )
    _check(
        dtype in _FLOAT_DTYPES,
        op,
        "argument 'dtype' must be a floating dtype (float16, bfloat16, float32 or float64), got "
        f"{_dtype_name(dtype)}",
    )
    return gate.new_empty((2 * gate.shape[0], gate.shape[1]), dtype=dtype)


@torch.library.register_fake("cutlass_nn::_gate_up_dgrad")
def _gate_up_dgrad_fake(grad_gate_up, gate_weight, up_weight):
    # the order and messages of csrc/op_checks.cpp's check_gate_up_dgrad_args
    op = "_gate_up_dgrad"
    _fake_common(op, "grad_gate_up", grad_gate_up, {})
    _fake_min_dim(op, "grad_gate_up", grad_gate_up, 1, "[*, 2n]")
    _fake_gate_up_weights(op, "grad_gate_up", grad_gate_up, gate_weight, up_weight, None, "")
    n = gate_weight.shape[0]
    _check(
        grad_gate_up.shape[-1] == 2 * n,
        op,
        f"argument 'grad_gate_up' must have last dimension 2n = {2 * n} (n = "
        f"gate_weight.shape[0]), got shape {list(grad_gate_up.shape)}",
    )
    return grad_gate_up.new_empty((*grad_gate_up.shape[:-1], gate_weight.shape[1]))


# ---------------------------------------------------------------------------------------------
# Kernel-selection hooks of the CUDA flavor (used by the GPU tests and benchmarks)
# ---------------------------------------------------------------------------------------------


def force_sm80_kernels(enable: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, GEMMs use the CUTLASS 2.x (SM80) kernels even on Hopper GPUs.

    Process-wide (not per thread); a no-op in the CPU flavor. Not for use inside a
    ``torch.compile``-d function. ``enable`` must be a bool (TypeError otherwise, raised by the
    call, before the block).
    """
    return _force_sm80_kernels(_checks.check_bool("force_sm80_kernels", "enable", enable))


@contextlib.contextmanager
def _force_sm80_kernels(enable: bool) -> Iterator[None]:
    previous = _ops._set_force_sm80(enable)
    try:
        yield
    finally:
        _ops._set_force_sm80(previous)


def programmatic_launch(enable: bool = True) -> contextlib.AbstractContextManager[None]:
    """Within the block, the SM90 GEMMs are (``True``) or are not (``False``) launched with
    programmatic dependent launch (PDL).

    With PDL, a GEMM that follows another of our SM90 GEMMs in the stream starts its prologue on
    the SMs the first one frees and waits on the GPU (``griddepcontrol.wait``) for it to finish
    before touching memory: same results, less idle time between the two kernels. On by default
    (``CUTLASS_NN_PDL=0`` turns it off from the start). Process-wide (not per thread); a no-op in
    the CPU flavor. Not for use inside a ``torch.compile``-d function; a captured CUDA graph keeps
    the setting its launches were captured with. ``enable`` must be a bool (TypeError otherwise,
    raised by the call, before the block: ``"no"`` would be true).
    """
    return _programmatic_launch(_checks.check_bool("programmatic_launch", "enable", enable))


@contextlib.contextmanager
def _programmatic_launch(enable: bool) -> Iterator[None]:
    previous = _ops._set_programmatic_launch(enable)
    try:
        yield
    finally:
        _ops._set_programmatic_launch(previous)


def programmatic_launch_enabled() -> bool:
    """Whether the SM90 GEMMs are launched with programmatic dependent launch now (always
    ``False`` in the CPU flavor)."""
    return _ops._programmatic_launch_enabled()


def last_kernel_name() -> str:
    """Name of the GEMM kernel that the last cutlass_nn GEMM ran ("" if none).

    Process-wide, like the kernel switches (``force_sm80_kernels``, ``_set_gemm_config``): the
    last GEMM of any thread, autograd's backward thread included."""
    return _ops._last_kernel_name()


def _dense(x: Tensor) -> bool:
    """Whether x's elements fill its memory exactly once (c10's is_non_overlapping_and_dense:
    the strides of the dims of size > 1, in increasing order, are the running products)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(x.shape, x.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _rotary_fake_output(x: Tensor) -> Tensor:
    # csrc/rotary_layout.h: the input's strides when it is dense with a unit-stride last dim
    if x.numel() > 0 and x.stride(-1) == 1 and _dense(x):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return x.new_empty(x.shape)


def _fake_rotary(op: str, q_name: str, k_name: str, q, k, cos, sin):
    # the order and messages of csrc/op_checks.cpp's check_rotary_args
    _fake_common(op, q_name, q, {})
    _check(q.dim() == 4, op, f"argument '{q_name}' must be a 4-D tensor [batch, heads, seq, head_dim], got a {q.dim()}-D tensor of shape {list(q.shape)}")
    _fake_common(op, q_name, q, {k_name: k})
    _check(k.dim() == 4, op, f"argument '{k_name}' must be a 4-D tensor [batch, kv_heads, seq, head_dim], got a {k.dim()}-D tensor of shape {list(k.shape)}")
    _fake_common(op, q_name, q, {"cos": cos})
    _check(cos.dim() == 3, op, f"argument 'cos' must be a 3-D tensor [batch or 1, seq, head_dim], got a {cos.dim()}-D tensor of shape {list(cos.shape)}")
    _fake_common(op, q_name, q, {"sin": sin})
    _check(
        sin.shape == cos.shape,
        op,
        f"argument 'sin' must have the shape of 'cos' {list(cos.shape)}, got {list(sin.shape)}",
    )
    _check(
        q.shape[3] % 2 == 0,
        op,
        f"argument '{q_name}' must have an even head_dim (its last dimension, rotated in halves), "
        f"got shape {list(q.shape)}",
    )
    for arg, t, dim, what in (
        (k_name, k, 0, "batch"), (k_name, k, 2, "seq"), (k_name, k, 3, "head_dim"),
    ):
        _check(
            t.shape[dim] == q.shape[dim],
            op,
            f"argument '{arg}' must have size {q.shape[dim]} in dimension {dim} ({what} the same "
            f"as '{q_name}'), got shape {list(t.shape)}",
        )
    _check(
        cos.shape[0] == 1 or cos.shape[0] == q.shape[0],
        op,
        f"argument 'cos' must have a batch dimension of 1 or {q.shape[0]} (the batch of "
        f"'{q_name}'), got shape {list(cos.shape)}",
    )
    for dim, what in ((1, "seq"), (2, "head_dim")):
        _check(
            cos.shape[dim] == q.shape[dim + 1],
            op,
            f"argument 'cos' must have size {q.shape[dim + 1]} in dimension {dim} ({what} the "
            f"same as '{q_name}'), got shape {list(cos.shape)}",
        )
    return _rotary_fake_output(q), _rotary_fake_output(k)


@torch.library.register_fake("cutlass_nn::rotary_embedding")
def _rotary_embedding_fake(q, k, cos, sin):
    return _fake_rotary("rotary_embedding", "q", "k", q, k, cos, sin)


@torch.library.register_fake("cutlass_nn::rotary_embedding_backward")
def _rotary_embedding_backward_fake(grad_q, grad_k, cos, sin):
    return _fake_rotary("rotary_embedding_backward", "grad_q", "grad_k", grad_q, grad_k, cos, sin)


_FLOAT8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _fake_fp8_scale(name: str, scale: Tensor, a: Tensor, want: tuple[int, int], per: str) -> None:
    ok = scale.dtype == torch.float32 and (
        scale.dim() == 0 or tuple(scale.shape) == (1,) or tuple(scale.shape) == want
    )
    _check(
        ok,
        "fp8_scaled_mm",
        f"argument '{name}' must be a float32 tensor of shape [] or [1] (one value) or "
        f"[{want[0]}, {want[1]}] (one per {per}), got a {_dtype_name(scale.dtype)} tensor of "
        f"shape {list(scale.shape)}",
    )
    _check(
        scale.device == a.device,
        "fp8_scaled_mm",
        f"argument '{name}' must be on device {a.device} (the device of 'a'), got {scale.device}",
    )


@torch.library.register_fake("cutlass_nn::fp8_scaled_mm")
def _fp8_scaled_mm_fake(a, b, a_scale, b_scale, bias, out_dtype, use_fast_accum):
    for name, t in (("a", a), ("b", b)):
        _check(
            t.dim() == 2 and t.dtype in _FLOAT8_DTYPES,
            "fp8_scaled_mm",
            f"argument '{name}' must be a 2-d float8_e4m3fn or float8_e5m2 tensor, got a "
            f"{_dtype_name(t.dtype)} tensor of shape {list(t.shape)}",
        )
    _check(
        b.device == a.device,
        "fp8_scaled_mm",
        f"argument 'b' must be on device {a.device} (the device of 'a'), got {b.device}",
    )
    _check(
        b.shape[0] == a.shape[1],
        "fp8_scaled_mm",
        f"argument 'b' must have {a.shape[1]} rows (the columns of 'a'), got shape "
        f"{list(b.shape)}",
    )
    m, n = a.shape[0], b.shape[1]
    _fake_fp8_scale("a_scale", a_scale, a, (m, 1), "row")
    _fake_fp8_scale("b_scale", b_scale, a, (1, n), "column")
    _check(
        out_dtype in (torch.bfloat16, torch.float16, torch.float32),
        "fp8_scaled_mm",
        f"argument 'out_dtype' must be bfloat16, float16 or float32, got {_dtype_name(out_dtype)}",
    )
    if bias is not None:
        _check(
            bias.dim() == 1 and bias.shape[0] == n and bias.dtype == out_dtype,
            "fp8_scaled_mm",
            f"argument 'bias' must be a {_dtype_name(out_dtype)} tensor of shape [{n}] "
            f"(out_dtype, the columns of 'b'), got a {_dtype_name(bias.dtype)} tensor of shape "
            f"{list(bias.shape)}",
        )
        _check(
            bias.device == a.device,
            "fp8_scaled_mm",
            f"argument 'bias' must be on device {a.device} (the device of 'a'), got {bias.device}",
        )
    return a.new_empty((m, n), dtype=out_dtype)


_FP8_AXES = ("tensor", "row", "column")


def _check_fp8_quantize(op, x, format, axis):
    _check(
        x.dim() == 2 and x.dtype in (torch.float16, torch.bfloat16, torch.float32),
        op,
        f"argument 'x' must be a 2-d float16, bfloat16 or float32 tensor, got a "
        f"{_dtype_name(x.dtype)} tensor of shape {list(x.shape)}",
    )
    _check(format in ("e4m3", "e5m2"), op,
           f'argument \'format\' must be "e4m3" or "e5m2", got "{format}"')
    _check(axis in _FP8_AXES, op,
           f'argument \'axis\' must be "tensor", "row" or "column", got "{axis}"')


def _fp8_shapes(rows: int, cols: int, axis: str, transpose: bool):
    """(data shape, scale shape) of an FP8 quantization or cast of a [rows, cols] tensor along
    ``axis``, transposed or not: what every FP8 fake returns."""
    scale = {"tensor": (), "row": (rows, 1), "column": (1, cols)}[axis]
    if transpose:
        return (cols, rows), scale[::-1]
    return (rows, cols), scale


def _fp8_dtype(format: str) -> torch.dtype:
    return torch.float8_e4m3fn if format == "e4m3" else torch.float8_e5m2


@torch.library.register_fake("cutlass_nn::fp8_quantize_both")
def _fp8_quantize_both_fake(x, format, axis):
    _check_fp8_quantize("fp8_quantize_both", x, format, axis)
    (rows, cols), scale = _fp8_shapes(*x.shape, axis, False)
    dtype = _fp8_dtype(format)
    return (x.new_empty((rows, cols), dtype=dtype), x.new_empty((cols, rows), dtype=dtype),
            x.new_empty(scale, dtype=torch.float32))


@torch.library.register_fake("cutlass_nn::fp8_quantize")
def _fp8_quantize_fake(x, format, axis, transpose):
    _check_fp8_quantize("fp8_quantize", x, format, axis)
    data, scale = _fp8_shapes(*x.shape, axis, transpose)
    return x.new_empty(data, dtype=_fp8_dtype(format)), x.new_empty(scale, dtype=torch.float32)


@torch.library.register_fake("cutlass_nn::fp8_cast")
def _fp8_cast_fake(x, scale, format, transpose):
    _check_fp8_quantize("fp8_cast", x, format, "tensor")
    rows, cols = x.shape
    shapes = ([], [1], [rows, 1], [1, cols])
    _check(scale.dtype == torch.float32 and list(scale.shape) in shapes, "fp8_cast",
           f"argument 'scale' must be a float32 tensor of shape [] or [1] (one value), [{rows}, 1] "
           f"(per row) or [1, {cols}] (per column), got a {_dtype_name(scale.dtype)} tensor of "
           f"shape {list(scale.shape)}")
    _check(scale.device == x.device, "fp8_cast",
           f"argument 'scale' must be on {x.device} (the device of 'x'), got {scale.device}")
    return x.new_empty(_fp8_shapes(rows, cols, "tensor", transpose)[0], dtype=_fp8_dtype(format))
