"""The residual add before a decoder layer's second RMSNorm, fused with that norm.

A pre-norm ``transformers`` decoder layer (Llama, Mistral, Qwen2, Qwen3) computes

    h = residual + self_attn(input_layernorm(x))     # the residual add ...
    out = h + mlp(post_attention_layernorm(h))        # ... and the norm that reads it

``fuse_residual_norm(layer)`` makes that add and norm one :func:`cutlass_nn.functional.add_rms_norm`
call (one pass over the activations each way instead of an add, a norm and, in the backward, the
sum of the two gradients of ``h``). It gives the layer instance its own ``forward`` (the class,
its parameters, ``state_dict`` and hooks stay as they were); :func:`cutlass_nn.convert` applies
it with ``fuse_norm=True`` after converting the norms. A layer is fused only when its class's
``forward`` is, statement for statement, the one the fused forward reproduces (checked on the
source, so a ``transformers`` release that changes the layer is left unfused, not run wrongly).

At each call the fused path is taken when ``post_attention_layernorm`` is a
:class:`cutlass_nn.RMSNorm` without hooks whose operands the kernel takes; otherwise the layer
computes exactly what its class does.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from cutlass_nn import _checks
from cutlass_nn import functional as F
from cutlass_nn._source_check import body_dump, entry_for_call, function_def, wrapper_chain
from cutlass_nn.modules import RMSNorm, _norm_fits

#: Decoder layer classes of ``transformers`` whose forward the fused one reproduces (checked
#: against transformers 5.0 to 5.25; each is also checked on its source when fused).
DECODER_LAYERS = frozenset(
    {"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"}
)

# The body of the forward fuse_residual_norm reproduces, compared as an AST dump (comments,
# docstrings and layout do not matter; any other statement does). ATTENTION_ARGS stands for
# the forward's own parameters between hidden_states and **kwargs, each passed on by name
# (they differ between transformers releases: past_key_values or cache, cache_position or not).
_EXPECTED_BODY = """
residual = hidden_states
hidden_states = self.input_layernorm(hidden_states)
hidden_states, _ = self.self_attn(hidden_states=hidden_states, ATTENTION_ARGS **kwargs)
hidden_states = residual + hidden_states
residual = hidden_states
hidden_states = self.post_attention_layernorm(hidden_states)
hidden_states = self.mlp(hidden_states)
hidden_states = residual + hidden_states
return hidden_states
"""


class _Spec(NamedTuple):
    """What the fused forward needs of a layer class: the names of its forward's parameters
    between ``hidden_states`` and ``**kwargs`` (passed to the attention by name), their
    defaults, and the class's forward as it was checked (a later patch of it is noticed)."""

    names: tuple[str, ...]
    defaults: dict[str, Any]
    checked: Any


# The decorators transformers puts around a decoder layer's forward, by (function name, file
# name): the deprecated-argument rename and the gradient-checkpointing wrapper. The fused forward
# does what they do (the rename; checkpointing by running the class's forward); a forward wrapped
# in anything else is not fused.
_KNOWN_WRAPPERS = frozenset({
    ("wrapped_func", "deprecation.py"),
    ("forward_with_checkpointing", "modeling_layers.py"),
})


def _wrappers_known(forward_fn: Any) -> bool:
    return wrapper_chain(forward_fn, _KNOWN_WRAPPERS) is not None


def _spec_of(cls: type) -> _Spec | None:
    """The class's _Spec when its forward (unwrapped from its decorators) has the expected
    parameters and body, else None."""
    if not _wrappers_known(cls.forward):
        return None
    forward_fn = inspect.unwrap(cls.forward)
    func = function_def(forward_fn)
    try:
        params = list(inspect.signature(forward_fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if func is None:
        return None
    if (
        len(params) < 3
        or [p.name for p in params[:2]] != ["self", "hidden_states"]
        or params[-1].kind is not inspect.Parameter.VAR_KEYWORD
        or params[-1].name != "kwargs"
        or any(p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params[1:-1])
        or any(p.default is inspect.Parameter.empty for p in params[2:-1])
    ):
        return None
    middle = params[2:-1]
    expected = _EXPECTED_BODY.replace("ATTENTION_ARGS", "".join(f"{p.name}={p.name}, " for p in middle))
    if body_dump(func.body) != body_dump(ast.parse(expected).body):
        return None
    return _Spec(tuple(p.name for p in middle), {p.name: p.default for p in middle}, cls.forward)


_SPECS: dict[type, _Spec | None] = {}


def can_fuse_residual_norm(layer: nn.Module) -> bool:
    """Whether ``layer`` is a decoder layer :func:`fuse_residual_norm` supports: a class of
    :data:`DECODER_LAYERS` from ``transformers`` whose forward is the expected one, with the
    four submodules it calls, and no instance-level ``forward`` of another origin."""
    cls = type(layer)
    if cls.__name__ not in DECODER_LAYERS or not cls.__module__.startswith("transformers."):
        return False
    if not all(
        isinstance(getattr(layer, name, None), nn.Module)
        for name in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    ):
        return False
    if "forward" in layer.__dict__ and not is_fused(layer):
        return False  # a forward of its own (e.g. a wrapper a library installed): left as is
    if cls not in _SPECS:
        _SPECS[cls] = _spec_of(cls)
    return _SPECS[cls] is not None


_CALL_SPECS: dict[tuple[type, Any], _Spec | None] = {}


def _call_spec(cls: type) -> _Spec | None:
    """The _Spec the fused forward of an instance of ``cls`` runs with: that of the fused class,
    also when ``cls`` is a subclass made at run time (FSDP2's ``FSDP<Layer>``), as long as
    ``cls.forward`` is the checked forward under the known decorators only; None when it is not
    (a patched or overridden forward: the class's forward runs instead). Cached per (class,
    forward), so patching the forward later is noticed."""
    return entry_for_call(cls, _SPECS, _CALL_SPECS, _still_checked)


def _still_checked(forward_fn: Any, spec: _Spec) -> bool:
    return _wrappers_known(forward_fn) and inspect.unwrap(forward_fn) is inspect.unwrap(spec.checked)


def is_fused(layer: nn.Module) -> bool:
    """Whether :func:`fuse_residual_norm` was applied to ``layer``."""
    if not isinstance(layer, nn.Module):
        raise _checks.fail(TypeError, "fused_decoder.is_fused", "layer", "an nn.Module",
                           _checks.given(layer))
    return getattr(layer.__dict__.get("forward"), "__func__", None) is forward


def fuse_residual_norm(layer: nn.Module) -> nn.Module:
    """Give ``layer`` (see :func:`can_fuse_residual_norm`) the fused forward; returns it.

    Raises:
        TypeError: ``layer`` is not a supported decoder layer (nothing is changed).
    """
    if not can_fuse_residual_norm(layer):
        raise TypeError(
            "cutlass_nn.fuse_residual_norm: argument 'layer' must be a transformers decoder "
            f"layer of {', '.join(sorted(DECODER_LAYERS))} with the forward of transformers 5, "
            f"got {type(layer).__module__}.{type(layer).__qualname__}"
        )
    layer.forward = forward.__get__(layer)
    return layer


def _fusable_norm(norm: nn.Module, h: Tensor, residual: Tensor) -> bool:
    module = nn.modules.module
    return (
        type(norm) is RMSNorm
        and len(norm.normalized_shape) == 1
        and not norm._forward_hooks
        and not norm._forward_pre_hooks
        and not norm._backward_hooks
        and not norm._backward_pre_hooks
        and not module._global_forward_hooks
        and not module._global_forward_pre_hooks
        and not module._global_backward_hooks
        and not module._global_backward_pre_hooks
        and h.shape == residual.shape
        and h.dtype == residual.dtype
        and _norm_fits(h, norm.weight)
    )


# Named "forward": a pickled layer (torch.save of the model) stores the bound method as
# getattr(layer, "forward"), which after loading is the class's forward, i.e. the unfused one.
def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """The decoder layer's forward with ``residual + attention`` and
    ``post_attention_layernorm`` as one add_rms_norm call; the arguments are the class's."""
    spec = _call_spec(type(self))
    if (
        spec is None
        or (getattr(self, "gradient_checkpointing", False) and self.training and torch.is_grad_enabled())
    ):
        # the class's own forward, through its decorators: checkpointing (which recomputes the
        # layer in the backward) runs it unfused
        return type(self).forward(self, hidden_states, *args, **kwargs)
    names, defaults = spec.names, spec.defaults
    if len(args) > len(names):
        raise TypeError(
            f"{type(self).__name__}.forward() takes {len(names) + 2} positional arguments but "
            f"{len(args) + 2} were given"
        )
    attention_args = dict(zip(names, args))
    for name in names[len(args):]:
        attention_args[name] = kwargs.pop(name, defaults[name])
    if "cache" in names and "past_key_values" in kwargs:  # the class's deprecated name for it
        cache = kwargs.pop("past_key_values")
        if attention_args["cache"] is None:
            attention_args["cache"] = cache
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(hidden_states=hidden_states, **attention_args, **kwargs)
    norm = self.post_attention_layernorm
    if _fusable_norm(norm, hidden_states, residual):
        hidden_states, residual = F.add_rms_norm(hidden_states, residual, norm.weight, norm.eps)
    else:
        residual = residual + hidden_states
        hidden_states = norm(residual)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states
