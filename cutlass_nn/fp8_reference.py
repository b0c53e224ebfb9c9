"""The FP8 training arithmetic of a linear layer, written with plain torch operations.

This is the reference that FP8 kernels are checked against (issue "FP8 training on Hopper"): the
quantization of each operand (its scale from the operand's own absolute maximum, "dynamic"
scaling), the three GEMMs of a linear layer on the quantized operands, and which scale belongs to
which axis of each GEMM under the two recipes. It runs on any device (the quantization uses
torch's float8 dtypes, the GEMMs dequantize to float32 and multiply in float32), so the CPU test
suite can check every layer above the kernels. It is not a fast path: on a GPU it is slower than
plain bf16.

Conventions:

* ``quantize(x, fmt, dim)`` returns ``(data, scale)`` with ``x ~= data.float() * scale``: ``data``
  in float8 (``"e4m3"`` = ``torch.float8_e4m3fn``, largest 448; ``"e5m2"`` =
  ``torch.float8_e5m2``, largest 57344) and ``scale`` the float32 *dequantization* factor, one
  for the tensor (``dim=None``, a 0-dim tensor) or one per slice (``dim=d``: the absolute maximum
  over dimension ``d``, kept as a size-1 dimension so that it broadcasts). The operand's absolute
  maximum maps onto the format's largest value (a maximum under ``AMAX_FLOOR``, an all-zero slice
  among them, is taken as ``AMAX_FLOOR``); scales are not rounded to powers of two.
* ``scaled_mm(a, a_scale, b, b_scale)`` = ``(a * a_scale) @ (b * b_scale)`` in float32, plus an
  optional bias, rounded to ``out_dtype``; ``a_scale`` is one value or one per row of ``a``
  (``[M, 1]``), ``b_scale`` one value or one per column of ``b`` (``[1, N]``), the only scales
  that factor out of the dot products. The scales are applied to the elements before the float32
  dot products; a kernel applies their product after accumulating, and Hopper's FP8 tensor cores
  accumulate with fewer bits unless partial sums are promoted, so kernel tests need a tolerance
  that grows with K, not this module's float32 one.
* Recipes: **tensorwise** (one scale per operand; the weight is quantized once and serves the
  forward and the input gradient) and **rowwise** (per row of the activations and of the output
  gradient, per output channel of the weight; each GEMM needs its operands scaled along the axis
  that is not summed over, so the backward quantizes the weight per input channel, the output
  gradient per column and the input per column for the weight gradient). Forward operands are
  e4m3; gradients e4m3 or e5m2 (``Fp8Recipe.grad_format``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: The float8 formats by name.
FORMATS: dict[str, torch.dtype] = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
#: Recipe names (see the module docstring).
SCALINGS = ("tensorwise", "rowwise")
#: Smallest absolute maximum a scale is computed from: an all-zero slice quantizes to zeros with a
#: finite scale instead of dividing by zero.
AMAX_FLOOR = 1e-12


@dataclass(frozen=True)
class Fp8Recipe:
    """How a linear layer's operands are scaled (``scaling``: ``"tensorwise"`` or ``"rowwise"``),
    the float8 format of its gradients (``grad_format``: ``"e4m3"`` or ``"e5m2"``; forward
    operands are always e4m3), and whether the forward GEMM may accumulate without promotion
    (``fast_accum_forward``: on Hopper the tensor cores' partial sums are not promoted to float32
    every 128 of K -- faster, less accurate over a long K; the choice of torchao's and
    TransformerEngine's recipes for the forward GEMM; it applies where the kernel without
    promotion runs, e4m3 x e4m3 with a bfloat16 output on SM90, and other forward GEMMs stay
    promoted. This reference, and the CPU, compute the forward exactly either way)."""

    scaling: str = "tensorwise"
    grad_format: str = "e4m3"
    fast_accum_forward: bool = False

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS:
            raise ValueError(
                f"cutlass_nn.fp8_reference.Fp8Recipe: argument 'scaling' must be one of "
                f"{', '.join(SCALINGS)}, got {self.scaling!r}"
            )
        if self.grad_format not in FORMATS:
            raise ValueError(
                f"cutlass_nn.fp8_reference.Fp8Recipe: argument 'grad_format' must be one of "
                f"{', '.join(FORMATS)}, got {self.grad_format!r}"
            )
        if not isinstance(self.fast_accum_forward, bool):
            raise TypeError(
                "cutlass_nn.fp8_reference.Fp8Recipe: argument 'fast_accum_forward' must be a "
                f"bool, got {type(self.fast_accum_forward).__name__}"
            )


def _format(op: str, fmt: str) -> torch.dtype:
    if fmt not in FORMATS:
        raise ValueError(
            f"cutlass_nn.fp8_reference.{op}: argument 'fmt' must be one of {', '.join(FORMATS)}, "
            f"got {fmt!r}"
        )
    return FORMATS[fmt]


def quantize(x: Tensor, fmt: str = "e4m3", dim: int | None = None) -> tuple[Tensor, Tensor]:
    """``(data, scale)`` with ``x ~= data.float() * scale`` (see the module docstring). ``x``: a
    floating-point tensor with finite values (ValueError otherwise: an infinite or NaN maximum
    would give every element of its slice a meaningless scale); ``dim``: None for one scale, or
    the dimension the absolute maximum is taken over (one scale per slice)."""
    dtype = _format("quantize", fmt)
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dtype in FORMATS.values():
        got = type(x).__name__ if not isinstance(x, Tensor) else f"a {x.dtype} tensor"
        raise TypeError(
            f"cutlass_nn.fp8_reference.quantize: argument 'x' must be a floating-point tensor "
            f"(not float8), got {got}"
        )
    if dim is not None and not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"cutlass_nn.fp8_reference.quantize: argument 'dim' must index a dimension of the "
            f"{x.dim()}-d input, got {dim}"
        )
    if not bool(torch.isfinite(x).all()):
        raise ValueError(
            "cutlass_nn.fp8_reference.quantize: argument 'x' has infinite or NaN values; FP8 "
            "scaling needs a finite absolute maximum"
        )
    if not bool(torch.isfinite(x.detach().float()).all()):
        raise ValueError(
            f"cutlass_nn.fp8_reference.quantize: argument 'x' has values beyond the float32 range "
            f"(its dtype is {x.dtype}); FP8 scales are float32"
        )
    return quantize_unchecked(x, fmt, dim)


def quantize_unchecked(x: Tensor, fmt: str = "e4m3", dim: int | None = None) -> tuple[Tensor, Tensor]:
    """The arithmetic of :func:`quantize` without its checks, so without a host synchronization
    (what the FP8 layers run on every step). A non-finite value makes its slice's scale
    infinite and its data NaN, so the GEMM's result is NaN there, not finite garbage."""
    dtype = FORMATS[fmt]
    xf = x.detach().float()
    if xf.numel() == 0:  # no maximum to take: the floor's scale, the shape of a reduction
        shape = () if dim is None else tuple(1 if d == dim % x.dim() else s
                                             for d, s in enumerate(x.shape))
        amax = torch.zeros(shape, dtype=torch.float32, device=x.device)
    else:
        amax = xf.abs().amax() if dim is None else xf.abs().amax(dim=dim, keepdim=True)
    largest = torch.finfo(dtype).max
    # largest / amax as torch's scalar / tensor computes it: the reciprocal, then the product
    # (two float32 roundings; the CUDA kernel of fp8_quantize does the same, bitwise)
    quant_scale = amax.clamp_min(AMAX_FLOOR).reciprocal() * largest
    data = (xf * quant_scale).clamp(-largest, largest).to(dtype)
    return data, quant_scale.reciprocal()


def cast_with_scale(x: Tensor, scale: Tensor, fmt: str = "e4m3") -> Tensor:
    """``x`` quantized with known dequantization scales (``scale``: one value or a shape that
    broadcasts against ``x``, e.g. the scale an earlier :func:`quantize` of the same tensor
    returned): ``cast(clamp(x * (1 / scale)))``, the reciprocal rounded to float32. With the
    scale of ``quantize(x)`` the data can differ from ``quantize(x)``'s in the last FP8 bit where
    ``1 / (1 / q)`` is not ``q`` in float32 and the product lies on a rounding boundary; it is
    what a layer's backward computes when it reuses the forward's scale instead of taking the
    maximum again."""
    dtype = FORMATS[fmt]
    largest = torch.finfo(dtype).max
    return (x.detach().float() * scale.reciprocal()).clamp(-largest, largest).to(dtype)


def dequantize(data: Tensor, scale: Tensor) -> Tensor:
    """``data.float() * scale`` (float32)."""
    return data.float() * scale


def _describe(value) -> str:
    """What an argument is, for error messages: a tensor's dtype and shape, else its type."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__


def _check_scale(op: str, name: str, scale: Tensor, rows: int, cols: int, per: str) -> None:
    """A scale is one value, or one per row (``per == "row"``: ``[rows, 1]``) or per column
    (``[1, cols]``) of its operand."""
    want = (rows, 1) if per == "row" else (1, cols)
    ok = isinstance(scale, Tensor) and scale.dtype == torch.float32 and (
        tuple(scale.shape) in ((), (1,), want)
    )
    if not ok:
        raise ValueError(
            f"cutlass_nn.fp8_reference.{op}: argument '{name}' must be a float32 tensor of shape "
            f"[] or [1] (one value) or {list(want)} (one per {per}), got {_describe(scale)}"
        )


def scaled_mm(
    a: Tensor,
    a_scale: Tensor,
    b: Tensor,
    b_scale: Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: Tensor | None = None,
) -> Tensor:
    """``(a * a_scale) @ (b * b_scale) [+ bias]``: float8 ``a`` ``[M, K]`` and ``b`` ``[K, N]``,
    float32 scales (one value, or ``[M, 1]`` for ``a`` and ``[1, N]`` for ``b``), float32
    products and sums, the result rounded to ``out_dtype``."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, Tensor) or t.dtype not in FORMATS.values() or t.dim() != 2:
            got = f"a {t.dim()}-d {t.dtype} tensor" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"cutlass_nn.fp8_reference.scaled_mm: argument '{name}' must be a 2-d float8 "
                f"tensor, got {got}"
            )
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"cutlass_nn.fp8_reference.scaled_mm: argument 'b' must have {a.shape[1]} rows "
            f"(the columns of 'a'), got shape {list(b.shape)}"
        )
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise ValueError(
            f"cutlass_nn.fp8_reference.scaled_mm: argument 'out_dtype' must be a floating-point "
            f"torch.dtype, got {out_dtype!r}"
        )
    m, n = a.shape[0], b.shape[1]
    _check_scale("scaled_mm", "a_scale", a_scale, m, n, "row")
    _check_scale("scaled_mm", "b_scale", b_scale, m, n, "column")
    out = dequantize(a, a_scale) @ dequantize(b, b_scale)
    if bias is not None:
        if tuple(bias.shape) != (n,):
            raise ValueError(
                f"cutlass_nn.fp8_reference.scaled_mm: argument 'bias' must have shape [{n}], "
                f"got {list(bias.shape)}"
            )
        out = out + bias.float()
    return out.to(out_dtype)


def _check_linear(op: str, x, weight, recipe, bias=None, grad_output=None) -> None:
    """The arguments of linear_forward / linear_backward: ``weight`` ``[N, K]``, ``x``
    ``[..., K]`` (at least 1-d), ``bias`` None or ``[N]``, ``grad_output`` ``[..., N]`` with
    ``x``'s leading dimensions, floating-point tensors, ``recipe`` an Fp8Recipe."""

    def fail(name: str, want: str, t) -> None:
        raise ValueError(
            f"cutlass_nn.fp8_reference.{op}: argument '{name}' must be {want}, got {_describe(t)}"
        )

    if not isinstance(recipe, Fp8Recipe):
        raise TypeError(
            f"cutlass_nn.fp8_reference.{op}: argument 'recipe' must be an Fp8Recipe, got "
            f"{type(recipe).__name__}"
        )
    if not isinstance(weight, Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        fail("weight", "a 2-d floating-point tensor [out_features, in_features]", weight)
    n, k = weight.shape
    if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[-1] != k or not x.is_floating_point():
        fail("x", f"a floating-point tensor [..., {k}] (in_features last)", x)
    if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (n,)):
        fail("bias", f"None or a tensor of shape [{n}]", bias)
    if grad_output is not None:
        want = (*x.shape[:-1], n)
        if not isinstance(grad_output, Tensor) or tuple(grad_output.shape) != want:
            fail("grad_output", f"a tensor of shape {list(want)} (x's leading dimensions, then "
                 "out_features)", grad_output)


def _forward_operands(x2: Tensor, weight: Tensor, recipe: Fp8Recipe):
    """The forward GEMM ``x2 @ weight^T``: x per row, the weight per output channel (rowwise)."""
    per = 1 if recipe.scaling == "rowwise" else None
    xq, xs = quantize(x2, "e4m3", per)
    wq, ws = quantize(weight, "e4m3", per)  # [N, K], scales [N, 1] or one
    return xq, xs, wq.t(), ws.t() if ws.dim() else ws


def linear_forward(
    x: Tensor, weight: Tensor, bias: Tensor | None, recipe: Fp8Recipe = Fp8Recipe()
) -> Tensor:
    """``y = x W^T + b`` on e4m3 operands (``x``: ``[..., K]``, ``weight``: ``[N, K]``), in
    ``x``'s dtype."""
    _check_linear("linear_forward", x, weight, recipe, bias=bias)
    k = weight.shape[1]
    x2 = x.reshape(-1, k)
    xq, xs, wq_t, ws_t = _forward_operands(x2, weight, recipe)
    y = scaled_mm(xq, xs, wq_t, ws_t, x.dtype, bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _backward_operand(t: Tensor, rowwise: bool) -> tuple[Tensor, Tensor]:
    """``x`` or the weight for a backward GEMM: rowwise, quantized per column (an axis the
    forward did not scale along); tensorwise, cast with the forward's scale (the same maximum,
    so the same scale: :func:`cast_with_scale`, no second maximum)."""
    if rowwise:
        return quantize(t, "e4m3", 0)
    scale = quantize(t, "e4m3", None)[1]
    return cast_with_scale(t, scale, "e4m3"), scale


def linear_backward(
    grad_output: Tensor,
    x: Tensor,
    weight: Tensor,
    recipe: Fp8Recipe = Fp8Recipe(),
    needs: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The input, weight and bias gradients of ``linear_forward`` (each None where ``needs``
    says so): ``dX = dY W`` and ``dW = dY^T X`` on quantized operands (the output gradient in
    ``recipe.grad_format``, ``x`` and ``weight`` in e4m3), the bias gradient as the float32 column
    sums of the unquantized output gradient. Rowwise: dY per row and W per input channel for
    ``dX``; dY per output channel and X per input channel for ``dW``."""
    _check_linear("linear_backward", x, weight, recipe, grad_output=grad_output)
    n, k = weight.shape
    g2 = grad_output.reshape(-1, n)
    x2 = x.reshape(-1, k)
    gfmt = recipe.grad_format
    rowwise = recipe.scaling == "rowwise"
    dx = dw = db = None
    if needs[0]:
        gq, gs = quantize(g2, gfmt, 1 if rowwise else None)  # per row m
        wq, ws = _backward_operand(weight, rowwise)  # per column k: [1, K]
        dx = scaled_mm(gq, gs, wq, ws, x.dtype).reshape(x.shape)
    if needs[1]:
        gq, gs = quantize(g2, gfmt, 0 if rowwise else None)  # per column n: [1, N]
        xq, xs = _backward_operand(x2, rowwise)  # per column k: [1, K]
        dw = scaled_mm(gq.t(), gs.t() if gs.dim() else gs, xq, xs, weight.dtype)
    if needs[2]:
        db = g2.float().sum(0)
    return dx, dw, db


class Fp8LinearReference(torch.autograd.Function):
    """Autograd of ``linear_forward`` / ``linear_backward`` (first order only): what an FP8
    ``CutlassLinear`` computes, for tests. ``apply(x, weight, bias, recipe)``."""

    @staticmethod
    def forward(ctx, x, weight, bias, recipe):
        ctx.save_for_backward(x, weight)
        ctx.recipe = recipe
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return linear_forward(x, weight, bias, recipe)

    @staticmethod
    def backward(ctx, grad_output):
        x, weight = ctx.saved_tensors
        needs = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        dx, dw, db = linear_backward(grad_output, x, weight, ctx.recipe, needs)
        if db is not None:
            db = db.to(ctx.bias_dtype)
        return dx, dw, db, None
