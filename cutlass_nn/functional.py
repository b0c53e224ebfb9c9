"""Functional forms of the cutlass_nn layers, drop-ins for their ``torch`` counterparts.

Each call dispatches to a ``torch.ops.cutlass_nn`` operator, so it works under autograd,
``torch.compile`` and from C++ alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cutlass_nn import ops

__all__ = ["linear", "mm", "add2"]


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
        bias-gradient operators. When gradients are needed the call runs ``linear_act_aux``,
        which also keeps the pre-activation for the backward; otherwise ``linear_act``.
    """
    if activation is None or activation == "none":
        return ops.linear(input, weight, bias)
    needs_grad = torch.is_grad_enabled() and (
        input.requires_grad
        or weight.requires_grad
        or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        return ops.linear_act_aux(input, weight, bias, activation)[0]
    return ops.linear_act(input, weight, bias, activation)


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
        return ops.mm(a, b)
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
    return ops.add2(a, b)
