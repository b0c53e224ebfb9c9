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
import textwrap
from typing import Any

from torch import Tensor, nn

from cutlass_nn import functional as F
from cutlass_nn.modules import RMSNorm, _norm_fits

#: Decoder layer classes of ``transformers`` whose forward the fused one reproduces (checked
#: against transformers 5.24; each is also checked on its source when fused).
DECODER_LAYERS = frozenset(
    {"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"}
)

# The body of the forward fuse_residual_norm reproduces (transformers 5.x), compared as an AST
# dump (comments, docstrings and layout do not matter; any other statement does).
_EXPECTED_BODY = """
residual = hidden_states
hidden_states = self.input_layernorm(hidden_states)
hidden_states, _ = self.self_attn(
    hidden_states=hidden_states,
    attention_mask=attention_mask,
    position_ids=position_ids,
    cache=cache,
    use_cache=use_cache,
    position_embeddings=position_embeddings,
    **kwargs,
)
hidden_states = residual + hidden_states
residual = hidden_states
hidden_states = self.post_attention_layernorm(hidden_states)
hidden_states = self.mlp(hidden_states)
hidden_states = residual + hidden_states
return hidden_states
"""
_EXPECTED_PARAMS = (
    "self", "hidden_states", "attention_mask", "position_ids", "cache", "use_cache",
    "position_embeddings", "kwargs",
)


def _body_dump(statements: list[ast.stmt]) -> str:
    return "\n".join(ast.dump(s) for s in statements)


_EXPECTED_DUMP = _body_dump(ast.parse(_EXPECTED_BODY).body)


def _forward_matches(cls: type) -> bool:
    """Whether ``cls.forward`` (unwrapped from its decorators) has the expected parameters and
    body."""
    forward = inspect.unwrap(cls.forward)
    try:
        source = textwrap.dedent(inspect.getsource(forward))
    except (OSError, TypeError):
        return False
    tree = ast.parse(source)
    func = tree.body[0] if tree.body else None
    if not isinstance(func, ast.FunctionDef):
        return False
    params = tuple(inspect.signature(forward).parameters)
    if params != _EXPECTED_PARAMS:
        return False
    body = [
        s for s in func.body
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))  # docstrings
    ]
    return _body_dump(body) == _EXPECTED_DUMP


_MATCHES: dict[type, bool] = {}


def can_fuse_residual_norm(layer: nn.Module) -> bool:
    """Whether ``layer`` is a decoder layer :func:`fuse_residual_norm` supports: a class of
    :data:`DECODER_LAYERS` from ``transformers`` whose forward is the expected one, with the
    four submodules it calls."""
    cls = type(layer)
    if cls.__name__ not in DECODER_LAYERS or not cls.__module__.startswith("transformers."):
        return False
    if not all(
        isinstance(getattr(layer, name, None), nn.Module)
        for name in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
    ):
        return False
    if cls not in _MATCHES:
        _MATCHES[cls] = _forward_matches(cls)
    return _MATCHES[cls]


def is_fused(layer: nn.Module) -> bool:
    """Whether :func:`fuse_residual_norm` was applied to ``layer``."""
    return getattr(layer.__dict__.get("forward"), "__func__", None) is forward


def fuse_residual_norm(layer: nn.Module) -> nn.Module:
    """Give ``layer`` (see :func:`can_fuse_residual_norm`) the fused forward; returns it.

    Raises:
        TypeError: ``layer`` is not a supported decoder layer (nothing is changed).
    """
    if not can_fuse_residual_norm(layer):
        raise TypeError(
            "cutlass_nn.fuse_residual_norm: argument 'layer' must be a transformers decoder "
            f"layer of {', '.join(sorted(DECODER_LAYERS))} with the forward of transformers 5.x, "
            f"got {type(layer).__module__}.{type(layer).__qualname__}"
        )
    layer.forward = forward.__get__(layer)
    return layer


def _fusable_norm(norm: nn.Module, h: Tensor, residual: Tensor) -> bool:
    return (
        type(norm) is RMSNorm
        and len(norm.normalized_shape) == 1
        and not norm._forward_hooks
        and not norm._forward_pre_hooks
        and not nn.modules.module._global_forward_hooks
        and not nn.modules.module._global_forward_pre_hooks
        and h.shape == residual.shape
        and h.dtype == residual.dtype
        and _norm_fits(h, norm.weight)
    )


# Named "forward": a pickled layer (torch.save of the model) stores the bound method as
# getattr(layer, "forward"), which after loading is the class's forward, i.e. the unfused one.
def forward(
    self,
    hidden_states: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    cache: Any = None,
    use_cache: bool | None = False,
    position_embeddings: tuple[Tensor, Tensor] | None = None,
    **kwargs: Any,
) -> Tensor:
    """The decoder layer's forward with ``residual + attention`` and
    ``post_attention_layernorm`` as one add_rms_norm call."""
    if cache is None and "past_key_values" in kwargs:  # the class's deprecated name
        cache = kwargs.pop("past_key_values")
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    hidden_states, _ = self.self_attn(
        hidden_states=hidden_states,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=use_cache,
        position_embeddings=position_embeddings,
        **kwargs,
    )
    norm = self.post_attention_layernorm
    if _fusable_norm(norm, hidden_states, residual):
        hidden_states, residual = F.add_rms_norm(hidden_states, residual, norm.weight, norm.eps)
    else:
        residual = residual + hidden_states
        hidden_states = norm(residual)
    hidden_states = self.mlp(hidden_states)
    return residual + hidden_states
