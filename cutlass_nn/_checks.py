"""Argument checks shared by the Python entry points.

Every error names the function (``cutlass_nn.<where>``), the argument, what was expected and
what was given, as the operators' own checks do (csrc/validation.h). The thin wrappers around an
operator call :func:`check_tensors` only after the operator has failed, so that a correct call
pays nothing for it.
"""

from __future__ import annotations

import functools
import numbers
import operator

import torch
from torch import Tensor

#: the range of a C++ int64_t (a ``SymInt`` / ``int`` argument of an operator schema)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT64_TEXT = "an int in [-2^63, 2^63)"


def is_numpy_bool(value) -> bool:
    """Whether ``value`` is NumPy's bool scalar (``numpy.bool_``, named ``numpy.bool`` from NumPy
    2), told by its type's module and name so that NumPy need not be imported."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def given(value) -> str:
    """A wrong value as a message shows it: scalars and strings with their repr and type (so
    that ``'False'`` is told from ``False``), anything else by its type."""
    kind = type(value)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return f"{value!r} ({kind.__name__})"
    if is_numpy_bool(value):
        # NumPy's bool prints as True / False and is named "bool": say whose it is
        return f"{value!r} (numpy.{kind.__name__})"
    return kind.__qualname__


def fail(exc: type[Exception], where: str, name: str, expected: str, got: str) -> Exception:
    """``exc`` with the message ``cutlass_nn.<where>: argument '<name>' must be <expected>, got
    <got>``."""
    return exc(f"cutlass_nn.{where}: argument '{name}' must be {expected}, got {got}")


def check_tensors(where: str, tensors: dict, optional: tuple = ()) -> None:
    """A TypeError for the first of ``tensors`` (name -> value) that is not a tensor; the names in
    ``optional`` may also be None."""
    for name, value in tensors.items():
        if isinstance(value, Tensor) or (value is None and name in optional):
            continue
        expected = "None or a torch.Tensor" if name in optional else "a torch.Tensor"
        raise fail(TypeError, where, name, expected, type(value).__name__) from None


def check_bool(where: str, name: str, value) -> bool:
    """``value`` if it is True or False, else a TypeError (no truthiness: ``"no"`` or ``"False"``
    would be true)."""
    if value is True or value is False:
        return value
    raise fail(TypeError, where, name, "a bool (True or False)", given(value))


def check_int(where: str, name: str, value, minimum: int | None = None,
              maximum: int | None = None, expected: str | None = None) -> int:
    """``value`` as an int: an integer that is not a bool (``operator.index``: Python and NumPy
    integers), in ``[minimum, maximum]``; else a TypeError (type) or ValueError (range).
    ``expected``: the message's description of a valid value (default: from the range)."""
    if expected is None:
        if minimum is None and maximum is None:
            expected = "an int"
        elif maximum is None:
            expected = f"an int >= {minimum}"
        elif minimum is None:
            expected = f"an int <= {maximum}"
        else:
            expected = f"an int in [{minimum}, {maximum}]"
    if isinstance(value, bool):
        raise fail(TypeError, where, name, f"{expected} (not a bool)", given(value))
    try:
        number = operator.index(value)
    except TypeError:
        raise fail(TypeError, where, name, expected, given(value)) from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise fail(ValueError, where, name, expected, str(number))
    return number


def check_size(where: str, name: str, value) -> int:
    """A layer size: an int >= 0 (not a bool, not a float such as 4.9)."""
    return check_int(where, name, value, minimum=0)


def check_real(where: str, name: str, value) -> float:
    """``value`` as a float: a real number that is not a bool (no strings such as ``"0.1"``),
    else a TypeError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise fail(TypeError, where, name, "a real number", given(value))
    return float(value)


def first_derivative_only(where: str):
    """Decorates the backward of an autograd formula that is differentiable once: called while
    a graph of the gradient is being built (``create_graph=True``, the only time autograd runs
    a backward in grad mode), it raises a RuntimeError naming ``cutlass_nn.<where>``.

    ``torch.autograd.function.once_differentiable`` is not enough: it marks the gradients only
    when an incoming gradient requires grad, and the incoming gradient of a loss does not, so the
    gradients came back as constants and a second derivative through them was silently 0."""

    def decorate(backward):
        @functools.wraps(backward)
        def checked(ctx, *grads):
            if torch.is_grad_enabled():
                raise RuntimeError(
                    f"cutlass_nn.{where}: has first derivatives only, but its backward was "
                    "called with create_graph=True (a second derivative through it is not "
                    "supported)"
                )
            return backward(ctx, *grads)

        return checked

    return decorate
