"""Source checks shared by the rewrites of ``transformers`` layers (``fused_decoder``,
``fused_rotary``): a layer is rewritten only when the code it replaces is, statement for
statement, the code the rewrite was written against, and only through decorators it knows."""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from typing import Any, Callable


def wrapper_chain(fn: Any, known: frozenset[tuple[str, str]]) -> list[types.FunctionType] | None:
    """``fn`` and the functions it wraps (``__wrapped__``), outermost first, when each wrapper is
    a plain function whose (code name, file name) is in ``known`` and the innermost is a plain
    function; else None."""
    chain = []
    f = fn
    while True:
        if not isinstance(f, types.FunctionType):
            return None
        chain.append(f)
        if not hasattr(f, "__wrapped__"):
            return chain
        code = f.__code__
        if (code.co_name, code.co_filename.replace("\\", "/").rsplit("/", 1)[-1]) not in known:
            return None
        f = f.__wrapped__


def function_def(fn: Any) -> ast.FunctionDef | None:
    """The parsed ``def`` of ``fn`` (unwrapped from its decorators), or None when its source
    cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(inspect.unwrap(fn)))
    except (OSError, TypeError, ValueError):
        return None
    tree = ast.parse(source)
    func = tree.body[0] if tree.body else None
    return func if isinstance(func, ast.FunctionDef) else None


def body_dump(statements: list[ast.stmt]) -> str:
    """The statements as one AST dump, docstrings left out (comments and layout never count)."""
    return "\n".join(
        ast.dump(s) for s in statements
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    )


def entry_for_call(
    cls: type,
    entries: dict[type, Any],
    cache: dict[tuple[type, Any], Any],
    still_checked: Callable[[Any, Any], bool],
) -> Any:
    """What an instance of ``cls`` runs with: the entry registered for ``cls`` or its nearest
    base class in ``entries`` (so a subclass made at run time, such as FSDP2's
    ``FSDP<Layer>``, finds its layer's entry), when ``still_checked(cls.forward, entry)`` says
    the class's forward is still the code the entry was checked against; else None (a patched
    or overridden forward: the class's own forward runs). Cached per (class, forward) in
    ``cache``, so patching the forward later is noticed."""
    key = (cls, cls.forward)
    if key not in cache:
        entry = next((entries[k] for k in cls.__mro__ if entries.get(k) is not None), None)
        cache[key] = entry if entry is not None and still_checked(cls.forward, entry) else None
    return cache[key]
