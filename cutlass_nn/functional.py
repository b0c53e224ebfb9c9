"""Functional forms of the cutlass_nn layers, drop-ins for their ``torch`` counterparts.

Each call dispatches to a ``torch.ops.cutlass_nn`` operator, so it works under autograd,
``torch.compile`` and from C++ alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cutlass_nn import ops

__all__ = ["linear", "mm", "add2"]


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Drop-in for ``torch.nn.functional.linear``: ``input @ weight.T + bias``.

    Args:
        input: ``[*, in_features]``, any number of leading dims (including empty batches).
        weight: ``[out_features, in_features]``, same dtype and device as ``input``.
        bias: optional ``[out_features]``.

    Returns:
        ``[*, out_features]`` in the dtype of ``input``. Differentiable in every argument; the
        backward runs the cutlass_nn dgrad / wgrad / bias-gradient operators.
    """
    return ops.linear(input, weight, bias)


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
