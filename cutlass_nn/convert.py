"""Swap ``nn.Linear`` layers (and, on request, RMSNorms and gated MLPs) of an existing model for
the cutlass_nn modules."""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable

from torch import nn

from cutlass_nn import _checks
from cutlass_nn import autotune
from cutlass_nn import fp8
from cutlass_nn.fp8_reference import Fp8Recipe
from cutlass_nn.fused_decoder import can_fuse_residual_norm, fuse_residual_norm, is_fused
from cutlass_nn.fused_head import CAUSAL_LMS, can_fuse_lm_head, fuse_lm_head
from cutlass_nn import fused_rotary
from cutlass_nn.modules import (
    CutlassLinear,
    GatedMLP,
    RMSNorm,
    _check_precision,
    _gated_activation_of,
    _gated_mlp_problem,
)

_log = logging.getLogger("cutlass_nn.convert")

#: RMSNorm classes of ``transformers`` whose forward is ``weight * (x.float() * rsqrt(mean(x^2)
#: + variance_epsilon)).to(x.dtype)`` (Gemma's ``1 + weight`` form is not among them).
LLAMA_STYLE_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})

#: Gated MLP classes of ``transformers`` whose forward is
#: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (checked against transformers 5.24 and 5.25; the
#: activation comes from ``act_fn``: SiLU for Llama / Mistral / Qwen, tanh GELU for Gemma).
GATED_MLPS = frozenset(
    {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP", "GemmaMLP", "Gemma2MLP", "Gemma3MLP"}
)


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


def _is_convertible_mlp(child: nn.Module) -> bool:
    # by class name, as for the norms: the formula is the class's, and transformers need not be
    # importable; the structure and activation are checked on the instance
    return (
        type(child).__name__ in GATED_MLPS
        and type(child).__module__.startswith("transformers.")
        and _gated_mlp_problem(child) is None
        and _gated_activation_of(getattr(child, "act_fn", None)) is not None
    )


__all__ = ["convert"]

FilterFn = Callable[[str, nn.Module], bool]


def convert(
    module: nn.Module,
    filter_fn: FilterFn | None = None,
    *,
    example_inputs: Any = None,
    fuse_norm: bool = False,
    fuse_mlp: bool = False,
    fuse_head: bool = False,
    fuse_rope: bool = False,
    precision: str | None = None,
    fp8_recipe: Fp8Recipe | None = None,
) -> nn.Module:
    """Replace, in place, every submodule whose type is exactly ``nn.Linear`` by a
    ``CutlassLinear`` sharing the same parameters (and, with ``fuse_norm``, every RMSNorm it
    recognizes by a :class:`cutlass_nn.RMSNorm` sharing the weight; with ``fuse_mlp``, every
    gated MLP it recognizes by a :class:`cutlass_nn.GatedMLP` sharing the parameters).

    Subclasses of ``nn.Linear`` are left alone on purpose: e.g. the output projection inside
    ``nn.MultiheadAttention`` is such a subclass, and the attention reads its ``.weight``
    directly instead of calling it. Outputs of the model are unchanged (the same parameters go
    through the same arithmetic); a module reachable under several names is replaced by one
    shared replacement.

    Args:
        module: the model. If it is itself an ``nn.Linear`` (or, with the options, an RMSNorm
            or gated MLP it recognizes), the converted module is returned (a root cannot be
            replaced in place).
        filter_fn: optional ``filter_fn(qualified_name, module) -> bool``; only modules it
            accepts are converted. The root's name is ``""``. Its answer must be a bool
            (Python's or NumPy's): any other is a TypeError, and the model is left as it was.
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
            ``filter_fn`` is asked about them too (it sees only the candidate modules). Then, in
            each ``transformers`` decoder layer it recognizes
            (:data:`cutlass_nn.fused_decoder.DECODER_LAYERS`: Llama, Mistral, Qwen2, Qwen3,
            checked on the source of their forward), the residual add before
            ``post_attention_layernorm`` is fused with that norm
            (:func:`cutlass_nn.fused_decoder.fuse_residual_norm`: one
            :func:`~cutlass_nn.functional.add_rms_norm` call; the layer keeps its class and
            ``state_dict``); ``filter_fn`` is asked about each such layer.
        fuse_mlp: also replace the gated MLPs of ``transformers`` (:data:`GATED_MLPS`: Llama,
            Mistral, Qwen2, Qwen3, Gemma 1-3) whose projections are plain ``nn.Linear`` layers
            and whose ``act_fn`` is SiLU, GELU or tanh GELU, by :meth:`GatedMLP.from_module`
            (one operator: gate and up as one GEMM, the gated activation fused). ``state_dict``
            keys do not change; the gate and up weights are re-laid-out into one buffer (same
            Parameter objects). ``filter_fn`` is asked about the MLP (with its qualified name)
            before its projections; an MLP it refuses keeps its class and its ``nn.Linear``
            projections are considered one by one. The projections of a replaced MLP are not
            visited again (they are the GatedMLP's own ``CutlassLinear`` layers).
        fuse_head: also make a ``transformers`` causal LM (:data:`cutlass_nn.fused_head.CAUSAL_LMS`)
            compute its training loss with :func:`cutlass_nn.functional.linear_cross_entropy`
            (:func:`cutlass_nn.fuse_lm_head`: a forward with ``labels`` returns the loss and
            ``logits=None``, without ever forming the logits; without ``labels`` it is
            unchanged). Applies to ``module`` itself; a model it does not support is left as is,
            with a ``UserWarning``. ``filter_fn`` is not asked.
        fuse_rope: also make the rotary position embedding of each ``transformers`` attention
            layer it recognizes (:data:`cutlass_nn.fused_rotary.ATTENTION_LAYERS`: Llama,
            Mistral, Qwen2, Qwen3, whose module's ``apply_rotary_pos_emb`` is checked on its
            source) one :func:`cutlass_nn.functional.apply_rotary_pos_emb` call
            (:func:`cutlass_nn.fused_rotary.fuse_rotary`: the layer keeps its class, its code
            and ``state_dict``); ``filter_fn`` is asked about each such layer.
        precision: None (default) or ``"none"`` (the same: plain layers), or ``"fp8"``: the
            converted ``nn.Linear`` layers whose shape
            passes :func:`cutlass_nn.fp8.eligible` (both dimensions at least
            :data:`cutlass_nn.fp8.MIN_FEATURES` and multiples of 16) train in FP8
            (``CutlassLinear(precision="fp8")``; with ``fuse_mlp``, the gated MLPs whose gate
            projection passes it become ``GatedMLP(precision="fp8")``); the others are converted
            as without it.
        fp8_recipe: with ``precision="fp8"``, the :class:`cutlass_nn.fp8.Fp8Recipe` of those
            layers (default: tensorwise, e4m3 gradients).

    What was converted is logged on the ``cutlass_nn.convert`` logger (INFO), with
    ``precision="fp8"`` also which layers run in FP8 and which stay in their dtype.

    Returns:
        ``module`` (converted in place), or the new root module.

    Raises:
        TypeError: ``module`` is not an ``nn.Module``, ``filter_fn`` is not callable or answers
            something other than a bool, a ``fuse_*`` flag is not a bool, or ``fp8_recipe`` is
            not an ``Fp8Recipe`` (nothing is changed).
        ValueError: ``precision`` is not None, ``"none"`` or ``"fp8"``, or ``fp8_recipe`` without
            ``precision="fp8"`` (nothing is changed).

        Whatever ``filter_fn`` or the run on ``example_inputs`` raises propagates, and every
        module replaced or fused until then is put back: the model is left as it was (the gate
        and up weights of a gated MLP it had converted keep the one-buffer layout, with the same
        values and Parameter objects).

    Warns:
        ``UserWarning`` when no module was converted.
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
    if filter_fn is not None:
        filter_fn = _strict_filter(filter_fn)
    for name, flag in (("fuse_norm", fuse_norm), ("fuse_mlp", fuse_mlp),
                       ("fuse_head", fuse_head), ("fuse_rope", fuse_rope)):
        _checks.check_bool("convert", name, flag)  # bool("no") would be True
    recipe = _check_precision("convert", precision, fp8_recipe)
    fp8_layers: list[str] = []
    kept_layers: list[str] = []

    def linear_replacement(name: str, child: nn.Linear) -> CutlassLinear:
        if recipe is None:
            return CutlassLinear.from_linear(child)
        if fp8.eligible(child.in_features, child.out_features):
            fp8_layers.append(name)
            return CutlassLinear.from_linear(child, precision="fp8", fp8_recipe=recipe)
        kept_layers.append(name)
        return CutlassLinear.from_linear(child)

    def mlp_replacement(name: str, child: nn.Module) -> GatedMLP:
        gate = child.gate_proj
        if recipe is not None and fp8.eligible(gate.in_features, gate.out_features):
            fp8_layers.append(name)
            return GatedMLP.from_module(child, precision="fp8", fp8_recipe=recipe)
        if recipe is not None:
            kept_layers.append(name)
        return GatedMLP.from_module(child)

    def replacement(name: str, child: nn.Module) -> nn.Module | None:
        """The cutlass_nn module for ``child``, or None to leave it."""
        if type(child) is nn.Linear:
            make = functools.partial(linear_replacement, name)
        elif fuse_norm and _is_convertible_norm(child):
            make = RMSNorm.from_module
        elif fuse_mlp and _is_convertible_mlp(child):
            make = functools.partial(mlp_replacement, name)
        else:
            return None
        # filter_fn sees the candidates only
        return make(child) if filter_fn is None or filter_fn(name, child) else None

    root = replacement("", module)
    if root is not None:
        if example_inputs is not None:
            autotune.tune(root, example_inputs)  # ``module`` itself is not changed
        return root

    # Every change to the model is undone if a later step raises (filter_fn, a fusion, or the
    # tuning run on example_inputs): a failed convert leaves the model as it was.
    undo: list[Callable[[], None]] = []

    def set_child(parent: nn.Module, child_name: str, new: nn.Module) -> None:
        old = parent._modules[child_name]
        undo.append(lambda: setattr(parent, child_name, old))
        setattr(parent, child_name, new)

    def fuse(layer: nn.Module, fusion: Callable[[nn.Module], Any]) -> None:
        # a fusion gives the layer instance attributes of its own (its forward): undone by
        # putting the instance dict back as it was
        saved = dict(layer.__dict__)

        def restore() -> None:
            layer.__dict__.clear()
            layer.__dict__.update(saved)

        undo.append(restore)
        fusion(layer)

    try:
        replaced, fused_layers, rotary_layers, head = _convert_in_place(
            module, replacement, filter_fn, set_child, fuse, fuse_norm, fuse_rope, fuse_head)
        if example_inputs is not None:
            autotune.tune(module, example_inputs)
    except BaseException:
        for step in reversed(undo):
            step()
        raise

    counts = {kind: 0 for kind in (CutlassLinear, RMSNorm, GatedMLP)}
    for new in replaced.values():
        counts[type(new)] += 1
    _log.info(
        "cutlass_nn.convert: %d nn.Linear -> CutlassLinear, %d RMSNorm -> cutlass_nn.RMSNorm, "
        "%d gated MLP -> cutlass_nn.GatedMLP, %d decoder layers with the residual add fused "
        "into their RMSNorm, %d attention layers with the rotary embedding fused",
        counts[CutlassLinear],
        counts[RMSNorm],
        counts[GatedMLP],
        fused_layers,
        rotary_layers,
    )
    if recipe is not None:
        _log.info(
            "cutlass_nn.convert: precision=\"fp8\" (%s): %d layers in FP8 (%s); %d kept in their "
            "dtype, below the size rule of cutlass_nn.fp8.eligible (%s)",
            recipe,
            len(fp8_layers),
            ", ".join(fp8_layers) or "none",
            len(kept_layers),
            ", ".join(kept_layers) or "none",
        )
    if not replaced and not fused_layers and not rotary_layers:
        kinds = ["nn.Linear"] + ["RMSNorm"] * fuse_norm + ["gated MLP"] * fuse_mlp
        what = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " or " + kinds[-1]
        warnings.warn(
            f"cutlass_nn.convert: no {what} layer of this {type(module).__name__} was converted "
            "(none found, or filter_fn rejected them all)",
            stacklevel=2,
        )
    if fuse_rope and not rotary_layers:
        warnings.warn(
            f"cutlass_nn.convert: fuse_rope: no attention layer of this {type(module).__name__} "
            f"was fused (none of {', '.join(sorted(fused_rotary.ATTENTION_LAYERS))} with the "
            "standard rotary embedding found, or filter_fn rejected them)",
            stacklevel=2,
        )
    if fuse_head:
        if head:
            _log.info("cutlass_nn.convert: %s loss -> linear_cross_entropy", type(module).__name__)
        else:
            warnings.warn(
                f"cutlass_nn.convert: fuse_head: a {type(module).__name__} is not one of the "
                f"supported causal LMs ({', '.join(sorted(CAUSAL_LMS))}); its head is left as is",
                stacklevel=2,
            )
    return module


def _strict_filter(filter_fn: FilterFn) -> FilterFn:
    """``filter_fn`` whose answer must be a bool (Python's or NumPy's): a TypeError names any
    other, where truthiness would convert on ``"no"`` or on a tensor's element."""

    def checked(name: str, layer: nn.Module) -> bool:
        answer = filter_fn(name, layer)
        if type(answer) is bool or _checks.is_numpy_bool(answer):
            return bool(answer)
        raise TypeError(
            f"cutlass_nn.convert: argument 'filter_fn' must return a bool (True or False), got "
            f"{_checks.given(answer)} for ({name!r}, {type(layer).__name__})"
        )

    return checked


def _convert_in_place(module, replacement, filter_fn, set_child, fuse, fuse_norm, fuse_rope,
                      fuse_head) -> tuple[dict, int, int, bool]:
    """The changes of :func:`convert` below the root, each through ``set_child(parent, name,
    new)`` or ``fuse(layer, fusion)`` (which record how to undo them): ``(replaced modules by
    id, decoder layers fused, attention layers fused, whether the head was fused)``."""
    # Depth-first, parents before children, in named_modules' order, descending only into the
    # modules that were kept: a replaced module's descendants belong to the replacement (a
    # GatedMLP's projections are already CutlassLinear). A module reachable under several names
    # is visited under each, so that every parent gets the one shared replacement.
    replaced: dict[int, nn.Module] = {}
    stack: list[tuple[str, nn.Module]] = [("", module)]
    while stack:
        parent_name, parent = stack.pop()
        kept = []
        for child_name, child in list(parent.named_children()):
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) in replaced:
                set_child(parent, child_name, replaced[id(child)])
                continue
            new = replacement(name, child)
            if new is not None:
                replaced[id(child)] = new
                set_child(parent, child_name, new)
            else:
                kept.append((name, child))
        stack.extend(reversed(kept))

    fused_layers = 0
    if fuse_norm:
        for name, layer in module.named_modules():
            if is_fused(layer) or not can_fuse_residual_norm(layer):
                continue
            if filter_fn is None or filter_fn(name, layer):
                fuse(layer, fuse_residual_norm)
                fused_layers += 1

    rotary_layers = 0
    if fuse_rope:
        for name, layer in module.named_modules():
            if fused_rotary.is_fused(layer) or not fused_rotary.can_fuse_rotary(layer):
                continue
            if filter_fn is None or filter_fn(name, layer):
                fuse(layer, fused_rotary.fuse_rotary)
                rotary_layers += 1

    head = fuse_head and can_fuse_lm_head(module)
    if head:
        fuse(module, fuse_lm_head)
    return replaced, fused_layers, rotary_layers, head
