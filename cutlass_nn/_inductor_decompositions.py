"""What Inductor (``torch.compile``'s default backend) may decompose of cutlass_nn's operators.

The bias gradient of a linear layer is a column sum of the output gradient. In eager mode
``cutlass_nn::bias_grad`` runs it as its own kernel (faster than torch's reduction: NOTES v0.22).
Under ``torch.compile`` the stock model's column sums are fused by Inductor into the kernel that
produces the gradient (a LayerNorm or GELU backward, for instance) and cost next to nothing, while
an opaque custom operator costs its own pass over the gradient (BERT at hidden 1024, compiled:
14 such passes, 0.22 ms of a 7.7 ms step; NOTES v0.24). So Inductor is given a decomposition of
``bias_grad`` into ``sum`` over the leading dims, the same value (float32 accumulation either way;
the order of the additions may differ, as it does between stock eager and compiled).

The decomposition goes into Inductor's own table (``torch._inductor.decomposition``), which
compile_fx reads when it starts compiling a graph (after Dynamo traced it). Importing that module
costs about a second, so cutlass_nn never imports it: :func:`register` adds the entry only once
Inductor is loaded (``torch.compile`` loads it before tracing), and is called from the fake
implementations of the operators, which Dynamo runs while it traces a graph, before compile_fx.
Other backends (``aot_eager``, ``torch.export``) keep the operator.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

_INDUCTOR_DECOMPOSITIONS = "torch._inductor.decomposition"
_registered = False


def bias_grad_as_sum(grad_output: Tensor) -> Tensor:
    """``cutlass_nn::bias_grad`` in aten terms: ``grad_output`` summed over every leading dim."""
    if grad_output.dim() == 1:  # no leading dim: the gradient itself (sum(dim=()) would sum all)
        return grad_output.clone()
    return grad_output.sum(dim=tuple(range(grad_output.dim() - 1)))


def register() -> bool:
    """Adds cutlass_nn's decompositions to Inductor's table if Inductor is loaded (idempotent,
    cheap when done). Returns whether they are in the table."""
    global _registered
    if _registered:
        return True
    table_module = sys.modules.get(_INDUCTOR_DECOMPOSITIONS)
    if table_module is None:
        return False
    table = table_module.decompositions
    table.setdefault(torch.ops.cutlass_nn.bias_grad.default, bias_grad_as_sum)
    _registered = True
    return True
