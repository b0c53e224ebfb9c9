"""The rotary position embedding of ``transformers`` attention layers as one operator.

The attention of Llama, Mistral, Qwen2 and Qwen3 rotates its queries and keys with its modeling
module's ``apply_rotary_pos_emb(q, k, cos, sin)``: in eager mode five elementwise kernels for
each of q and k forward (``rotate_half``'s slices, negation and concatenation, two products, a
sum) and more in the backward (the slices' gradients are zero-filled copies that are then
summed). ``fuse_rotary(attention)`` makes that one
:func:`cutlass_nn.functional.apply_rotary_pos_emb` call: one pass over q and k each way.

It gives the attention instance its own ``forward``: the class's forward itself (same code,
through the same decorators, reading every other global live from its module) that loads
:func:`cutlass_nn.functional.apply_rotary_pos_emb` where it loaded the module's
``apply_rotary_pos_emb`` (its code's global name is renamed to a private one the module is given).
Nothing else changes: the class, the parameters, ``state_dict``, hooks, other instances, other
models and the module's ``apply_rotary_pos_emb`` keep the stock function. The swap is made only when the modeling
module's ``apply_rotary_pos_emb`` and ``rotate_half`` are, statement for statement, the formula
the operator computes (checked on their source), so a ``transformers`` release that changes
them is left unfused, not run wrongly. :func:`cutlass_nn.convert` applies it with
``fuse_rope=True``.
"""

from __future__ import annotations

import ast
import dis
import sys
import types
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from cutlass_nn import _checks
from cutlass_nn import functional as F
from cutlass_nn._source_check import body_dump, entry_for_call, function_def, wrapper_chain

#: Attention classes of ``transformers`` whose forward calls their module's
#: ``apply_rotary_pos_emb`` (checked against transformers 5.17, 5.24 and 5.25; each module's function
#: is also checked on its source when fused).
ATTENTION_LAYERS = frozenset(
    {"LlamaAttention", "MistralAttention", "Qwen2Attention", "Qwen3Attention"}
)

# What the modeling module's functions must be (compared as AST dumps of the arguments and the
# body: docstrings, comments, decorators and layout do not matter, any other change does).
_EXPECTED = {
    "apply_rotary_pos_emb": """
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
""",
    "rotate_half": """
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
""",
}

# The decorators transformers puts around an attention forward, by (function name, file name):
# the deprecated-argument rename, and (transformers >= 5.25 with the ``kernels`` package, which it
# now requires) ``use_kernelized_func``'s forward, which routes the module-level kernel functions
# to the instance's private copies. A forward wrapped in anything else is not fused.
_KNOWN_WRAPPERS = frozenset({("wrapped_func", "deprecation.py"), ("new_forward", "layer.py")})


def _signature_and_body(func: ast.FunctionDef) -> str:
    return ast.dump(func.args) + "\n" + body_dump(func.body)


def _expected_dump(name: str) -> str:
    func = ast.parse(_EXPECTED[name]).body[0]
    assert isinstance(func, ast.FunctionDef)
    return _signature_and_body(func)


def _plain_function(fn: Any) -> Any:
    """``fn`` itself, or the function a ``kernels`` function-module wraps: with the ``kernels``
    package installed, ``@use_kernel_forward_from_hub`` makes a module-level function an
    ``nn.Module`` instance whose class's forward calls the original (the free variable ``func``
    of that forward) unless a hub kernel was installed for it. None when ``fn`` is neither."""
    if isinstance(fn, types.FunctionType):
        return fn
    if not (isinstance(fn, nn.Module) and hasattr(type(fn), "kernel_layer_name")):
        return None
    if "forward" in fn.__dict__:  # kernelize() gave it a hub kernel's forward
        return None
    code_fn = getattr(type(fn), "forward", None)
    if not isinstance(code_fn, types.FunctionType) or code_fn.__closure__ is None:
        return None
    cells = dict(zip(code_fn.__code__.co_freevars, code_fn.__closure__))
    inner = cells.get("func")
    try:
        inner = inner.cell_contents if inner is not None else None
    except ValueError:  # an empty cell
        return None
    return inner if isinstance(inner, types.FunctionType) else None


def _is_expected(fn: Any, name: str) -> bool:
    fn = _plain_function(fn)
    if not isinstance(fn, types.FunctionType):
        return False
    func = function_def(fn)
    return func is not None and func.name == name and _signature_and_body(func) == _expected_dump(name)


def _wrapper_chain(forward_fn: Any) -> list[types.FunctionType] | None:
    return wrapper_chain(forward_fn, _KNOWN_WRAPPERS)


def _copy_function(fn: types.FunctionType, globals_: dict, closure: tuple | None) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__dict__.update(fn.__dict__)
    return new


# The global name the rebound forward loads instead of ``apply_rotary_pos_emb``, set in the
# modeling module to cutlass_nn's function (a new private name: nothing of the module changes).
_GLOBAL_NAME = "_cutlass_nn_apply_rotary_pos_emb"


def _renamed_code(code: types.CodeType) -> types.CodeType | None:
    """``code`` loading the global ``_GLOBAL_NAME`` where it loaded ``apply_rotary_pos_emb``; None
    when that name is used otherwise (an attribute, a store, a nested function)."""
    name = "apply_rotary_pos_emb"
    if name not in code.co_names:
        return None
    if any(isinstance(c, types.CodeType) and name in c.co_names for c in code.co_consts):
        return None
    if any(ins.argval == name and ins.opname != "LOAD_GLOBAL" for ins in dis.get_instructions(code)):
        return None
    return code.replace(co_names=tuple(_GLOBAL_NAME if n == name else n for n in code.co_names))


def _rebound_forward(forward_fn: Any, module: types.ModuleType) -> Callable | None:
    """The class's forward loading cutlass_nn's function where it loaded the module's
    ``apply_rotary_pos_emb`` (its code's global name renamed; every other global is still read
    live from the module), each known wrapper rebuilt around the new function (its closure cell
    that held the old one now holds the new one); None when the chain is not the expected one."""
    chain = _wrapper_chain(forward_fn)
    if chain is None:
        return None
    inner = chain[-1]
    code = _renamed_code(inner.__code__)
    if code is None or inner.__globals__ is not vars(module):
        return None
    setattr(module, _GLOBAL_NAME, F.apply_rotary_pos_emb)
    new = _copy_function(inner, inner.__globals__, inner.__closure__)
    new.__code__ = code
    for wrapper, old in zip(reversed(chain[:-1]), reversed(chain[1:])):
        cells = wrapper.__closure__ or ()
        holds_old = [i for i, c in enumerate(cells) if _cell_holds(c, old)]
        if len(holds_old) != 1:
            return None
        closure = tuple(
            types.CellType(new) if i == holds_old[0] else c for i, c in enumerate(cells)
        )
        rebuilt = _copy_function(wrapper, wrapper.__globals__, closure)
        rebuilt.__wrapped__ = new
        new = rebuilt
    return new


def _cell_holds(cell: types.CellType, obj: Any) -> bool:
    try:
        return cell.cell_contents is obj
    except ValueError:  # an empty cell
        return False


class _Fused(NamedTuple):
    """A fusable class's forward as checked (its innermost function) and the rebound copy."""

    checked: types.FunctionType
    rebound: Callable


# class -> its _Fused (None: not fusable), computed once per class
_FUSED_FORWARDS: dict[type, _Fused | None] = {}


def _fused_forward_of(cls: type) -> _Fused | None:
    if cls not in _FUSED_FORWARDS:
        module = sys.modules.get(cls.__module__)
        ok = (
            module is not None
            and getattr(module, "torch", None) is torch
            and _is_expected(getattr(module, "apply_rotary_pos_emb", None), "apply_rotary_pos_emb")
            and _is_expected(getattr(module, "rotate_half", None), "rotate_half")
        )
        rebound = _rebound_forward(cls.forward, module) if ok else None
        _FUSED_FORWARDS[cls] = (
            None if rebound is None else _Fused(_wrapper_chain(cls.forward)[-1], rebound)
        )
    return _FUSED_FORWARDS[cls]


def can_fuse_rotary(attention: nn.Module) -> bool:
    """Whether ``attention`` is an attention layer :func:`fuse_rotary` supports: a class of
    :data:`ATTENTION_LAYERS` from ``transformers`` whose forward calls its module's
    ``apply_rotary_pos_emb``, that function and ``rotate_half`` being the expected formula, and
    that has no instance-level ``forward`` of another origin."""
    cls = type(attention)
    if cls.__name__ not in ATTENTION_LAYERS or not cls.__module__.startswith("transformers."):
        return False
    if "forward" in attention.__dict__ and not is_fused(attention):
        return False  # a forward of its own (e.g. a wrapper a library installed): left as is
    return _fused_forward_of(cls) is not None


_CALL_FORWARDS: dict[tuple[type, Any], Any] = {}


def _call_forward(cls: type) -> Callable | None:
    """The rebound forward an instance of ``cls`` runs: that of the fused class, also when
    ``cls`` is a subclass made at run time (FSDP2's ``FSDP<Attention>``) whose forward is still
    the checked one; None when the class's forward was patched or overridden since (then the
    class's forward runs). Cached per (class, forward), so a later patch is noticed."""
    fused = entry_for_call(cls, _FUSED_FORWARDS, _CALL_FORWARDS, _still_checked)
    return None if fused is None else fused.rebound


def _still_checked(forward_fn: Any, fused: Any) -> bool:
    chain = _wrapper_chain(forward_fn)
    return chain is not None and chain[-1] is fused.checked


def is_fused(attention: nn.Module) -> bool:
    """Whether :func:`fuse_rotary` was applied to ``attention``."""
    if not isinstance(attention, nn.Module):
        raise _checks.fail(TypeError, "fused_rotary.is_fused", "attention", "an nn.Module",
                           _checks.given(attention))
    return getattr(attention.__dict__.get("forward"), "__func__", None) is forward


def fuse_rotary(attention: nn.Module) -> nn.Module:
    """Give ``attention`` (see :func:`can_fuse_rotary`) the forward whose rotary embedding is
    :func:`cutlass_nn.functional.apply_rotary_pos_emb`; returns it.

    Raises:
        TypeError: ``attention`` is not a supported attention layer (nothing is changed).
    """
    if not can_fuse_rotary(attention):
        raise TypeError(
            "cutlass_nn.fuse_rotary: argument 'attention' must be a transformers attention "
            f"layer of {', '.join(sorted(ATTENTION_LAYERS))} whose module has the standard "
            "apply_rotary_pos_emb and without a forward of its own, got "
            f"{type(attention).__module__}.{type(attention).__qualname__}"
        )
    attention.forward = forward.__get__(attention)
    return attention


# Named "forward": a pickled layer (torch.save of the model) stores the bound method as
# getattr(layer, "forward"), which after loading is the class's forward, i.e. the unfused one.
def forward(self, *args: Any, **kwargs: Any) -> Any:
    """The attention's own forward with cutlass_nn's rotary embedding; the arguments are the
    class's."""
    fused = _call_forward(type(self))
    if fused is None:
        return type(self).forward(self, *args, **kwargs)
    return fused(self, *args, **kwargs)
