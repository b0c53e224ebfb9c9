"""The FP8 reference arithmetic (cutlass_nn.fp8_reference): quantization error and scales, the
scaled GEMM against float64, and the scale axes of each GEMM of a linear layer under both
recipes, checked against float64 products of independently dequantized operands."""

from __future__ import annotations

import pytest
import torch

from cutlass_nn import fp8_reference as f8

FMT_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
# Relative spacing of the formats' normal numbers: 3 / 2 mantissa bits (round to nearest: half of
# it); the smallest normal numbers are 2^-6 (e4m3) and 2^-14 (e5m2) of the scaled values.
REL = {"e4m3": 2.0**-4, "e5m2": 2.0**-3}
MIN_NORMAL = {"e4m3": 2.0**-6, "e5m2": 2.0**-14}

RECIPES = [f8.Fp8Recipe(s, g) for s in f8.SCALINGS for g in f8.FORMATS]
RECIPE_IDS = [f"{r.scaling}-{r.grad_format}" for r in RECIPES]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def _randn(gen, *shape, dtype=torch.float32, spread=False):
    x = torch.randn(*shape, generator=gen)
    if spread:  # rows of very different magnitudes: what rowwise scaling is for
        x = x * torch.logspace(-3, 3, shape[0]).reshape(-1, *([1] * (len(shape) - 1)))
    return x.to(dtype)


def _bound(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """Largest rounding error of each element: half a unit in the last place of a normal number
    (relative REL), or half the subnormal spacing (MIN_NORMAL * 2^-mantissa bits: 2^-9 for e4m3,
    2^-16 for e5m2, in scaled units) below the normal range; plus the float32 rounding of the
    dequantizing product."""
    spacing = MIN_NORMAL[fmt] * (2.0**-3 if fmt == "e4m3" else 2.0**-2)
    rounding = torch.maximum(x.abs() * REL[fmt], 0.5 * spacing * scale.expand_as(x))
    return rounding * (1 + 2.0**-20) + 1e-30


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_quantize_error_and_scale(fmt, dim, gen):
    x = _randn(gen, 37, 53, spread=True)
    data, scale = f8.quantize(x, fmt, dim)
    assert data.dtype == f8.FORMATS[fmt] and data.shape == x.shape
    assert scale.dtype == torch.float32
    want_shape = () if dim is None else tuple(1 if d == dim else s for d, s in enumerate(x.shape))
    assert tuple(scale.shape) == want_shape
    back = f8.dequantize(data, scale)
    err = (back - x).abs()
    assert bool((err <= _bound(x, scale, fmt)).all()), float((err / _bound(x, scale, fmt)).max())
    # the absolute maximum of each slice lands on the format's largest value
    amax = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    largest = data.float().abs().amax() if dim is None else data.float().abs().amax(dim, True)
    assert torch.equal(largest, torch.full_like(largest, FMT_MAX[fmt]))
    assert torch.allclose(scale * FMT_MAX[fmt], amax, rtol=1e-6)


def test_quantize_keeps_input_and_handles_zeros(gen):
    x = _randn(gen, 8, 16, dtype=torch.bfloat16)
    x[3] = 0
    before = x.clone()
    data, scale = f8.quantize(x, "e4m3", 1)
    assert torch.equal(x, before)
    assert bool(torch.isfinite(scale).all())
    assert torch.equal(data[3].float(), torch.zeros(16))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_quantize_rejects_non_finite(bad, gen):
    x = _randn(gen, 4, 4)
    x[1, 2] = bad
    with pytest.raises(ValueError, match=r"fp8_reference.quantize: argument 'x' has infinite"):
        f8.quantize(x)


def test_quantize_beyond_float32_and_empty():
    with pytest.raises(ValueError, match=r"argument 'x' has values beyond the float32 range"):
        f8.quantize(torch.tensor([1.0, 1e39], dtype=torch.float64))
    for dim, scale_shape in [(None, ()), (0, (1, 5)), (1, (0, 1))]:
        data, scale = f8.quantize(torch.zeros(0, 5), "e4m3", dim)
        assert data.shape == (0, 5) and tuple(scale.shape) == scale_shape
        assert bool(torch.isfinite(scale).all())


def test_quantize_subnormal_rounding():
    """Values far below the slice's maximum land in the subnormal range: rounded to the nearest
    multiple of the spacing, not flushed to zero."""
    for fmt, spacing in [("e4m3", 2.0**-9), ("e5m2", 2.0**-16)]:
        largest = FMT_MAX[fmt]
        x = torch.tensor([largest, spacing, 3 * spacing, 0.4 * spacing, 0.6 * spacing])
        data, scale = f8.quantize(x, fmt)
        assert float(scale) == 1.0
        assert data.float().tolist() == [largest, spacing, 3 * spacing, 0.0, spacing]


def test_quantize_argument_errors(gen):
    x = _randn(gen, 4, 4)
    with pytest.raises(ValueError, match=r"quantize: argument 'fmt' must be one of e4m3, e5m2"):
        f8.quantize(x, "e3m4")
    with pytest.raises(ValueError, match=r"quantize: argument 'dim' must index a dimension"):
        f8.quantize(x, "e4m3", 2)
    with pytest.raises(ValueError, match=r"quantize: argument 'dim' must index a dimension"):
        f8.quantize(torch.tensor(1.0), "e4m3", 0)
    with pytest.raises(TypeError, match=r"quantize: argument 'x' must be a floating-point"):
        f8.quantize(torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"argument 'x' must be a floating-point tensor \(not"):
        f8.quantize(torch.ones(3).to(torch.float8_e4m3fn))


def test_recipe_validation():
    assert f8.Fp8Recipe() == f8.Fp8Recipe("tensorwise", "e4m3")
    with pytest.raises(ValueError, match=r"Fp8Recipe: argument 'scaling' must be one of"):
        f8.Fp8Recipe("blockwise")
    with pytest.raises(ValueError, match=r"Fp8Recipe: argument 'grad_format' must be one of"):
        f8.Fp8Recipe("rowwise", "e8m0")


@pytest.mark.parametrize("rowwise", [False, True])
def test_scaled_mm_matches_float64(rowwise, gen):
    m, k, n = 33, 70, 19
    a, a_s = f8.quantize(_randn(gen, m, k, spread=True), "e4m3", 1 if rowwise else None)
    bt, b_s = f8.quantize(_randn(gen, n, k), "e5m2", 1 if rowwise else None)
    b, b_s = bt.t(), b_s.t() if b_s.dim() else b_s
    bias = _randn(gen, n)
    out = f8.scaled_mm(a, a_s, b, b_s, torch.float32, bias)
    ref = (a.double() * a_s.double()) @ (b.double() * b_s.double()) + bias.double()
    tol = 1e-5 * ((a.double() * a_s.double()).abs() @ (b.double() * b_s.double()).abs()) + 1e-30
    assert out.dtype == torch.float32 and bool(((out.double() - ref).abs() <= tol).all())
    assert f8.scaled_mm(a, a_s, b, b_s).dtype == torch.bfloat16


def test_scaled_mm_mixed_scales_and_bf16_output(gen):
    """One operand per row, the other tensorwise; a bf16 result within one bf16 rounding of the
    float64 product."""
    a, a_s = f8.quantize(_randn(gen, 9, 40, spread=True), "e4m3", 1)
    b, b_s = f8.quantize(_randn(gen, 40, 12), "e5m2")
    out = f8.scaled_mm(a, a_s, b, b_s)
    ref = (a.double() * a_s.double()) @ (b.double() * b_s.double())
    tol = 2.0**-8 * ref.abs() + 1e-5 * ((a.double() * a_s).abs() @ (b.double() * b_s).abs())
    assert out.dtype == torch.bfloat16 and bool(((out.double() - ref).abs() <= tol).all())


def test_scaled_mm_argument_errors(gen):
    a, a_s = f8.quantize(_randn(gen, 4, 8), "e4m3", 1)
    b, b_s = f8.quantize(_randn(gen, 8, 6), "e4m3", 0)
    with pytest.raises(ValueError, match=r"scaled_mm: argument 'a' must be a 2-d float8 tensor"):
        f8.scaled_mm(a.float(), a_s, b, b_s)
    with pytest.raises(ValueError, match=r"scaled_mm: argument 'b' must have 8 rows"):
        f8.scaled_mm(a, a_s, b[:5], b_s)
    with pytest.raises(ValueError, match=r"argument 'a_scale' must be a float32 .* \[4, 1\]"):
        f8.scaled_mm(a, a_s.t(), b, b_s)
    with pytest.raises(ValueError, match=r"argument 'b_scale' .* \[1, 6\] \(one per column\)"):
        f8.scaled_mm(a, a_s, b, b_s.t())
    with pytest.raises(ValueError, match=r"argument 'bias' must have shape \[6\]"):
        f8.scaled_mm(a, a_s, b, b_s, bias=torch.ones(5))
    with pytest.raises(ValueError, match=r"argument 'a_scale' .* got a torch.float32 tensor of "):
        f8.scaled_mm(a, torch.ones(1, 1, 1), b, b_s)
    with pytest.raises(ValueError, match=r"scaled_mm: argument 'out_dtype' must be a floating"):
        f8.scaled_mm(a, a_s, b, b_s, torch.int32)


def _deq64(x, fmt, dim):
    d, s = f8.quantize(x, fmt, dim)
    return d.double() * s.double()


def _assert_product(got, a64, b64, add=None):
    """got == a64 @ b64 (+ add) within float32 accumulation error: relative to the sum of the
    products' magnitudes (cancellation leaves the result itself much smaller)."""
    ref = a64 @ b64 + (0 if add is None else add)
    tol = 1e-5 * (a64.abs() @ b64.abs()) + 1e-30 + (0 if add is None else 1e-6 * add.abs())
    err = (got.double() - ref).abs()
    assert bool((err <= tol).all()), float((err / tol).max())


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_linear_forward_and_backward_scale_axes(recipe, gen):
    """Each GEMM equals the float64 product of its operands quantized along the recipe's axes
    (computed here independently), and the result is close to the unquantized linear."""
    rw = recipe.scaling == "rowwise"
    x = _randn(gen, 3, 11, 40, spread=True)  # [3, 11, K]: rows of very different magnitudes
    w = _randn(gen, 24, 40) * 0.1
    b = _randn(gen, 24)
    gy = _randn(gen, 3, 11, 24)
    x2, g2 = x.reshape(-1, 40), gy.reshape(-1, 24)
    row, col = (1, 0) if rw else (None, None)

    y = f8.linear_forward(x, w, b, recipe)
    _assert_product(
        y.reshape(-1, 24), _deq64(x2, "e4m3", row), _deq64(w, "e4m3", row).t(), b.double()
    )

    dx, dw, db = f8.linear_backward(gy, x, w, recipe)
    gf = recipe.grad_format
    _assert_product(dx.reshape(-1, 40), _deq64(g2, gf, row), _deq64(w, "e4m3", col))
    _assert_product(dw, _deq64(g2, gf, col).t(), _deq64(x2, "e4m3", col))
    torch.testing.assert_close(db.double(), g2.double().sum(0), rtol=1e-5, atol=1e-5)
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == b.shape

    # close to the exact linear layer: relative (Frobenius) error of a few quantization steps
    def rel(got, want):
        return float((got.double() - want).norm() / want.norm())

    exact_dx = g2.double() @ w.double()
    exact_dw = g2.double().t() @ x2.double()
    assert rel(y.reshape(-1, 24) - b, x2.double() @ w.double().t()) < 0.1
    assert rel(dx.reshape(-1, 40), exact_dx) < (0.1 if gf == "e4m3" else 0.2)
    assert rel(dw, exact_dw) < (0.1 if gf == "e4m3" else 0.2)


def test_rowwise_beats_tensorwise_on_rows_of_different_magnitudes(gen):
    x = _randn(gen, 64, 32, spread=True)
    w = _randn(gen, 16, 32)
    exact = x.double() @ w.double().t()
    errs = {}
    for scaling in f8.SCALINGS:
        y = f8.linear_forward(x, w, None, f8.Fp8Recipe(scaling))
        # per-row relative error: the small rows are where one tensor-wide scale loses digits
        errs[scaling] = float(((y.double() - exact).norm(dim=1) / exact.norm(dim=1)).max())
    assert errs["rowwise"] < 0.1 < errs["tensorwise"], errs


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_autograd_function(recipe, gen):
    x = _randn(gen, 5, 12, dtype=torch.bfloat16).requires_grad_()
    w = _randn(gen, 7, 12, dtype=torch.bfloat16).requires_grad_()
    b = _randn(gen, 7, dtype=torch.bfloat16).requires_grad_()
    y = f8.Fp8LinearReference.apply(x, w, b, recipe)
    assert y.dtype == torch.bfloat16
    gy = _randn(gen, 5, 7, dtype=torch.bfloat16)
    y.backward(gy)
    dx, dw, db = f8.linear_backward(gy, x.detach(), w.detach(), recipe)
    assert torch.equal(x.grad, dx) and torch.equal(w.grad, dw)
    assert torch.equal(b.grad, db.to(torch.bfloat16))
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == torch.bfloat16

    # only the weight's gradient asked for: the others are not computed
    w2 = w.detach().requires_grad_()
    f8.Fp8LinearReference.apply(x.detach(), w2, None, recipe).sum().backward()
    assert w2.grad is not None and w2.grad.shape == w.shape
    dx, dw, db = f8.linear_backward(gy, x.detach(), w.detach(), recipe, (False, True, False))
    assert dx is None and db is None and dw is not None


@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_linear_bf16_against_float64(recipe, gen):
    """bf16 operands: each result within a bf16 rounding of the float64 product of the
    quantized operands (a 1-d input: one token)."""
    rw = recipe.scaling == "rowwise"
    row, col = (1, 0) if rw else (None, None)
    x = _randn(gen, 6, 32, dtype=torch.bfloat16, spread=True)
    w = _randn(gen, 10, 32, dtype=torch.bfloat16)
    gy = _randn(gen, 6, 10, dtype=torch.bfloat16)

    def check(got, a64, b64):
        ref = a64 @ b64
        tol = 2.0**-8 * ref.abs() + 1e-5 * (a64.abs() @ b64.abs())
        assert got.dtype == torch.bfloat16 and bool(((got.double() - ref).abs() <= tol).all())

    check(f8.linear_forward(x, w, None, recipe), _deq64(x, "e4m3", row), _deq64(w, "e4m3", row).t())
    dx, dw, _ = f8.linear_backward(gy, x, w, recipe)
    gf = recipe.grad_format

    def operand64(t):  # the backward's x / weight: per column, or cast with the forward's scale
        if rw:
            return _deq64(t, "e4m3", col)
        scale = f8.quantize(t, "e4m3", None)[1]
        return f8.cast_with_scale(t, scale, "e4m3").double() * scale.double()

    check(dx, _deq64(gy, gf, row), operand64(w))
    check(dw, _deq64(gy, gf, col).t(), operand64(x))
    y1 = f8.linear_forward(x[2], w, None, recipe)
    assert y1.shape == (10,)
    if rw:  # one row: the same scale as that row of the batch
        assert torch.equal(y1, f8.linear_forward(x, w, None, recipe)[2])


def test_linear_empty_batch(gen):
    w = _randn(gen, 10, 32)
    for recipe in RECIPES:
        y = f8.linear_forward(torch.zeros(0, 32), w, None, recipe)
        dx, dw, db = f8.linear_backward(torch.zeros(0, 10), torch.zeros(0, 32), w, recipe)
        assert y.shape == (0, 10) and dx.shape == (0, 32)
        assert torch.equal(dw, torch.zeros(10, 32)) and torch.equal(db, torch.zeros(10))


def test_linear_argument_errors(gen):
    x, w, gy = _randn(gen, 33, 4), _randn(gen, 6, 4), _randn(gen, 33, 6)
    r = f8.Fp8Recipe()
    with pytest.raises(ValueError, match=r"linear_forward: argument 'x' must be a floating-point "
                       r"tensor \[..., 4\]"):
        f8.linear_forward(_randn(gen, 3, 8), w, None, r)
    with pytest.raises(TypeError, match=r"linear_forward: argument 'recipe' must be an Fp8Recipe"):
        f8.linear_forward(x, w, None, "rowwise")
    with pytest.raises(ValueError, match=r"linear_forward: argument 'bias' must be None or a"):
        f8.linear_forward(x, w, torch.ones(5), r)
    with pytest.raises(ValueError, match=r"linear_forward: argument 'weight' must be a 2-d"):
        f8.linear_forward(x, w[0], None, r)
    # a transposed gradient of the same size, or one with other leading dimensions
    with pytest.raises(ValueError, match=r"linear_backward: argument 'grad_output' must be a "
                       r"tensor of shape \[33, 6\]"):
        f8.linear_backward(gy.t(), x, w, r)
    with pytest.raises(ValueError, match=r"argument 'grad_output' .* got a torch.float32 tensor "
                       r"of shape \[3, 11, 6\]"):
        f8.linear_backward(gy.reshape(3, 11, 6), x, w, r)
