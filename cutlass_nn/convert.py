"""Swap ``nn.Linear`` layers (and, on request, RMSNorms) of an existing model for the cutlass_nn
modules."""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable

from torch import nn

from cutlass_nn import autotune
from cutlass_nn.modules import CutlassLinear, RMSNorm

_log = logging.getLogger("cutlass_nn.convert")

#: RMSNorm classes of ``transformers`` whose forward is ``weight * (x.float() * rsqrt(mean(x^2)
#: + variance_epsilon)).to(x.dtype)`` (Gemma's ``1 + weight`` form is not among them).
LLAMA_STYLE_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})


def _is_convertible_norm(child: nn.Module) -> bool:
    if type(child) is nn.RMSNorm:
        return child.weight is not None and len(child.normalized_shape) == 1
    return (
        type(child).__name__ in LLAMA_STYLE_NORMS
        and type(child).__module__.startswith("transformers.")
        and getattr(child, "weight", None) is not None
        and child.weight.dim() == 1
        and isinstance(getattr(child, "variance_epsilon", None), float)
    )

__all__ = ["convert"]

FilterFn = Callable[[str, nn.Module], bool]


def convert(
    module: nn.Module,
    filter_fn: FilterFn | None = None,
    *,
    example_inputs: Any = None,
    fuse_norm: bool = False,
) -> nn.Module:
    """Replace, in place, every submodule whose type is exactly ``nn.Linear`` by a
    ``CutlassLinear`` sharing the same parameters (and, with ``fuse_norm``, every RMSNorm it
    recognizes by a :class:`cutlass_nn.RMSNorm` sharing the weight).

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
        fuse_norm: also replace the RMSNorms: modules of exactly type ``nn.RMSNorm`` (with a
            weight, one normalized dimension) and the Llama-style RMSNorms of ``transformers``
            (:data:`LLAMA_STYLE_NORMS`: Llama, Mistral, Qwen2, Qwen3), whose forward and
            backward then run as one kernel each. ``state_dict`` keys do not change.
            ``filter_fn`` is asked about them too (it sees only the candidate modules).

    What was converted is logged on the ``cutlass_nn.convert`` logger (INFO).

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

    def replacement(name: str, child: nn.Module) -> nn.Module | None:
        """The cutlass_nn module for ``child``, or None to leave it."""
        if type(child) is nn.Linear:
            make = CutlassLinear.from_linear
        elif fuse_norm and _is_convertible_norm(child):
            make = RMSNorm.from_module
        else:
            return None
        # filter_fn sees the candidates only
        return make(child) if filter_fn is None or filter_fn(name, child) else None

    root = replacement("", module)
    if root is not None:
        if example_inputs is not None:
            autotune.tune(root, example_inputs)
        return root

    replaced: dict[int, nn.Module] = {}
    for parent_name, parent in list(module.named_modules(remove_duplicate=False)):
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) in replaced:
                setattr(parent, child_name, replaced[id(child)])
                continue
            new = replacement(name, child)
            if new is not None:
                replaced[id(child)] = new
                setattr(parent, child_name, new)
    linears = sum(isinstance(m, CutlassLinear) for m in replaced.values())
    _log.info(
        "cutlass_nn.convert: %d nn.Linear -> CutlassLinear, %d RMSNorm -> cutlass_nn.RMSNorm",
        linears,
        len(replaced) - linears,
    )
    if not replaced:
        warnings.warn(
            f"cutlass_nn.convert: no {'nn.Linear or RMSNorm' if fuse_norm else 'nn.Linear'} "
            f"layer of this {type(module).__name__} was converted "
            "(none found, or filter_fn rejected them all)",
            stacklevel=2,
        )
    if example_inputs is not None:
        autotune.tune(module, example_inputs)
    return module
