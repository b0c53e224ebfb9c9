"""What Inductor (``torch.compile``'s default backend) computes itself of cutlass_nn's operators.

The bias gradient of a linear layer is a column sum of the output gradient. In eager mode
``cutlass_nn::bias_grad`` runs it as its own kernel (faster than torch's reduction: NOTES v0.22).
Under ``torch.compile`` the stock model's column sums are fused by Inductor into the kernel that
produces the gradient (a LayerNorm or GELU backward, for instance) and cost next to nothing, while
an opaque custom operator costs its own pass over the gradient (BERT at hidden 1024, compiled:
14 such passes, 0.22 ms of a 7.7 ms step; NOTES v0.24). So Inductor is given a lowering of
``bias_grad``: its own ``sum`` over the leading dims, the same value (float32 accumulation either
way; the order of the additions may differ, as it does between stock eager and compiled).

A lowering, not a decomposition: Inductor caches its decomposition table at the first compile of
the process (an entry added later is not used, and Inductor then refuses the operator's fallback:
a crash the GPU run of the first version found), while lowerings are looked up when each graph is
lowered; and where the lowering is missing the operator simply runs as itself. Importing Inductor
costs about a second, so cutlass_nn never imports it: :func:`register` adds the lowering only once
Inductor is loaded (``torch.compile`` loads it before tracing) and is called from the fake
implementations of the operators, which Dynamo runs while it traces a graph, before Inductor
lowers it. Other backends (``aot_eager``, ``torch.export``) keep the operator.
"""

from __future__ import annotations

import logging
import sys

import torch

_INDUCTOR_LOWERING = "torch._inductor.lowering"
_logger = logging.getLogger(__name__)
_registered = False
_failed = False


def _lower_bias_grad(grad_output):
    """Inductor lowering of ``bias_grad`` (``grad_output`` is Inductor's IR): ``grad_output``
    summed over every leading dim (a copy of it when it has none), through Inductor's own
    lowerings of ``sum`` / ``clone``: the operator's value and dtype."""
    lowerings = sys.modules[_INDUCTOR_LOWERING].lowerings
    dims = len(grad_output.get_size())
    if dims == 1:  # no leading dim (sum(dim=[]) would sum everything)
        return lowerings[torch.ops.aten.clone.default](grad_output)
    return lowerings[torch.ops.aten.sum.dim_IntList](grad_output, list(range(dims - 1)))


def register() -> bool:
    """Adds cutlass_nn's lowerings to Inductor if Inductor is loaded (idempotent, cheap when
    done). Returns whether they are registered. Never raises: the fake implementations call it
    for every backend (export, ``aot_eager``, opcheck), so a torch whose Inductor lacks the API
    used here (or a module another thread is still importing) must not break them; the operator
    then simply runs as itself under Inductor too (one warning)."""
    global _registered, _failed
    if _registered or _failed:
        return _registered
    lowering = sys.modules.get(_INDUCTOR_LOWERING)
    register_lowering = getattr(lowering, "register_lowering", None)
    if lowering is None or register_lowering is None or not hasattr(lowering, "lowerings"):
        return False  # not loaded (or not fully imported yet): try at the next call
    try:
        register_lowering(torch.ops.cutlass_nn.bias_grad.default,
                          type_promotion_kind=None)(_lower_bias_grad)
    except Exception as exc:  # an Inductor whose lowering API differs
        _failed = True
        _logger.warning("cutlass_nn: bias_grad stays an opaque operator under Inductor (%s: %s)",
                        type(exc).__name__, exc)
        return False
    _registered = True
    return True
