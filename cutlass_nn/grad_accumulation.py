"""Fused weight-gradient accumulation (opt-in, process-wide).

When gradients accumulate over micro-batches (no ``zero_grad`` between backward passes), autograd
normally has each linear layer's backward write a new weight gradient, which ``AccumulateGrad``
then adds into ``weight.grad``: an extra ``[out, in]`` buffer and an extra pass over it per layer
and micro-batch. With fused accumulation on, the weight-gradient GEMM adds into the existing
``weight.grad`` itself (``ops.linear_wgrad_accumulate_``, beta = 1) and autograd receives no
separate gradient for the weight.

It applies to :class:`cutlass_nn.CutlassLinear` / ``functional.linear`` (with or without a fused
activation) when the weight is a plain leaf whose ``.grad`` already exists (the first micro-batch
after ``zero_grad(set_to_none=True)`` takes the usual path), with the weight's shape, dtype and
device; not while building a graph of the gradient (``create_graph``), and not when something
would observe the weight's gradient before accumulation (a tensor hook or ``retain_grad`` on the
weight): those cases take the usual path, so results never change, only where the sum is formed.
The weight's ``AccumulateGrad`` node still runs and fires its post hooks, so DDP (including
``no_sync`` micro-batches and ``gradient_as_bucket_view``) and ``register_post_accumulate_grad_hook``
see the accumulated gradient. Under ``torch.compile`` the compiled backward takes the usual path.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from cutlass_nn import _extension  # noqa: F401  (loads the operators)

__all__ = [
    "fused_wgrad_accumulation",
    "fused_wgrad_accumulation_enabled",
    "set_fused_wgrad_accumulation",
]


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(
            f"cutlass_nn.{name}: argument 'enabled' must be a bool, got {type(value).__qualname__}"
        )


def set_fused_wgrad_accumulation(enabled: bool) -> bool:
    """Turn fused weight-gradient accumulation on or off for the whole process (every thread);
    returns the previous setting."""
    _check_bool("set_fused_wgrad_accumulation", enabled)
    return bool(torch.ops.cutlass_nn._fused_wgrad_accumulation(1 if enabled else 0))


def fused_wgrad_accumulation_enabled() -> bool:
    """Whether fused weight-gradient accumulation is on (off by default)."""
    return bool(torch.ops.cutlass_nn._fused_wgrad_accumulation(-1))


@contextlib.contextmanager
def fused_wgrad_accumulation(enabled: bool = True) -> Iterator[None]:
    """Context manager: fused weight-gradient accumulation on (or off) inside, the previous
    setting restored on exit. Process-wide, like :func:`set_fused_wgrad_accumulation`."""
    _check_bool("fused_wgrad_accumulation", enabled)
    previous = set_fused_wgrad_accumulation(enabled)
    try:
        yield
    finally:
        set_fused_wgrad_accumulation(previous)
