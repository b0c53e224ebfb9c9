"""FP8 training of linear layers: the forward and both gradients of ``y = x W^T + b`` on float8
operands with dynamic scaling, the GEMMs on :func:`cutlass_nn.ops.fp8_scaled_mm` (cutlass_nn's
SM90 FP8 kernels on Hopper, the same arithmetic in ATen elsewhere).

The arithmetic is :mod:`cutlass_nn.fp8_reference`'s, step for step (the tests check them equal; the
one difference: the bias is rounded to the output dtype before the add, see :func:`linear`):
each operand is quantized from its own absolute maximum on every call (``Fp8Recipe.scaling``
"tensorwise": one scale per operand; "rowwise": per row of the activations and of the output
gradient, per output channel of the weight, and for the backward along the axes each GEMM does
not sum over), forward operands in e4m3, the output gradient in ``Fp8Recipe.grad_format``; float32
accumulation; outputs in the input's dtype (the autocast dtype under ``torch.autocast``), the
weight gradient in the weight's dtype, the bias gradient as float32 column sums of the
unquantized output gradient. Parameters keep their dtype; nothing FP8 is stored between steps, so
``state_dict`` is unchanged. The backward keeps what ``nn.Linear``'s keeps (the input and the
weight) and quantizes them again along the axes its GEMMs need
(:func:`cutlass_nn.ops.fp8_quantize`, which writes transposed operands directly; a tensorwise
output gradient is quantized once into both layouts, :func:`cutlass_nn.ops.fp8_quantize_both`).

Entry points: :func:`linear` (autograd), :func:`eligible` (the size rule that
:func:`cutlass_nn.convert` applies with ``precision="fp8"``), and ``CutlassLinear(...,
precision="fp8")``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from cutlass_nn import ops
from cutlass_nn.fp8_reference import Fp8Recipe

__all__ = ["Fp8Recipe", "MIN_FEATURES", "eligible", "linear"]

#: The smallest in_features and out_features a layer converts to FP8 with: below it the GEMM
#: gains too little over bf16 to pay for quantizing its operands on every step (see
#: benchmarks/NOTES.md, FP8). Both must also be multiples of 16 (the FP8 kernels read 16-byte rows).
MIN_FEATURES = 1024


def eligible(in_features: int, out_features: int) -> bool:
    """Whether a linear layer of this shape runs in FP8 under ``convert(precision="fp8")``: both
    dimensions at least :data:`MIN_FEATURES` and multiples of 16."""
    return (
        in_features >= MIN_FEATURES
        and out_features >= MIN_FEATURES
        and in_features % 16 == 0
        and out_features % 16 == 0
    )


def _transposed_scale(scale: Tensor) -> Tensor:
    return scale.t() if scale.dim() == 2 else scale


class _Fp8Linear(torch.autograd.Function):
    """``apply(x, weight, bias, scaling, grad_format, out_dtype)``: first order only (the
    quantization has no useful derivative to differentiate again).

    Every GEMM operand comes out of :func:`cutlass_nn.ops.fp8_quantize` in the layout the FP8
    kernels read (A row-major, B column-major, both K-major): the backward's transposed operands
    are written transposed by the quantization itself. The backward quantizes ``x`` and the
    weight again (rowwise: per column; tensorwise: cast with the forward's two scales,
    :func:`cutlass_nn.ops.fp8_cast`, no second maximum), so only ``x`` and the weight are kept,
    as ``nn.Linear`` keeps them (plus two one-element scales)."""

    @staticmethod
    def forward(ctx, x, weight, bias, scaling, grad_format, out_dtype):
        n, k = weight.shape
        x2 = x.reshape(-1, k)
        axis = "row" if scaling == "rowwise" else "tensor"
        xq, xs = ops.fp8_quantize(x2, "e4m3", axis)
        wq, ws = ops.fp8_quantize(weight, "e4m3", axis)  # [N, K], scales [N, 1] or one
        b = None if bias is None else bias.to(out_dtype)
        y = ops.fp8_scaled_mm(xq, wq.t(), xs, _transposed_scale(ws), b, out_dtype)
        # tensorwise: the backward casts x and the weight with these scales (no second maximum)
        ctx.save_for_backward(x2, weight, *(() if scaling == "rowwise" else (xs, ws)))
        ctx.scaling, ctx.grad_format = scaling, grad_format
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.weight_dtype = weight.dtype
        return y.reshape(*x.shape[:-1], n)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        x2, weight, *forward_scales = ctx.saved_tensors
        n = weight.shape[0]
        g2 = grad_output.reshape(-1, n)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        rowwise = ctx.scaling == "rowwise"
        fmt = ctx.grad_format
        dx = dw = db = None
        gq = gt = None
        if need_x and need_w and not rowwise:
            # one scale for both GEMMs: one quantization of dY writes both layouts
            gq, gt, gs = ops.fp8_quantize_both(g2, fmt, "tensor")
            gts = gs
        if need_x:
            # dX = dY W: dY per row (or one scale), W per input channel (column) as B = W
            # column-major, i.e. W^T [K, N] quantized per row, transposed back.
            if gq is None:
                gq, gs = ops.fp8_quantize(g2, fmt, "row" if rowwise else "tensor")
            if rowwise:
                wt, wts = ops.fp8_quantize(weight, "e4m3", "column", True)
            else:
                wts = forward_scales[1]
                wt = ops.fp8_cast(weight, wts, "e4m3", True)
            dx = ops.fp8_scaled_mm(gq, wt.t(), gs, _transposed_scale(wts), None, ctx.x_dtype)
            dx = dx.reshape(ctx.x_shape)
        if need_w:
            # dW = dY^T X: A = dY^T [N, T] per row (a column of dY), B = X column-major (X^T
            # [K, T] per row, transposed back).
            axis = "column" if rowwise else "tensor"
            if gt is None:
                gt, gts = ops.fp8_quantize(g2, fmt, axis, True)
            if rowwise:
                xt, xts = ops.fp8_quantize(x2, "e4m3", axis, True)
            else:
                xts = forward_scales[0]
                xt = ops.fp8_cast(x2, xts, "e4m3", True)
            dw = ops.fp8_scaled_mm(gt, xt.t(), gts, _transposed_scale(xts), None,
                                   ctx.weight_dtype)
        if need_b and ctx.bias_dtype is not None:
            db = g2.float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None


def _check(op: str, x, weight, bias, recipe) -> None:
    if not isinstance(recipe, Fp8Recipe):
        raise TypeError(
            f"cutlass_nn.fp8.{op}: argument 'recipe' must be a cutlass_nn.fp8.Fp8Recipe, got "
            f"{type(recipe).__name__}"
        )
    for name, t in (("input", x), ("weight", weight)):
        if not isinstance(t, Tensor) or t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            got = f"a {t.dtype} tensor" if isinstance(t, Tensor) else type(t).__name__
            raise TypeError(
                f"cutlass_nn.fp8.{op}: argument '{name}' must be a float16, bfloat16 or float32 "
                f"tensor, got {got}"
            )
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"cutlass_nn.fp8.{op}: argument 'input' must have a last dimension of "
            f"{weight.shape[1] if weight.dim() == 2 else '?'} (weight [out_features, in_features] "
            f"= {list(weight.shape)}), got shape {list(x.shape)}"
        )
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        got = list(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
        raise ValueError(
            f"cutlass_nn.fp8.{op}: argument 'bias' must be None or a tensor of shape "
            f"[{weight.shape[0]}], got {got}"
        )
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(
                f"cutlass_nn.fp8.{op}: argument '{name}' must be on device {x.device} (the "
                f"device of 'input'), got {t.device}"
            )


def linear(
    input: Tensor, weight: Tensor, bias: Tensor | None = None, recipe: Fp8Recipe = Fp8Recipe()
) -> Tensor:
    """``input @ weight.T + bias`` trained in FP8 (see the module docstring): ``input``
    ``[*, in_features]``, ``weight`` ``[out_features, in_features]``, ``bias``
    ``[out_features]`` or None, ``recipe`` the scaling and gradient format. The output has
    ``input``'s dtype, or the autocast dtype inside ``torch.autocast``; gradients reach
    ``input``, ``weight`` and ``bias`` (first order). The bias is rounded to the output dtype
    before it is added (as under autocast; the reference adds it in float32, so a float32 bias
    beside a 16-bit input differs from it by that rounding). On Hopper the GEMMs run on the FP8
    kernels for bfloat16 and float32 outputs; a float16 output (float16 inputs, or autocast to
    float16) and a weight gradient over a token count that is not a multiple of 16 take the ATen
    path of :func:`cutlass_nn.ops.fp8_scaled_mm` (correct, much slower)."""
    _check("linear", input, weight, bias, recipe)
    out_dtype = input.dtype
    if torch.is_autocast_enabled(input.device.type):
        out_dtype = torch.get_autocast_dtype(input.device.type)
    return _Fp8Linear.apply(input, weight, bias, recipe.scaling, recipe.grad_format, out_dtype)
