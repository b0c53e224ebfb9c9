"""The ``torch.ops.cutlass_nn`` operators, as typed Python functions, with their fake (meta)
implementations for ``torch.compile`` and their autograd formulas.

Every backward formula calls other registered cutlass_nn operators (never a Python expression
that ATen's autograd would differentiate), so gradients run on cutlass_nn's own kernels, and
double backward works too:

* ``linear``: dX = ``linear_dgrad(dY, W)``, dW = ``linear_wgrad(dY, X)``, db = ``bias_grad(dY)``
* ``linear_dgrad(g, W)``: dg = ``linear(dgX, W)``, dW = ``linear_wgrad(g, dgX)``
* ``linear_wgrad(g, X)``: dg = ``linear(X, dgW)``, dX = ``linear_dgrad(g, dgW)``
* ``mm(a, b)``: da = ``mm(dY, b.T)``, db = ``mm(a.T, dY)``
* ``add2(a, b)``: da = db = dY
* ``linear_act_aux(X, W, b, act) -> (Y, Z)``: dZ, db = ``activation_grad(dY, Z, act, True)``
  (plus the incoming gradient of Z, if any: dZ = ``add2(dZ, dZ_in)``, db = ``bias_grad(dZ)``),
  dX = ``linear_dgrad(dZ, W)``, dW = ``linear_wgrad(dZ, X)``
* ``linear_act(X, W, b, act)``: Z = ``linear(X, W, b)`` recomputed, then as ``linear_act_aux``
* ``activation_grad(g, Z, act, bias_grad) -> (dZ, db)``: with G = ddZ (+ ddb broadcast over the
  leading dims), dg = ``activation_grad(G, Z, act, False)[0]``, dZ = ``G * g * act''(Z)`` -- the
  one formula written with torch elementwise ops (it is only reached by second-order gradients)
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch
from torch import Tensor

from cutlass_nn import _extension

_ops = torch.ops.cutlass_nn
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: The activation names of ``linear_act``, ``linear_act_aux`` and ``activation_grad``:
#: identity, ``F.relu``, ``F.gelu(approximate="none")``, ``F.gelu(approximate="tanh")``.
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh")


def _require_backend(op: str, t: Tensor) -> None:
    """A CUDA tensor reaching a CPU-only build gets one clear line instead of a dispatcher dump."""
    if t.device.type == "cuda" and not _extension.has_cuda_kernels():
        raise RuntimeError(
            f"cutlass_nn.{op}: got a tensor on {t.device}, but this cutlass_nn build has no CUDA "
            "kernels (it was built as the CPU flavor). Rebuild with a CUDA build of torch and "
            "CUDA_HOME pointing at a CUDA toolkit: `pip install --no-build-isolation -e .`"
        )


def _autocast(device_type: str, *tensors: Tensor | None) -> tuple[Tensor | None, ...]:
    """Under ``torch.autocast`` cast floating inputs (not float64) to the autocast dtype, the
    policy ``nn.Linear`` / ``torch.mm`` follow; the casts are differentiable, so gradients
    reach float32 parameters in float32."""
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(
        t.to(dtype) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
        for t in tensors
    )


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias`` on cutlass_nn kernels; input [*, in], weight [out, in].
    Follows ``torch.autocast`` like ``nn.Linear``."""
    _require_backend("linear", input)
    input, weight, bias = _autocast(input.device.type, input, weight, bias)
    return _ops.linear.default(input, weight, bias)


def linear_dgrad(grad_output: Tensor, weight: Tensor) -> Tensor:
    """``grad_output @ weight``: the input gradient of linear; [*, out] -> [*, in]."""
    _require_backend("linear_dgrad", grad_output)
    return _ops.linear_dgrad.default(grad_output, weight)


def linear_wgrad(grad_output: Tensor, input: Tensor) -> Tensor:
    """``grad_output^T @ input`` over all leading dims: the weight gradient of linear."""
    _require_backend("linear_wgrad", grad_output)
    return _ops.linear_wgrad.default(grad_output, input)


def linear_wgrad_accumulate_(grad_weight: Tensor, grad_output: Tensor, input: Tensor) -> None:
    """``grad_weight += grad_output^T @ input`` in place; ``grad_weight`` may be float32 while
    the inputs are 16-bit (an fp32 main gradient)."""
    _require_backend("linear_wgrad_accumulate_", grad_output)
    _ops.linear_wgrad_accumulate_.default(grad_weight, grad_output, input)


def bias_grad(grad_output: Tensor) -> Tensor:
    """``grad_output`` summed over every leading dim: the bias gradient of linear; -> [out]."""
    _require_backend("bias_grad", grad_output)
    return _ops.bias_grad.default(grad_output)


def mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for 2-D tensors, like ``torch.mm`` (autocast included)."""
    _require_backend("mm", a)
    a, b = _autocast(a.device.type, a, b)
    return _ops.mm.default(a, b)


def mm_out(a: Tensor, b: Tensor, out: Tensor) -> Tensor:
    """``torch.mm(a, b, out=out)`` semantics: ``out`` is resized if needed (with torch's
    warning when it had elements) and returned."""
    return _mm_out(a, b, out, stacklevel=3)


def _mm_out(a: Tensor, b: Tensor, out: Tensor, *, stacklevel: int) -> Tensor:
    """``mm_out``; ``stacklevel`` (of the resize warning, counted from here) names the user's
    frame: 3 from ``mm_out`` and from ``cutlass_nn.functional.mm``."""
    _require_backend("mm.out", a)
    old_shape = tuple(out.shape)
    had_elements = out.numel() > 0
    _ops.mm.out(a, b, out=out)
    if had_elements and tuple(out.shape) != old_shape:
        warnings.warn(
            f"cutlass_nn.mm: an output with one or more elements was resized since it had shape "
            f"{list(old_shape)}, which does not match the required output shape "
            f"{list(out.shape)}. As with torch.mm, reuse an out tensor by resizing it to zero "
            "elements first (t.resize_(0)).",
            UserWarning,
            stacklevel=stacklevel,
        )
    return out


def add2(a: Tensor, b: Tensor) -> Tensor:
    """``a + b`` for tensors of the same shape, dtype and device."""
    _require_backend("add2", a)
    return _ops.add2.default(a, b)


def _activation_message(op: str, activation) -> str:
    """The message of csrc/op_checks.cpp's parse_activation."""
    allowed = ", ".join(f'"{a}"' for a in ACTIVATIONS)
    given = f'"{activation}"' if isinstance(activation, str) else repr(activation)
    return f"cutlass_nn.{op}: argument 'activation' must be one of {allowed}, got {given}"


def _check_activation_type(op: str, activation) -> None:
    # A non-string would otherwise fail in the dispatcher's argument parsing with a message that
    # does not name the argument; the values themselves are checked by the operators.
    if not isinstance(activation, str):
        raise RuntimeError(_activation_message(op, activation))


def linear_act(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none"
) -> Tensor:
    """``act(input @ weight.T + bias)`` with ``act`` one of :data:`ACTIVATIONS`; the bias add and
    the activation are computed in float (float64 for float64) from the GEMM's accumulator --
    on the GPU in the GEMM epilogue where the kernel fuses it -- and rounded once. Follows
    ``torch.autocast`` like ``linear``. Its backward recomputes the pre-activation; a forward
    that is to be differentiated should call :func:`linear_act_aux` (as
    ``cutlass_nn.functional.linear`` does)."""
    _require_backend("linear_act", input)
    _check_activation_type("linear_act", activation)
    input, weight, bias = _autocast(input.device.type, input, weight, bias)
    return _ops.linear_act.default(input, weight, bias, activation)


def linear_act_aux(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none"
) -> tuple[Tensor, Tensor]:
    """``(act(z), z)`` with the pre-activation ``z = input @ weight.T + bias``, both rounded once
    from the fp32 (float64) epilogue; ``z`` is what the backward needs. Follows
    ``torch.autocast`` like ``linear``."""
    _require_backend("linear_act_aux", input)
    _check_activation_type("linear_act_aux", activation)
    input, weight, bias = _autocast(input.device.type, input, weight, bias)
    return _ops.linear_act_aux.default(input, weight, bias, activation)


def activation_grad(
    grad_output: Tensor, preact: Tensor, activation: str, bias_grad: bool = False
) -> tuple[Tensor, Tensor]:
    """``grad_preact = grad_output * act'(preact)`` (computed in float, float64 for float64,
    rounded once) and, with ``bias_grad``, its sum over all leading dims from the same pass
    (deterministic), else an empty ``[0]`` tensor: ``(grad_preact, grad_bias)``.

    Differentiable twice over: its own backward is ``activation_grad`` again for
    ``grad_output`` and, for ``preact``, ``G * grad_output * act''(preact)`` written with torch
    elementwise ops (second-order gradients only)."""
    _require_backend("activation_grad", grad_output)
    _check_activation_type("activation_grad", activation)
    return _ops.activation_grad.default(grad_output, preact, activation, bias_grad)


# ---------------------------------------------------------------------------------------------
# Fake implementations: output metadata for FakeTensor tracing (torch.compile, export). They
# repeat the shape checks of csrc/op_checks.cpp so that a traced program fails like eager does.
# ---------------------------------------------------------------------------------------------


def _check(cond, op: str, msg: str) -> None:
    torch._check(cond, lambda: f"cutlass_nn.{op}: {msg}")


def _dtype_name(dtype: torch.dtype) -> str:
    # "float32", not "torch.float32": the spelling of the C++ checks (csrc/validation.cpp)
    return str(dtype).removeprefix("torch.")


def _fake_common(op: str, ref_name: str, ref: Tensor, others: dict[str, Tensor]) -> None:
    torch._check(
        ref.dtype in _FLOAT_DTYPES,
        lambda: f"cutlass_nn.{op}: argument '{ref_name}' must have a floating dtype "
        f"(float16, bfloat16, float32 or float64), got {_dtype_name(ref.dtype)}",
    )
    for name, t in others.items():
        torch._check(
            t.dtype == ref.dtype,
            lambda: f"cutlass_nn.{op}: argument '{name}' must have dtype "
            f"{_dtype_name(ref.dtype)} (the dtype of '{ref_name}'), got {_dtype_name(t.dtype)}",
        )
        _check(
            t.device == ref.device,
            op,
            f"argument '{name}' must be on device {ref.device} (the device of '{ref_name}'), "
            f"got {t.device}",
        )


def _fake_linear_shape(op, input, weight, bias):
    _fake_common(op, "input", input, {"weight": weight, **({"bias": bias} if bias is not None else {})})
    _check(input.dim() >= 1, op, "argument 'input' must have at least 1 dimension(s)")
    _check(weight.dim() == 2, op, "argument 'weight' must be a 2-D tensor")
    _check(
        input.shape[-1] == weight.shape[1],
        op,
        f"argument 'input' must have size {weight.shape[1]} in its last dimension "
        f"(in_features = weight.shape[1]), got shape {list(input.shape)}",
    )
    if bias is not None:
        _check(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            op,
            f"argument 'bias' must be a 1-D tensor [out_features] of size {weight.shape[0]}, "
            f"got shape {list(bias.shape)}",
        )
    return (*input.shape[:-1], weight.shape[0])


def _fake_activation(op, activation):
    if activation not in ACTIVATIONS:
        raise RuntimeError(_activation_message(op, activation))


@torch.library.register_fake("cutlass_nn::linear")
def _linear_fake(input, weight, bias=None):
    return input.new_empty(_fake_linear_shape("linear", input, weight, bias))


@torch.library.register_fake("cutlass_nn::linear_act")
def _linear_act_fake(input, weight, bias, activation):
    shape = _fake_linear_shape("linear_act", input, weight, bias)
    _fake_activation("linear_act", activation)
    return input.new_empty(shape)


@torch.library.register_fake("cutlass_nn::linear_act_aux")
def _linear_act_aux_fake(input, weight, bias, activation):
    shape = _fake_linear_shape("linear_act_aux", input, weight, bias)
    _fake_activation("linear_act_aux", activation)
    return input.new_empty(shape), input.new_empty(shape)


@torch.library.register_fake("cutlass_nn::activation_grad")
def _activation_grad_fake(grad_output, preact, activation, bias_grad):
    op = "activation_grad"
    _fake_common(op, "grad_output", grad_output, {"preact": preact})
    _check(
        grad_output.dim() >= 1,
        op,
        "argument 'grad_output' must have at least 1 dimension(s) [*, features], got a "
        f"{grad_output.dim()}-D tensor of shape {list(grad_output.shape)}",
    )
    _check(
        preact.shape == grad_output.shape,
        op,
        f"argument 'preact' must have the shape of 'grad_output' {list(grad_output.shape)}, "
        f"got {list(preact.shape)}",
    )
    _fake_activation(op, activation)
    grad_preact = preact.new_empty(preact.shape)  # contiguous, like the kernels' output
    grad_bias = preact.new_empty((preact.shape[-1] if bias_grad else 0,))
    return grad_preact, grad_bias


@torch.library.register_fake("cutlass_nn::linear_dgrad")
def _linear_dgrad_fake(grad_output, weight):
    _fake_common("linear_dgrad", "grad_output", grad_output, {"weight": weight})
    _check(weight.dim() == 2, "linear_dgrad", "argument 'weight' must be a 2-D tensor")
    _check(
        grad_output.dim() >= 1 and grad_output.shape[-1] == weight.shape[0],
        "linear_dgrad",
        "argument 'grad_output' must be [*, out_features] with out_features = weight.shape[0]",
    )
    return grad_output.new_empty((*grad_output.shape[:-1], weight.shape[1]))


def _fake_wgrad_shape(op, grad_output, input):
    _fake_common(op, "grad_output", grad_output, {"input": input})
    _check(
        grad_output.dim() >= 1 and input.dim() >= 1 and grad_output.shape[:-1] == input.shape[:-1],
        op,
        "arguments 'grad_output' [*, out_features] and 'input' [*, in_features] must have the "
        "same leading (batch) dimensions",
    )
    return (grad_output.shape[-1], input.shape[-1])


@torch.library.register_fake("cutlass_nn::linear_wgrad")
def _linear_wgrad_fake(grad_output, input):
    return grad_output.new_empty(_fake_wgrad_shape("linear_wgrad", grad_output, input))


@torch.library.register_fake("cutlass_nn::linear_wgrad_accumulate_")
def _linear_wgrad_accumulate_fake(grad_weight, grad_output, input):
    shape = _fake_wgrad_shape("linear_wgrad_accumulate_", grad_output, input)
    # the grad_weight checks of csrc/op_checks.cpp (device, then dtype: its own, or float32 for
    # 16-bit inputs)
    _check(
        grad_weight.device == grad_output.device,
        "linear_wgrad_accumulate_",
        f"argument 'grad_weight' must be on device {grad_output.device} (the device of "
        f"'grad_output'), got {grad_weight.device}",
    )
    half_inputs = grad_output.dtype in (torch.float16, torch.bfloat16)
    _check(
        grad_weight.dtype == grad_output.dtype or (half_inputs and grad_weight.dtype == torch.float32),
        "linear_wgrad_accumulate_",
        f"argument 'grad_weight' must have dtype {_dtype_name(grad_output.dtype)} (the dtype of "
        f"'grad_output'){' or float32' if half_inputs else ''}, got {_dtype_name(grad_weight.dtype)}",
    )
    _check(
        tuple(grad_weight.shape) == tuple(shape),
        "linear_wgrad_accumulate_",
        f"argument 'grad_weight' must have shape {list(shape)}, got {list(grad_weight.shape)}",
    )
    return None


@torch.library.register_fake("cutlass_nn::bias_grad")
def _bias_grad_fake(grad_output):
    _fake_common("bias_grad", "grad_output", grad_output, {})
    _check(grad_output.dim() >= 1, "bias_grad", "argument 'grad_output' must have at least 1 dim")
    return grad_output.new_empty((grad_output.shape[-1],))


def _fake_mm_shape(op, a, b):
    _fake_common(op, "a", a, {"b": b})
    _check(a.dim() == 2, op, f"argument 'a' must be a 2-D tensor [n, m], got {a.dim()}-D")
    _check(b.dim() == 2, op, f"argument 'b' must be a 2-D tensor [m, p], got {b.dim()}-D")
    _check(
        b.shape[0] == a.shape[1],
        op,
        f"argument 'b' must have size {a.shape[1]} in dimension 0 (m = a.shape[1]), "
        f"got shape {list(b.shape)}",
    )
    return (a.shape[0], b.shape[1])


@torch.library.register_fake("cutlass_nn::mm")
def _mm_fake(a, b):
    return a.new_empty(_fake_mm_shape("mm", a, b))


@torch.library.register_fake("cutlass_nn::mm.out")
def _mm_out_fake(a, b, *, out):
    shape = _fake_mm_shape("mm.out", a, b)
    _fake_common("mm.out", "a", a, {"out": out})
    if tuple(out.shape) != tuple(shape):
        out.resize_(shape)  # like the CPU / CUDA kernels
    return None


@torch.library.register_fake("cutlass_nn::add2")
def _add2_fake(a, b):
    _fake_common("add2", "a", a, {"b": b})
    _check(
        a.shape == b.shape,
        "add2",
        f"argument 'b' must have the shape of 'a' {list(a.shape)}, got {list(b.shape)}",
    )
    return torch.empty_like(a)


# ---------------------------------------------------------------------------------------------
# Autograd
# ---------------------------------------------------------------------------------------------


def _linear_setup(ctx, inputs, output):
    input, weight, bias = inputs
    ctx.save_for_backward(input, weight)
    ctx.has_bias = bias is not None


def _linear_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    # needs_input_grad has 2 entries, not 3, when the op was called without a bias (the
    # dispatcher drops a trailing defaulted None), and the backward must return that many
    needs = ctx.needs_input_grad
    need_input, need_weight = needs[0], needs[1]
    need_bias = len(needs) > 2 and needs[2]
    grad_input = _ops.linear_dgrad.default(grad, weight) if need_input else None
    grad_weight = _ops.linear_wgrad.default(grad, input) if need_weight else None
    grad_bias = _ops.bias_grad.default(grad) if ctx.has_bias and need_bias else None
    return (grad_input, grad_weight, grad_bias)[: len(needs)]


def _save_both(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _linear_dgrad_backward(ctx, grad):
    # out = g @ W  =>  dg = grad @ W.T = linear(grad, W);  dW = g^T @ grad = wgrad(g, grad)
    g, weight = ctx.saved_tensors
    need_g, need_w = ctx.needs_input_grad
    grad_g = _ops.linear.default(grad, weight, None) if need_g else None
    grad_w = _ops.linear_wgrad.default(g, grad) if need_w else None
    return grad_g, grad_w


def _linear_wgrad_backward(ctx, grad):
    # out = g^T @ X  =>  dg = X @ grad.T = linear(X, grad);  dX = g @ grad = dgrad(g, grad)
    g, x = ctx.saved_tensors
    need_g, need_x = ctx.needs_input_grad
    grad_g = _ops.linear.default(x, grad, None) if need_g else None
    grad_x = _ops.linear_dgrad.default(g, grad) if need_x else None
    return grad_g, grad_x


def _bias_grad_setup(ctx, inputs, output):
    ctx.input_shape = inputs[0].shape


def _bias_grad_backward(ctx, grad):
    # out[j] = sum_i g[i, j]  =>  dg[i, j] = grad[j]: a broadcast view, no arithmetic
    return grad.expand(ctx.input_shape)


def _mm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad
    grad_a = _ops.mm.default(grad, b.t()) if need_a else None
    grad_b = _ops.mm.default(a.t(), grad) if need_b else None
    return grad_a, grad_b


def _add2_setup(ctx, inputs, output):
    pass


def _add2_backward(ctx, grad):
    return grad, grad


def _linear_act_aux_setup(ctx, inputs, output):
    input, weight, bias, activation = inputs
    ctx.save_for_backward(input, weight, output[1])
    ctx.activation = activation
    ctx.has_bias = bias is not None
    # The pre-activation output is usually unused (its gradient would be a tensor of zeros): take
    # None instead of materialized zeros.
    ctx.set_materialize_grads(False)


def _act_linear_backward(ctx, input, weight, preact, grad_out, grad_preact):
    """Gradients of (act(z), z), z = input @ weight.T + bias, with incoming gradients grad_out
    (of act(z)) and grad_preact (of z), either may be None; returns the 4 input gradients."""
    needs = ctx.needs_input_grad
    need_input, need_weight = needs[0], needs[1]
    need_bias = ctx.has_bias and needs[2]
    if grad_out is None and grad_preact is None:
        return (None,) * len(needs)
    grad_bias = None
    if grad_out is None:
        grad_z = grad_preact
    else:
        fuse_bias = need_bias and grad_preact is None
        grad_z, db = _ops.activation_grad.default(grad_out, preact, ctx.activation, fuse_bias)
        if fuse_bias:
            grad_bias = db
        if grad_preact is not None:
            grad_z = _ops.add2.default(grad_z, grad_preact)
    if need_bias and grad_bias is None:
        grad_bias = _ops.bias_grad.default(grad_z)
    grad_input = _ops.linear_dgrad.default(grad_z, weight) if need_input else None
    grad_weight = _ops.linear_wgrad.default(grad_z, input) if need_weight else None
    return (grad_input, grad_weight, grad_bias, None)[: len(needs)]


def _linear_act_aux_backward(ctx, grad_out, grad_preact):
    input, weight, preact = ctx.saved_tensors
    return _act_linear_backward(ctx, input, weight, preact, grad_out, grad_preact)


def _linear_act_setup(ctx, inputs, output):
    input, weight, bias, activation = inputs
    ctx.save_for_backward(input, weight, bias)
    ctx.activation = activation
    ctx.has_bias = bias is not None


def _linear_act_backward(ctx, grad_out):
    # linear_act keeps no pre-activation, so the backward recomputes it with the linear
    # operator. cutlass_nn.functional.linear routes calls that need gradients to
    # linear_act_aux instead; this path is for direct callers of the raw operator.
    input, weight, bias = ctx.saved_tensors
    preact = _ops.linear.default(input, weight, bias)
    return _act_linear_backward(ctx, input, weight, preact, grad_out, None)


def _activation_grad_setup(ctx, inputs, output):
    grad_output, preact, activation, bias_grad = inputs
    ctx.save_for_backward(grad_output, preact)
    ctx.activation = activation
    ctx.bias_grad = bias_grad
    ctx.set_materialize_grads(False)


def _activation_second_derivative(activation: str, z: Tensor) -> Tensor:
    """act''(z) in the compute dtype (float32, float64 for float64 z), with torch ops."""
    z = z.to(torch.float64 if z.dtype == torch.float64 else torch.float32)
    if activation == "gelu":
        # act = z Phi(z): act'' = 2 phi(z) - z^2 phi(z)
        phi = torch.exp(-0.5 * z * z) * 0.3989422804014327  # 1 / sqrt(2 pi)
        return phi * (2.0 - z * z)
    if activation == "gelu_tanh":
        # act = z (1 + t) / 2, t = tanh(u), u = c (z + k z^3):
        # act'' = (1 - t^2) (u' - z t u'^2 + z u'' / 2), u' = c (1 + 3 k z^2), u'' = 6 c k z
        c, k = 0.7978845608028654, 0.044715
        t = torch.tanh(c * (z + k * z * z * z))
        du = c * (1.0 + 3.0 * k * z * z)
        ddu = 6.0 * c * k * z
        return (1.0 - t * t) * (du - z * t * du * du + 0.5 * z * ddu)
    return torch.zeros_like(z)  # "none", "relu" (0 almost everywhere)


def _activation_grad_backward(ctx, grad_grad_preact, grad_grad_bias):
    # out = g * act'(z), bias = sum over the leading dims of out. With G the total gradient
    # of out (its own plus the bias's, broadcast): dg = G * act'(z), dz = G * g * act''(z).
    grad_output, preact = ctx.saved_tensors
    need_g, need_z = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    big_g = grad_grad_preact
    if ctx.bias_grad and grad_grad_bias is not None:
        expanded = grad_grad_bias.expand(preact.shape)
        big_g = expanded if big_g is None else _ops.add2.default(big_g.contiguous(), expanded)
    if big_g is None:
        return None, None, None, None
    grad_g = (
        _ops.activation_grad.default(big_g, preact, ctx.activation, False)[0] if need_g else None
    )
    grad_z = None
    if need_z:
        if ctx.activation in ("none", "relu"):
            grad_z = None  # act'' = 0 (almost everywhere, for relu)
        else:
            second = _activation_second_derivative(ctx.activation, preact)
            grad_z = (big_g.to(second.dtype) * grad_output.to(second.dtype) * second).to(
                preact.dtype
            )
    return grad_g, grad_z, None, None


torch.library.register_autograd("cutlass_nn::linear", _linear_backward, setup_context=_linear_setup)
torch.library.register_autograd(
    "cutlass_nn::linear_act", _linear_act_backward, setup_context=_linear_act_setup
)
torch.library.register_autograd(
    "cutlass_nn::linear_act_aux", _linear_act_aux_backward, setup_context=_linear_act_aux_setup
)
torch.library.register_autograd(
    "cutlass_nn::activation_grad", _activation_grad_backward, setup_context=_activation_grad_setup
)
torch.library.register_autograd(
    "cutlass_nn::linear_dgrad", _linear_dgrad_backward, setup_context=_save_both
)
torch.library.register_autograd(
    "cutlass_nn::linear_wgrad", _linear_wgrad_backward, setup_context=_save_both
)
torch.library.register_autograd(
    "cutlass_nn::bias_grad", _bias_grad_backward, setup_context=_bias_grad_setup
)
torch.library.register_autograd("cutlass_nn::mm", _mm_backward, setup_context=_save_both)
torch.library.register_autograd("cutlass_nn::add2", _add2_backward, setup_context=_add2_setup)


# ---------------------------------------------------------------------------------------------
# Kernel-selection hooks of the CUDA flavor (used by the GPU tests and benchmarks)
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def force_sm80_kernels(enable: bool = True) -> Iterator[None]:
    """Within the block, GEMMs use the CUTLASS 2.x (SM80) kernels even on Hopper GPUs.

    Process-wide (not per thread); a no-op in the CPU flavor. Not for use inside a
    ``torch.compile``-d function.
    """
    previous = _ops._set_force_sm80(enable)
    try:
        yield
    finally:
        _ops._set_force_sm80(previous)


def last_kernel_name() -> str:
    """Name of the GEMM kernel that the last cutlass_nn GEMM on this thread ran ("" if none)."""
    return _ops._last_kernel_name()
