"""FP8 training of linear layers: the forward and both gradients of ``y = x W^T + b`` on float8
operands with dynamic scaling, the GEMMs on :func:`cutlass_nn.ops.fp8_scaled_mm` (cutlass_nn's
SM90 FP8 kernels on Hopper, the same arithmetic in ATen elsewhere).

The arithmetic is :mod:`cutlass_nn.fp8_reference`'s, step for step (the tests check them equal; the
one difference: the bias is rounded to the output dtype before the add, see :func:`linear`):
each operand is quantized from its own absolute maximum (``Fp8Recipe.scaling`` "tensorwise": one
scale per operand; "rowwise": per row of the activations and of the output gradient, per output
channel of the weight, and for the backward along the axes each GEMM does not sum over),
forward operands in e4m3, the output gradient in ``Fp8Recipe.grad_format``; float32 accumulation
(``Fp8Recipe.fast_accum_forward``: the forward GEMM without promotion on Hopper); outputs in the
input's dtype (the autocast dtype under ``torch.autocast``), the weight gradient in the weight's
dtype, the bias gradient as float32 column sums of the unquantized output gradient. Parameters
keep their dtype; nothing FP8 is stored between steps, so ``state_dict`` is unchanged. The
backward keeps what ``nn.Linear``'s keeps (the input and the weight, plus two one-element scales)
and casts them again in the layouts its GEMMs need: rowwise quantized along the other axis
(:func:`cutlass_nn.ops.fp8_quantize`, which writes transposed operands directly), tensorwise cast
with the forward's scales (:func:`cutlass_nn.ops.fp8_cast`, no second maximum); a tensorwise
output gradient is quantized once into both layouts (:func:`cutlass_nn.ops.fp8_quantize_both`).

Entry points: :func:`linear` (autograd), :func:`gated_mlp` (the gated MLP with gate and up as one
FP8 GEMM), :func:`reuse_quantized_inputs` (opt-in sharing of an activation's quantization by
consecutive layers), :func:`eligible` (the size rule that :func:`cutlass_nn.convert` applies
with ``precision="fp8"``), and ``CutlassLinear(..., precision="fp8")`` / ``GatedMLP(...,
precision="fp8")``.
"""
from __future__ import annotations

import torch
from torch import Tensor
from cutlass_nn import _checks
from cutlass_nn import fp8_reference as R
from cutlass_nn import ops
from cutlass_nn.fp8_reference import Fp8Recipe

__all__ = ["Fp8Recipe", "MIN_FEATURES", "eligible", "gated_mlp", "linear", "reuse_quantized_inputs"]

#: The smallest in_features and out_features a layer converts to FP8 with: below it the GEMM
#: gains too little over bf16 to pay for quantizing its operands on every step (see
#: benchmarks/NOTES.md, FP8). Both must also be multiples of 16 (the FP8 kernels read 16-byte rows).
MIN_FEATURES = 1024


def eligible(in_features: int, out_features: int) -> bool:
    """Whether a linear layer of this shape runs in FP8 under ``convert(precision="fp8")``: both
    dimensions at least :data:`MIN_FEATURES` and multiples of 16."""
    in_features = _checks.check_int("fp8.eligible", "in_features", in_features)
    out_features = _checks.check_int("fp8.eligible", "out_features", out_features)
    return (
        in_features >= MIN_FEATURES
        and out_features >= MIN_FEATURES
        and in_features % 16 == 0
        and out_features % 16 == 0
    )


def _transposed_scale(scale: Tensor) -> Tensor:
    return scale.t() if scale.dim() == 2 else scale


class _LastQuantization:
    """The last quantization of an activation (see :func:`_reused`): one entry for the process,
    so that the forward's first quantization releases what the previous backward (which runs
    on autograd's device threads) left there. Off by default."""

    enabled = False
    entry = None  # (key, detached source tensor, result)


def reuse_quantized_inputs(enabled: bool) -> bool:
    """Turn on or off (the default) the reuse of an activation's FP8 quantization by
    consecutive FP8 layers that read the same tensor (a Llama attention's ``q_proj``,
    ``k_proj`` and ``v_proj``; an unfused gated MLP's ``gate_proj`` and ``up_proj``): the
    forward quantizes it once and the backward casts its transpose once, instead of once per
    layer. Returns the previous setting.

    The reuse is exact when it applies: the same data gives the same FP8 data and scale. It
    applies only to tensors that are part of an autograd graph (the tensor, or the base it is a
    view of, has a ``grad_fn``; not in inference mode), keyed on that node, the
    storage address, shape, strides, dtype, version counter and current CUDA stream; never while
    tracing or capturing a CUDA graph; and the entry is dropped when a backward pass ends. It is
    off by default because writes that do not bump the version counter are invisible to it:
    a CUDA graph replay writing into tensors an eager FP8 layer then reads (the same node, data
    and version on every replay), writes through ``.data``, through a NumPy / DLPack alias, or by
    an in-place collective between two layers reading the same tensor. Turn it on for eager
    training loops that do none of these (it saves 4 maximum passes and 8 casts per Llama
    decoder layer and step)."""
    _checks.check_bool("fp8.reuse_quantized_inputs", "enabled", enabled)
    previous = _LastQuantization.enabled
    _LastQuantization.enabled = enabled
    _LastQuantization.entry = None
    return previous


def _drop_entry() -> None:
    _LastQuantization.entry = None


def _drop_entry_after_backward() -> None:
    """Called from a backward: the entry goes when this backward pass ends (nothing of one
    step is reused in the next, and the pass's last activation is not kept)."""
    if _LastQuantization.enabled:
        torch.autograd.Variable._execution_engine.queue_callback(_drop_entry)


def _reused(kind: str, t: Tensor, compute, scale=None):
    """``compute()``, or the result of the same computation on the same tensor if that was the
    last one made: ``kind`` names the computation, ``scale`` any scale tensor it uses (its
    identity is part of the key: the entry's result holds it, so the identity stays unique),
    ``t`` its input (see :func:`reuse_quantized_inputs` for when it applies and the rest of the
    key). Not traceable (identities, version counters): skipped while tracing."""
    if (
        not _LastQuantization.enabled
        or torch.compiler.is_compiling()
        or type(t) not in (Tensor, torch.nn.Parameter)
        or t.is_inference()
    ):
        return compute()
    root = t._base if t._base is not None else t
    node = root.grad_fn
    if node is None:
        return compute()
    stream = None
    if t.is_cuda:
        if torch.cuda.is_current_stream_capturing():
            return compute()
        stream = torch.cuda.current_stream(t.device).cuda_stream
    key = (kind, id(scale), id(node), t.data_ptr(), t.shape, t.stride(), t.dtype, t.device,
           t._version, stream)
    entry = _LastQuantization.entry
    if entry is not None and entry[0] == key:
        return entry[2]
    result = compute()
    # The node is held (its identity stays unique while the key names it); the source only as
    # a detached alias (its storage cannot be reused under the key, and no graph is held
    # through it beyond the node).
    _LastQuantization.entry = (key, t.detach(), result, node)
    return result


# The quantization steps. Eager: cutlass_nn's operators. While tracing (torch.compile): the same
# arithmetic in torch operations (fp8_reference.quantize_unchecked / cast_with_scale, which the
# CPU backend of the operators is), so that inductor fuses the maximum and the cast with the
# kernels around them, as it cannot do with an opaque operator.


def _quantize(x: Tensor, fmt: str, axis: str, transpose: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`cutlass_nn.ops.fp8_quantize` (see the note above)."""
    if not torch.compiler.is_compiling():
        return ops.fp8_quantize(x, fmt, axis, transpose)
    data, scale = R.quantize_unchecked(x, fmt, {"tensor": None, "row": 1, "column": 0}[axis])
    if transpose:
        return data.t().contiguous(), _transposed_scale(scale)
    return data, scale


def _quantize_both(x: Tensor, fmt: str) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`cutlass_nn.ops.fp8_quantize_both` with one scale (see the note above)."""
    if not torch.compiler.is_compiling():
        return ops.fp8_quantize_both(x, fmt, "tensor")
    data, scale = R.quantize_unchecked(x, fmt, None)
    return data, data.t().contiguous(), scale


def _cast_transposed(x: Tensor, scale: Tensor) -> Tensor:
    """:func:`cutlass_nn.ops.fp8_cast` (e4m3, transposed; see the note above)."""
    if not torch.compiler.is_compiling():
        return ops.fp8_cast(x, scale, "e4m3", True)
    return R.cast_with_scale(x, scale, "e4m3").t().contiguous()


def _forward_axis(scaling: str) -> str:
    """The axis the forward scales x and the weight along: per row (rowwise) or one scale."""
    return "row" if scaling == "rowwise" else "tensor"


def _forward_gemm(x2: Tensor, weight_q: tuple, bias, scaling: str, out_dtype,
                  fast_accum: bool = False, shared: bool = True) -> tuple:
    """``x2 @ W^T (+ bias)`` with ``x2`` freshly quantized (e4m3, per row for rowwise, one scale
    for tensorwise) and ``weight_q`` the weight's ``(data [N, K], scale)`` quantized along
    :func:`_forward_axis`: ``(y, scales)`` with ``scales`` what the backward casts ``x2`` and the
    weight with again (tensorwise: the two one-element scales; rowwise: nothing, its backward
    scales along other axes). ``fast_accum``: :attr:`Fp8Recipe.fast_accum_forward`. ``shared``:
    ``x2`` may be the input of the next FP8 layer too (:func:`_reused`); False for an input no
    other layer reads, which the reuse entry would otherwise keep alive."""
    axis = _forward_axis(scaling)
    quantize = lambda: _quantize(x2, "e4m3", axis)  # noqa: E731
    xq, xs = _reused(f"x {axis}", x2, quantize) if shared else quantize()
    wq, ws = weight_q
    b = None if bias is None else bias.to(out_dtype)
    y = ops.fp8_scaled_mm(xq, wq.t(), xs, _transposed_scale(ws), b, out_dtype, fast_accum)
    return y, (() if scaling == "rowwise" else (xs, ws))


def _grad_operands(g2: Tensor, scaling: str, fmt: str, for_dgrad: bool, for_wgrad: bool):
    """The output gradient ``g2`` quantized for the two backward GEMMs: ``(dgrad operand,
    wgrad operand)``, each ``(data, scale)`` or None where not needed. The data gradient reads
    it by rows (rowwise: one scale per row), the weight gradient by columns, transposed
    (rowwise: one scale per column); tensorwise, both come from one maximum and one cast
    (:func:`cutlass_nn.ops.fp8_quantize_both`)."""
    if scaling != "rowwise" and for_dgrad and for_wgrad:
        gq, gt, gs = _quantize_both(g2, fmt)
        return (gq, gs), (gt, gs)
    rowwise = scaling == "rowwise"
    dgrad = _quantize(g2, fmt, "row" if rowwise else "tensor") if for_dgrad else None
    wgrad = (_quantize(g2, fmt, "column" if rowwise else "tensor", True)
             if for_wgrad else None)
    return dgrad, wgrad


def _transposed_operand(t: Tensor, scale) -> tuple[Tensor, Tensor]:
    """``t^T`` in e4m3 for a backward GEMM, with its scale: cast with the forward's scale
    (tensorwise: the same maximum, so no second pass for it), else quantized per column of
    ``t`` (rowwise: per input channel, an axis the forward did not scale along)."""
    if scale is None:
        return _quantize(t, "e4m3", "column", True)
    return _cast_transposed(t, scale), scale


def _dgrad(grad: tuple, weight_t: tuple, out_dtype) -> Tensor:
    """``dX = dY W``: ``grad`` from :func:`_grad_operands`, B = W column-major: ``weight_t`` is
    ``W^T`` [K, N] quantized by rows with its scale (:func:`_transposed_operand`), transposed
    back here."""
    gq, gs = grad
    wt, wts = weight_t
    return ops.fp8_scaled_mm(gq, wt.t(), gs, _transposed_scale(wts), None, out_dtype)


def _wgrad(grad_t: tuple, x2: Tensor, x_scale, out_dtype, shared: bool = True) -> Tensor:
    """``dW = dY^T X``: A = ``dY^T`` [N, T] from :func:`_grad_operands`, B = X column-major
    (``X^T`` [K, T] quantized by rows, transposed back; layers that read the same input share
    it, :func:`_reused`)."""
    gt, gts = grad_t
    cast = lambda: _transposed_operand(x2, x_scale)  # noqa: E731
    xt, xts = _reused("x^T", x2, cast, x_scale) if shared else cast()
    return ops.fp8_scaled_mm(gt, xt.t(), gts, _transposed_scale(xts), None, out_dtype)


class _Fp8Linear(torch.autograd.Function):
    """``apply(x, weight, bias, scaling, grad_format, fast_accum, out_dtype)``: first order only (the
    quantization has no useful derivative to differentiate again).

    Every GEMM operand comes out of :func:`cutlass_nn.ops.fp8_quantize` in the layout the FP8
    kernels read (A row-major, B column-major, both K-major): the backward's transposed operands
    are written transposed by the quantization itself. The backward quantizes ``x`` and the
    weight again (rowwise: per column; tensorwise: cast with the forward's two scales,
    :func:`cutlass_nn.ops.fp8_cast`, no second maximum), so only ``x`` and the weight are kept,
    as ``nn.Linear`` keeps them (plus two one-element scales)."""

    @staticmethod
    def forward(ctx, x, weight, bias, scaling, grad_format, fast_accum, out_dtype):
        n, k = weight.shape
        x2 = x.reshape(-1, k)
        weight_q = _quantize(weight, "e4m3", _forward_axis(scaling))
        y, scales = _forward_gemm(x2, weight_q, bias, scaling, out_dtype, fast_accum)
        ctx.save_for_backward(x2, weight, *scales)
        ctx.scaling, ctx.grad_format = scaling, grad_format
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.weight_dtype = weight.dtype
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    @_checks.first_derivative_only("fp8.linear")
    def backward(ctx, grad_output):
        _drop_entry_after_backward()
        x2, weight, *scales = ctx.saved_tensors
        xs, ws = scales if scales else (None, None)
        g2 = grad_output.reshape(-1, weight.shape[0])
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        grad, grad_t = _grad_operands(g2, ctx.scaling, ctx.grad_format, need_x, need_w)
        if need_x:
            dx = _dgrad(grad, _transposed_operand(weight, ws), ctx.x_dtype).reshape(ctx.x_shape)
        if need_w:
            dw = _wgrad(grad_t, x2, xs, ctx.weight_dtype)
        if need_b and ctx.bias_dtype is not None:
            db = g2.float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None


def _gate_up_weight(gate: Tensor, up: Tensor) -> Tensor:
    """``[gate; up]`` as one ``[2n, K]`` operand: a view where ``up`` directly follows ``gate``
    in one storage (the layout :class:`cutlass_nn.GatedMLP` keeps), else a concatenated copy.
    Eager only (storages cannot be compared while tracing: traced code reaches it through the
    ``_fp8_*_gate_up`` operators, which run it on real tensors)."""
    n, k = gate.shape
    if (
        type(gate) in (Tensor, torch.nn.Parameter)
        and type(up) in (Tensor, torch.nn.Parameter)
        and not gate.is_meta
        and gate.is_contiguous()
        and up.is_contiguous()
        and gate.dtype == up.dtype
        and gate.untyped_storage().data_ptr() == up.untyped_storage().data_ptr()
        and up.storage_offset() == gate.storage_offset() + gate.numel()
    ):
        return gate.as_strided((2 * n, k), (k, 1))
    return torch.cat((gate, up))


@torch.library.custom_op("cutlass_nn::_fp8_quantize_gate_up", mutates_args=())
def _fp8_quantize_gate_up(gate: Tensor, up: Tensor, axis: str, transpose: bool) -> tuple[Tensor, Tensor]:
    """:func:`cutlass_nn.ops.fp8_quantize` of ``[gate; up]`` (e4m3) as one operator: what a
    traced FP8 gated MLP calls, so that the storages are compared when it runs (the packed
    weight read in place) instead of concatenated in the graph."""
    return ops.fp8_quantize(_gate_up_weight(gate, up), "e4m3", axis, transpose)


@_fp8_quantize_gate_up.register_fake
def _(gate, up, axis, transpose):
    data_shape, scale_shape = ops._fp8_shapes(2 * gate.shape[0], gate.shape[1], axis, transpose)
    return (gate.new_empty(data_shape, dtype=torch.float8_e4m3fn),
            gate.new_empty(scale_shape, dtype=torch.float32))


@torch.library.custom_op("cutlass_nn::_fp8_cast_gate_up", mutates_args=())
def _fp8_cast_gate_up(gate: Tensor, up: Tensor, scale: Tensor, transpose: bool) -> Tensor:
    """:func:`cutlass_nn.ops.fp8_cast` of ``[gate; up]`` (e4m3) as one operator (see
    :func:`_fp8_quantize_gate_up`)."""
    return ops.fp8_cast(_gate_up_weight(gate, up), scale, "e4m3", transpose)


@_fp8_cast_gate_up.register_fake
def _(gate, up, scale, transpose):
    data_shape, _ = ops._fp8_shapes(2 * gate.shape[0], gate.shape[1], "tensor", transpose)
    return gate.new_empty(data_shape, dtype=torch.float8_e4m3fn)


def _quantize_gate_up(gate: Tensor, up: Tensor, axis: str) -> tuple[Tensor, Tensor]:
    """The forward's quantized ``[gate; up]``: directly in eager mode, through one operator
    while tracing (no concatenation in the graph)."""
    if torch.compiler.is_compiling():
        return torch.ops.cutlass_nn._fp8_quantize_gate_up(gate, up, axis, False)
    return ops.fp8_quantize(_gate_up_weight(gate, up), "e4m3", axis)


def _transposed_gate_up(gate: Tensor, up: Tensor, scale) -> tuple[Tensor, Tensor]:
    """:func:`_transposed_operand` of ``[gate; up]``, through one operator while tracing."""
    if not torch.compiler.is_compiling():
        return _transposed_operand(_gate_up_weight(gate, up), scale)
    if scale is None:
        return torch.ops.cutlass_nn._fp8_quantize_gate_up(gate, up, "column", True)
    return torch.ops.cutlass_nn._fp8_cast_gate_up(gate, up, scale, True), scale


class _Fp8GatedMlp(torch.autograd.Function):
    """``apply(x, gate_w, up_w, down_w, gate_b, up_b, down_b, activation, scaling, grad_format,
    fast_accum, out_dtype)``: ``down(act(gate(x)) * up(x))`` with the gate and up projections as one FP8
    GEMM over ``[gate; up]`` (one quantization of ``x`` for both; tensorwise: one scale for the
    two weights together, rowwise: one per output channel as for separate layers), the gated
    activation on :func:`cutlass_nn.ops.gated_act` (float math, one rounding), the down
    projection an FP8 GEMM. Keeps ``x``, the weights and the gate+up output (plus one-element
    scales); the backward recomputes the activation from that output
    (:func:`cutlass_nn.ops.gated_act_backward`, which also returns the gradient of gate+up in
    one pass). First order only."""

    @staticmethod
    def forward(ctx, x, gate_w, up_w, down_w, gate_b, up_b, down_b, activation, scaling,
                grad_format, fast_accum, out_dtype):
        k = gate_w.shape[1]
        x2 = x.reshape(-1, k)
        gate_up_b = None if gate_b is None else torch.cat((gate_b, up_b))
        axis = _forward_axis(scaling)
        gate_up, scales_gu = _forward_gemm(x2, _quantize_gate_up(gate_w, up_w, axis), gate_up_b,
                                           scaling, out_dtype, fast_accum)
        hidden = ops.gated_act(gate_up, activation)
        # the hidden activation is not saved (the backward recomputes it): not kept for reuse
        y, scales_down = _forward_gemm(hidden, _quantize(down_w, "e4m3", axis), down_b, scaling,
                                       out_dtype, fast_accum, shared=False)
        ctx.save_for_backward(x2, gate_w, up_w, down_w, gate_up, *scales_gu, *scales_down)
        ctx.activation, ctx.scaling, ctx.grad_format = activation, scaling, grad_format
        ctx.x_shape, ctx.x_dtype, ctx.out_dtype = x.shape, x.dtype, out_dtype
        ctx.bias_dtypes = tuple(None if b is None else b.dtype for b in (gate_b, up_b, down_b))
        return y.reshape(*x.shape[:-1], down_w.shape[0])

    @staticmethod
    @_checks.first_derivative_only("fp8.gated_mlp")
    def backward(ctx, grad_output):
        _drop_entry_after_backward()
        x2, gate_w, up_w, down_w, gate_up, *scales = ctx.saved_tensors
        # tensorwise: (x, [gate; up]) then (hidden, down) scales; rowwise: none
        xs, gus, hs, ds = scales if scales else (None,) * 4
        need = ctx.needs_input_grad
        need_gu_bias = ctx.bias_dtypes[0] is not None and (need[4] or need[5])
        need_gu_side = need[0] or need[1] or need[2] or need_gu_bias
        fmt, scaling, n = ctx.grad_format, ctx.scaling, gate_w.shape[0]
        g2 = grad_output.reshape(-1, down_w.shape[0])
        grads = [None] * 12

        grad, grad_t = _grad_operands(g2, scaling, fmt, need_gu_side, need[3])
        if need_gu_side:
            grad_hidden = _dgrad(grad, _transposed_operand(down_w, ds), ctx.out_dtype)
            grad_gate_up, hidden = ops.gated_act_backward(grad_hidden, gate_up, ctx.activation)
            del grad_hidden
        elif need[3]:
            hidden = ops.gated_act(gate_up, ctx.activation)
        else:
            hidden = None  # only the down projection's bias needs a gradient
        del gate_up, grad
        if need[3]:
            grads[3] = _wgrad(grad_t, hidden, hs, down_w.dtype, shared=False)
        del hidden, grad_t
        if ctx.bias_dtypes[2] is not None and need[6]:
            grads[6] = g2.float().sum(0).to(ctx.bias_dtypes[2])
        if not need_gu_side:
            return tuple(grads)

        need_gu_w = need[1] or need[2]
        grad, grad_t = _grad_operands(grad_gate_up, scaling, fmt, need[0], need_gu_w)
        if need[0]:
            weight_t = _transposed_gate_up(gate_w, up_w, gus)
            grads[0] = _dgrad(grad, weight_t, ctx.x_dtype).reshape(ctx.x_shape)
            del weight_t
        del grad
        if need_gu_w:
            grad_w = _wgrad(grad_t, x2, xs, gate_w.dtype)
            grads[1], grads[2] = grad_w[:n], grad_w[n:]
        if need_gu_bias:
            grad_b = grad_gate_up.float().sum(0)
            grads[4] = grad_b[:n].to(ctx.bias_dtypes[0])
            grads[5] = grad_b[n:].to(ctx.bias_dtypes[1])
        return tuple(grads)


#: the dtypes a bias may have (it is rounded to the output dtype before the add)
_BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_bias_dtype(op: str, name: str, bias: Tensor | None) -> None:
    # bias.to(out_dtype) would take any dtype: a bool or int bias would be added as 0 / 1 or
    # integers, a complex one with its imaginary part dropped
    if bias is not None and bias.dtype not in _BIAS_DTYPES:
        raise TypeError(
            f"cutlass_nn.fp8.{op}: argument '{name}' must be None or a floating tensor (float16, "
            f"bfloat16, float32 or float64), got a {bias.dtype} tensor"
        )


def _check(op: str, x, weight, bias, recipe, names=("weight", "bias")) -> None:
    """``x`` [..., in] against ``weight`` [out, in] and ``bias`` [out] or None, with the
    argument names ``names`` (the weight's and the bias's) in the messages."""
    wname, bname = names
    if not isinstance(recipe, Fp8Recipe):
        raise TypeError(
            f"cutlass_nn.fp8.{op}: argument 'recipe' must be a cutlass_nn.fp8.Fp8Recipe, got "
            f"{type(recipe).__name__}"
        )
    for name, t in (("input", x), (wname, weight)):
        if not isinstance(t, Tensor) or t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            got = f"a {t.dtype} tensor" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(
                f"cutlass_nn.fp8.{op}: argument '{name}' must be a float16, bfloat16 or float32 "
                f"tensor, got {got}"
            )
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"cutlass_nn.fp8.{op}: argument 'input' must have a last dimension of "
            f"{weight.shape[1] if weight.dim() == 2 else '?'} ({wname} [out_features, "
            f"in_features] = {list(weight.shape)}), got shape {list(x.shape)}"
        )
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        got = list(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(
            f"cutlass_nn.fp8.{op}: argument '{bname}' must be None or a tensor of shape "
            f"[{weight.shape[0]}], got {got}"
        )
    _check_bias_dtype(op, bname, bias)
    for name, t in ((wname, weight), (bname, bias)):
        if t is not None and t.device != x.device:
            raise ValueError(
                f"cutlass_nn.fp8.{op}: argument '{name}' must be on device {x.device} (the "
                f"device of 'input'), got {t.device}"
            )


def linear(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, recipe: Fp8Recipe = Fp8Recipe()
) -> Tensor:
    """``input @ weight.T + bias`` trained in FP8 (see the module docstring): ``input``
    ``[*, in_features]``, ``weight`` ``[out_features, in_features]``, ``bias``
    ``[out_features]`` or None, ``recipe`` the scaling and gradient format. The output has
    ``input``'s dtype, or the autocast dtype inside ``torch.autocast``; gradients reach
    ``input``, ``weight`` and ``bias`` (first order: a backward with ``create_graph=True``
    raises a RuntimeError). The bias is rounded to the output dtype
    before it is added (as under autocast; the reference adds it in float32, so a float32 bias
    beside a 16-bit input differs from it by that rounding). On Hopper the GEMMs run on the FP8
    kernels for bfloat16 and float32 outputs; a float16 output (float16 inputs, or autocast to
    float16) and a weight gradient over a token count that is not a multiple of 16 take the ATen
    path of :func:`cutlass_nn.ops.fp8_scaled_mm` (correct, much slower)."""
    _check("linear", input, weight, bias, recipe)
    out_dtype = ops._autocast_dtype(input.device.type) or input.dtype
    return _Fp8Linear.apply(input, weight, bias, recipe.scaling, recipe.grad_format,
                            recipe.fast_accum_forward, out_dtype)


def gated_mlp(
    input: Tensor,
    gate_weight: Tensor,
    up_weight: Tensor,
    down_weight: Tensor,
    gate_bias: Tensor | None = None,
    up_bias: Tensor | None = None,
    down_bias: Tensor | None = None,
    activation: str = "silu",
    recipe: Fp8Recipe = Fp8Recipe(),
) -> Tensor:
    """The gated MLP ``down(act(gate(input)) * up(input))`` trained in FP8: ``gate_weight`` and
    ``up_weight`` ``[n, in]``, ``down_weight`` ``[out, n]``, biases optional (gate and up both or
    neither), ``activation`` one of :data:`cutlass_nn.ops.GATED_ACTIVATIONS`.

    What three FP8 :func:`linear` calls and ``act(g) * u`` would compute, with three
    differences that make it faster and leaner: the gate and up projections are one GEMM over
    ``[gate; up]`` (read in place when ``up_weight`` directly follows ``gate_weight`` in one
    storage, as :class:`cutlass_nn.GatedMLP` keeps them), so ``input`` is quantized once for
    both; with tensorwise scaling the two weights share one scale (the maximum over both;
    rowwise scales each output channel alone, as separate layers do); the activation and the
    product are one float computation rounded once (:func:`cutlass_nn.ops.gated_act`), and the
    backward recomputes them from the saved gate+up output instead of keeping the hidden
    activation. The output has ``input``'s dtype (the autocast dtype under ``torch.autocast``);
    gradients reach every tensor argument (first order: a backward with ``create_graph=True``
    raises a RuntimeError)."""
    _check("gated_mlp", input, gate_weight, gate_bias, recipe, ("gate_weight", "gate_bias"))
    for name, t in (("up_weight", up_weight), ("down_weight", down_weight)):
        if not isinstance(t, Tensor) or t.dtype != gate_weight.dtype or t.device != input.device:
            got = f"a {t.dtype} tensor on {t.device}" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(
                f"cutlass_nn.fp8.gated_mlp: argument '{name}' must be a {gate_weight.dtype} tensor "
                f"on {input.device} (as 'gate_weight'), got {got}"
            )
    n, k = gate_weight.shape
    if up_weight.shape != gate_weight.shape:
        raise ValueError(
            f"cutlass_nn.fp8.gated_mlp: argument 'up_weight' must have the shape of "
            f"'gate_weight' ({list(gate_weight.shape)}), got {list(up_weight.shape)}"
        )
    if down_weight.dim() != 2 or down_weight.shape[1] != n:
        raise ValueError(
            f"cutlass_nn.fp8.gated_mlp: argument 'down_weight' must be [out_features, {n}] "
            f"({n} = the gate's out_features), got {list(down_weight.shape)}"
        )
    if (gate_bias is None) != (up_bias is None):
        raise ValueError(
            "cutlass_nn.fp8.gated_mlp: arguments 'gate_bias' and 'up_bias' must both be "
            f"tensors or both None, got {type(gate_bias).__name__} and {type(up_bias).__name__}"
        )
    if up_bias is not None:
        _check("gated_mlp", input, up_weight, up_bias, recipe, ("up_weight", "up_bias"))
    out = down_weight.shape[0]
    if down_bias is not None and (
        not isinstance(down_bias, Tensor)
        or tuple(down_bias.shape) != (out,)
        or down_bias.device != input.device
    ):
        got = (f"shape {list(down_bias.shape)} on {down_bias.device}"
               if isinstance(down_bias, Tensor) else type(down_bias).__name__)
        raise ValueError(
            f"cutlass_nn.fp8.gated_mlp: argument 'down_bias' must be None or a tensor of shape "
            f"[{out}] on {input.device}, got {got}"
        )
    _check_bias_dtype("gated_mlp", "down_bias", down_bias)
    if activation not in ops.GATED_ACTIVATIONS:
        allowed = ", ".join(f'"{a}"' for a in ops.GATED_ACTIVATIONS)
        raise ValueError(
            f"cutlass_nn.fp8.gated_mlp: argument 'activation' must be one of {allowed}, got "
            f"{activation!r}"
        )
    out_dtype = ops._autocast_dtype(input.device.type) or input.dtype
    return _Fp8GatedMlp.apply(input, gate_weight, up_weight, down_weight, gate_bias, up_bias,
                              down_bias, activation, recipe.scaling, recipe.grad_format,
                              recipe.fast_accum_forward, out_dtype)
