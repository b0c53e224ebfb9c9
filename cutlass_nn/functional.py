"""Functional forms of the cutlass_nn layers, drop-ins for their ``torch`` counterparts.

Each call dispatches to a ``torch.ops.cutlass_nn`` operator, so it works under autograd,
``torch.compile`` and from C++ alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cutlass_nn import _checks
from cutlass_nn import ops
from cutlass_nn.linear_cross_entropy import linear_cross_entropy

# The operator overloads themselves: a call is one dispatcher call (autocast, autograd and the
# kernel all run in C++), and torch.compile traces them as the custom ops they are.
_linear = torch.ops.cutlass_nn.linear.default
_linear_act = torch.ops.cutlass_nn.linear_act.default
_mm = torch.ops.cutlass_nn.mm.default
_add2 = torch.ops.cutlass_nn.add2.default
_rms_norm = torch.ops.cutlass_nn.rms_norm.default
_add_rms_norm = torch.ops.cutlass_nn.add_rms_norm.default
_gated_act = torch.ops.cutlass_nn.gated_act.default
_gated_mlp = torch.ops.cutlass_nn.gated_mlp.default
_rotary_embedding = torch.ops.cutlass_nn.rotary_embedding.default

# Under torch.compile, a 16-bit CUDA linear layer with at least this many weight elements whose
# out_features is not a multiple of 8 (a language-model head over a vocabulary such as GPT-2's
# 50257 or BERT's 30522) runs as the layer padded to the next multiple of 8 rows, its output
# sliced back (_linear_padded_rows).
_PAD_ROWS_MIN_WEIGHT = 1 << 20


def _pads_rows_when_compiled(weight: Tensor) -> bool:
    """Whether torch.compile is tracing a linear layer whose output rows would not be 16-byte
    multiples, on a CUDA device in 16-bit (or under CUDA autocast).

    The operator itself runs such layers on padded copies (its TMA kernels need 16-byte row
    strides), in separate passes: a padded result copied back, the gradient padded for each
    backward GEMM. Traced as padded weight -> aligned GEMM -> slice instead, Inductor fuses the
    padding into the kernels around the GEMMs, as it does for the stock model's (its shape
    padding; NOTES v0.23: the compiled GPT-2-vocabulary model at 0.75x stock without this)."""
    if not torch.compiler.is_compiling() or weight.dim() != 2 or weight.device.type != "cuda":
        return False
    rows, cols = weight.shape
    half = weight.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled("cuda")
    return half and rows % 8 != 0 and rows * cols >= _PAD_ROWS_MIN_WEIGHT


def _linear_padded_rows(input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``linear(input, weight, bias)`` computed with ``weight`` (and ``bias``) padded with zero
    rows to a multiple of 8 and the extra output columns sliced off: the same values, returned
    contiguous like ``F.linear``'s. Inductor fuses the weight's padding and the slice's copy into
    its own kernels, but the copy is a second output-sized buffer beside the padded GEMM output
    while it is made (a language-model head's logits: NOTES v0.24)."""
    rows = weight.shape[0]
    pad = -rows % 8
    weight = torch.nn.functional.pad(weight, (0, 0, 0, pad))
    bias = None if bias is None else torch.nn.functional.pad(bias, (0, pad))
    return _linear(input, weight, bias)[..., :rows].contiguous()


def _plain_linear(input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The linear layer without an activation, for :func:`linear` and ``CutlassLinear``: one
    operator call, or under torch.compile the padded-rows form where it applies."""
    if _pads_rows_when_compiled(weight):
        return _linear_padded_rows(input, weight, bias)
    return _linear(input, weight, bias)


__all__ = [
    "linear",
    "mm",
    "add2",
    "rms_norm",
    "add_rms_norm",
    "gated_act",
    "gated_mlp",
    "linear_cross_entropy",
    "apply_rotary_pos_emb",
]


def linear(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None
) -> Tensor:
    """Drop-in for ``torch.nn.functional.linear``: ``input @ weight.T + bias``, optionally
    followed by a fused activation.

    Args:
        input: ``[*, in_features]``, any number of leading dims (including empty batches).
        weight: ``[out_features, in_features]``, same dtype and device as ``input``.
        bias: optional ``[out_features]``.
        activation: ``None`` / ``"none"`` (plain linear), ``"relu"``, ``"gelu"`` or
            ``"gelu_tanh"``: ``F.relu``, ``F.gelu(approximate="none")``,
            ``F.gelu(approximate="tanh")`` applied to the result, fused into the GEMM epilogue
            where the GPU kernel supports it (the bias add and activation in fp32, rounded
            once). Any other value raises a RuntimeError naming the allowed values.

    Returns:
        ``[*, out_features]`` in the dtype of ``input``. Differentiable (twice) in every
        argument; the backward runs the cutlass_nn activation-gradient / dgrad / wgrad /
        bias-gradient operators. One operator call: ``linear``, or ``linear_act``, whose
        autograd kernel runs the fused GEMM that also keeps the pre-activation for the
        backward when gradients are needed. Follows ``torch.autocast`` like ``F.linear``.
    """
    # The operators take None for a tensor as an undefined tensor and fail with a message that
    # does not say so: which argument is not a tensor is found out after a failure (a try costs
    # nothing when nothing is raised), so that a correct call pays nothing for the check.
    try:
        if activation is None or activation == "none":
            return _plain_linear(input, weight, bias)
        ops._check_activation_type("linear_act", activation)
        return _linear_act(input, weight, bias, activation)
    except Exception:
        _checks.check_tensors("linear", {"input": input, "weight": weight, "bias": bias}, ("bias",))
        raise


def mm(a: Tensor, b: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Drop-in for ``torch.mm``: the matrix product of ``a`` [n, m] and ``b`` [m, p].

    Args:
        a: 2-D tensor [n, m].
        b: 2-D tensor [m, p] with the dtype and device of ``a``.
        out: optional output; must have the dtype and device of ``a``. Like ``torch.mm``, an
            ``out`` of another shape is resized (with PyTorch's warning when it was not empty),
            a non-contiguous ``out`` receives the result in place, and ``out`` is returned.
            Not differentiable (as with torch, ``out=`` and autograd do not mix).

    Returns:
        ``[n, p]``: a new tensor, or ``out``.
    """
    if out is None:
        try:
            return _mm(a, b)
        except Exception:  # see linear
            _checks.check_tensors("mm", {"a": a, "b": b})
            raise
    _checks.check_tensors("mm", {"a": a, "b": b, "out": out}, ("out",))
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or out.requires_grad):
        raise RuntimeError(
            "cutlass_nn.mm: functions with out=... arguments don't support automatic "
            "differentiation, but one of the arguments requires grad"
        )
    return ops._mm_out(a, b, out, stacklevel=3)  # the warning names our caller


def add2(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise ``a + b`` for tensors of the same shape, dtype and device (no broadcasting).

    Returns:
        A new tensor; differentiable in both arguments.
    """
    try:
        return _add2(a, b)
    except Exception:  # see linear
        _checks.check_tensors("add2", {"a": a, "b": b})
        raise


def _eps(op: str, eps, input: Tensor) -> float:
    """``eps`` as the operator takes it: a real number (not a string float() would parse), or
    for None torch.nn.functional.rms_norm's default, the machine epsilon of the input's dtype."""
    if eps is None:
        # A dtype without one (integers, complex) gets any value: the operator then rejects the
        # dtype naming the argument, eager and traced (torch.finfo would raise a TypeError that
        # names neither, and break torch.compile's tracing).
        dtype = input.dtype
        return torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    if type(eps) is float:
        return eps
    return _checks.check_real(op, "eps", eps)


def rms_norm(input: Tensor, weight: Tensor, eps: float | None = None) -> Tensor:
    """RMSNorm over the last dimension, forward and backward in one pass each:
    ``input * rsqrt(mean(input^2, -1) + eps) * weight``.

    The drop-in for ``torch.nn.functional.rms_norm(input, (features,), weight, eps)`` and for
    the RMSNorm of Llama-style ``transformers`` models; the statistics are float32 (float64 for
    float64 input) and the output is rounded once.

    Args:
        input: ``[*, features]``, a floating dtype.
        weight: ``[features]``, ``input``'s dtype or float32 (a float32 master weight beside
            16-bit activations; the output keeps ``input``'s dtype).
        eps: added to the mean square; None (default) is ``torch.finfo(input.dtype).eps``,
            as in torch.

    Returns:
        ``[*, features]`` in ``input``'s dtype (contiguous). Differentiable in ``input`` and
        ``weight``, also twice (with ``create_graph`` the backward is written with torch ops).
    """
    try:
        return _rms_norm(input, weight, _eps("rms_norm", eps, input))[0]
    except Exception:  # see linear
        _checks.check_tensors("rms_norm", {"input": input, "weight": weight})
        raise


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float | None = None
) -> tuple[Tensor, Tensor]:
    """The residual add of a pre-norm transformer block fused with the RMSNorm that follows it:
    ``h = x + residual; return rms_norm(h, weight, eps), h``, in one pass over the activations
    (and one in the backward).

    Args:
        x, residual: tensors of the same shape ``[*, features]``; of different floating dtypes
            they are first promoted to their common dtype, as ``x + residual`` would be.
        weight, eps: as for :func:`rms_norm`.

    Returns:
        ``(out, h)``: the normalized output and the new residual ``h`` (rounded to the dtype
        exactly as the unfused add is, and normalized as stored). Differentiable in all three
        tensors.
    """
    try:
        if x.dtype != residual.dtype:
            common = torch.result_type(x, residual)
            x, residual = x.to(common), residual.to(common)
        out, h, _ = _add_rms_norm(x, residual, weight, _eps("add_rms_norm", eps, x))
    except Exception:  # see linear
        _checks.check_tensors("add_rms_norm", {"x": x, "residual": residual, "weight": weight})
        raise
    return out, h


def _check_gated_activation_type(op: str, activation) -> None:
    # As for linear: a non-string would fail in the dispatcher's argument parsing with a message
    # that does not name the argument. The values themselves are checked by the operators.
    if not isinstance(activation, str):
        allowed = ", ".join(f'"{a}"' for a in ops.GATED_ACTIVATIONS)
        raise RuntimeError(
            f"cutlass_nn.{op}: argument 'activation' must be one of {allowed}, got {activation!r}"
        )


def gated_act(gate_up: Tensor, activation: str = "silu") -> Tensor:
    """The gating of a gated MLP: ``act(gate) * up`` for ``gate_up = [gate | up]``.

    Args:
        gate_up: ``[*, 2n]``, a floating dtype: the gate projection in the first ``n`` columns,
            the up projection in the last ``n`` (the output of one GEMM against the stacked
            ``[gate_weight; up_weight]``).
        activation: ``"silu"`` (default; ``F.silu``), ``"gelu"`` (``F.gelu``) or
            ``"gelu_tanh"`` (``F.gelu(approximate="tanh")``); any other value raises a
            RuntimeError naming the allowed values.

    Returns:
        ``[*, n]`` in ``gate_up``'s dtype, computed in float32 (float64 for float64) and rounded
        once. Differentiable, also twice.
    """
    _check_gated_activation_type("gated_act", activation)
    try:
        return _gated_act(gate_up, activation)
    except Exception:  # see linear
        _checks.check_tensors("gated_act", {"gate_up": gate_up})
        raise


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
    """The gated MLP of Llama-style transformers as one operator:
    ``linear(act(linear(input, gate_weight, gate_bias)) * linear(input, up_weight, up_bias),
    down_weight, down_bias)``.

    The gate and up projections run as one GEMM, followed by :func:`gated_act`. That GEMM reads
    the weights in place when ``up_weight`` directly follows ``gate_weight`` in one storage
    (both contiguous, same shape and dtype) -- the layout :class:`cutlass_nn.GatedMLP` keeps;
    separate tensors give the same result but are concatenated on every call. The backward
    keeps only ``input`` and the gate+up output and recomputes the gated activation.

    Args:
        input: ``[*, in]`` (empty batches allowed).
        gate_weight, up_weight: ``[n, in]``, ``input``'s dtype and device.
        down_weight: ``[out, n]``.
        gate_bias, up_bias: optional ``[n]``; both or neither.
        down_bias: optional ``[out]``.
        activation: ``"silu"`` (default), ``"gelu"`` or ``"gelu_tanh"``, as for
            :func:`gated_act`.

    Returns:
        ``[*, out]`` in ``input``'s dtype. Differentiable in every tensor argument, also twice.
        Follows ``torch.autocast`` like ``F.linear``.
    """
    _check_gated_activation_type("gated_mlp", activation)
    return _gated_mlp(
        input, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias, activation
    )


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary_fits(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether rotary_embedding takes these [B, H, S, D] operands (its checks, as a predicate)."""
    return (
        cos.dim() == 3
        and q.dtype == k.dtype == cos.dtype == sin.dtype
        and q.dtype in ops._FLOAT_DTYPES
        and q.device == k.device == cos.device == sin.device
        and sin.shape == cos.shape
        and q.shape[3] % 2 == 0
        and k.shape[0] == q.shape[0]
        and k.shape[2] == q.shape[2] == cos.shape[1]
        and k.shape[3] == q.shape[3] == cos.shape[2]
        and cos.shape[0] in (1, q.shape[0])
    )


def _promoted(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
    """The four in the dtype torch's promotion gives the formula's results, when q, k share one
    floating dtype and cos, sin another (16-bit q and k beside float32 tables under autocast):
    an exact up-cast, so the operator in that dtype computes the formula's products and sums
    bitwise. Anything else is returned unchanged (and then runs the formula unless it fits)."""
    if q.dtype == k.dtype == cos.dtype == sin.dtype or not (q.dtype == k.dtype and cos.dtype == sin.dtype):
        return q, k, cos, sin
    dtype = torch.promote_types(q.dtype, cos.dtype)
    if q.dtype not in ops._FLOAT_DTYPES or cos.dtype not in ops._FLOAT_DTYPES:
        return q, k, cos, sin
    return tuple(t if t.dtype == dtype else t.to(dtype) for t in (q, k, cos, sin))


def apply_rotary_pos_emb(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """Drop-in for ``transformers``' ``apply_rotary_pos_emb`` (Llama, Mistral, Qwen2, Qwen3):
    ``(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin)`` with ``cos`` and ``sin``
    unsqueezed at ``unsqueeze_dim`` and ``rotate_half(x) = [-x2, x1]``.

    With q ``[B, Hq, S, D]``, k ``[B, Hk, S, D]`` and cos, sin ``[B or 1, S, D]`` of q's dtype
    (``unsqueeze_dim=1``), or the same with heads and positions swapped (``unsqueeze_dim=2``,
    taken as a free transposed view), both are rotated by one
    :func:`cutlass_nn.ops.rotary_embedding` call: one pass each way instead of the formula's
    ten elementwise kernels, in float and rounded once (the formula rounds each product and the
    sum to 16 bits). 16-bit q and k beside float32 cos and sin (a model in float32 under
    autocast) are first cast to float32, the dtype the formula's promotion gives, so the
    operator computes the formula's float32 results bitwise. Anything else (other dtype mixes,
    ranks or broadcasts) runs the formula itself, so the result is always the function's."""
    if unsqueeze_dim in (1, 2, -3, -2) and q.dim() == 4 and k.dim() == 4:
        q, k, cos, sin = _promoted(q, k, cos, sin)
        heads_first = unsqueeze_dim in (1, -3)
        qt = q if heads_first else q.transpose(1, 2)
        kt = k if heads_first else k.transpose(1, 2)
        if _rotary_fits(qt, kt, cos, sin):
            q_out, k_out = _rotary_embedding(qt, kt, cos, sin)
            if heads_first:
                return q_out, k_out
            return q_out.transpose(1, 2), k_out.transpose(1, 2)
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
