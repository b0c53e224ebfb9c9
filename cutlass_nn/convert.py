"""Swap ``nn.Linear`` layers of an existing model for ``CutlassLinear``."""

from __future__ import annotations

import warnings
from typing import Any, Callable

from torch import nn

from cutlass_nn import autotune
from cutlass_nn.modules import CutlassLinear

__all__ = ["convert"]

FilterFn = Callable[[str, nn.Module], bool]


def convert(
    module: nn.Module, filter_fn: FilterFn | None = None, *, example_inputs: Any = None
) -> nn.Module:
    """Replace, in place, every submodule whose type is exactly ``nn.Linear`` by a
    ``CutlassLinear`` sharing the same parameters.

    Subclasses of ``nn.Linear`` are left alone on purpose: e.g. the output projection inside
    ``nn.MultiheadAttention`` is such a subclass, and the attention reads its ``.weight``
    directly instead of calling it. Outputs of the model are unchanged (the same parameters go
    through the same arithmetic); an ``nn.Linear`` reachable under several names is replaced by
    one shared ``CutlassLinear``.

    Args:
        module: the model. If it is itself an ``nn.Linear``, the converted layer is returned
            (a root cannot be replaced in place).
        filter_fn: optional ``filter_fn(qualified_name, linear) -> bool``; only layers it accepts
            are converted. The root's name is ``""``.
        example_inputs: optional inputs of one training step (a tuple of positional arguments,
            a dict of keyword arguments, or one tensor). When given, the converted model runs
            one forward and backward on them with autotune on (:func:`cutlass_nn.autotune.tune`:
            every GEMM problem met gets its fastest kernel configuration, kept for the rest of
            the process; no ``.grad``, buffer or random state is changed), and what was picked
            is logged on the ``cutlass_nn.autotune`` logger (``cutlass_nn.autotune.entries()``
            lists it).

    Returns:
        ``module`` (converted in place), or the new root layer.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``, or ``filter_fn`` is not callable
            (nothing is changed).

    Warns:
        ``UserWarning`` when no layer was converted.
    """

    if not isinstance(module, nn.Module):
        raise TypeError(
            f"cutlass_nn.convert: argument 'module' must be a torch.nn.Module, got "
            f"{type(module).__module__}.{type(module).__qualname__}"
        )
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(
            "cutlass_nn.convert: argument 'filter_fn' must be None or a callable "
            f"filter_fn(name, module) -> bool, got {type(filter_fn).__qualname__}"
        )

    def accepted(name: str, child: nn.Module) -> bool:
        return type(child) is nn.Linear and (filter_fn is None or filter_fn(name, child))

    if accepted("", module):
        root = CutlassLinear.from_linear(module)
        if example_inputs is not None:
            autotune.tune(root, example_inputs)
        return root

    replaced: dict[int, CutlassLinear] = {}
    for parent_name, parent in list(module.named_modules(remove_duplicate=False)):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) in replaced:
                setattr(parent, child_name, replaced[id(child)])
            elif accepted(name, child):
                replaced[id(child)] = CutlassLinear.from_linear(child)
                setattr(parent, child_name, replaced[id(child)])
    if not replaced:
        warnings.warn(
            f"cutlass_nn.convert: no nn.Linear layer of this {type(module).__name__} was converted "
            "(none found, or filter_fn rejected them all)",
            stacklevel=2,
        )
    if example_inputs is not None:
        autotune.tune(module, example_inputs)
    return module
