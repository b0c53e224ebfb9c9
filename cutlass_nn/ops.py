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


@torch.library.register_fake("cutlass_nn::linear")
def _linear_fake(input, weight, bias=None):
    _fake_common("linear", "input", input, {"weight": weight, **({"bias": bias} if bias is not None else {})})
    _check(input.dim() >= 1, "linear", "argument 'input' must have at least 1 dimension(s)")
    _check(weight.dim() == 2, "linear", "argument 'weight' must be a 2-D tensor")
    _check(
        input.shape[-1] == weight.shape[1],
        "linear",
        f"argument 'input' must have size {weight.shape[1]} in its last dimension "
        f"(in_features = weight.shape[1]), got shape {list(input.shape)}",
    )
    if bias is not None:
        _check(
            bias.dim() == 1 and bias.shape[0] == weight.shape[0],
            "linear",
            f"argument 'bias' must be a 1-D tensor [out_features] of size {weight.shape[0]}, "
            f"got shape {list(bias.shape)}",
        )
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


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


torch.library.register_autograd("cutlass_nn::linear", _linear_backward, setup_context=_linear_setup)
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
