"""ops.scale_ (x *= factor in place, the factor a 0-dim device value) on the CPU backend: the
product formed in the factor's dtype and rounded once (bitwise against that formula, for every
dtype), a factor of 1 leaving x bitwise as it was (NaN, infinities and -0 included), argument
errors that name the argument and mutate nothing, opcheck, and the C++ declaration. The CUDA
kernel (vectorized, misaligned and tail paths, the skip at 1) is in tests/test_cuda_scale.py."""

from __future__ import annotations

import pytest
import torch

from cutlass_nn import ops

_ops = torch.ops.cutlass_nn

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def stat_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def expected(x, factor):
    """The product in the factor's dtype, rounded once to x's dtype."""
    return (x.to(factor.dtype) * factor).to(x.dtype)


@pytest.mark.parametrize("numel", [0, 1, 7, 1000])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_the_float_product_rounded_once(dtype, numel):
    gen = torch.Generator().manual_seed(numel + 3)
    x = (torch.randn(numel, generator=gen, dtype=torch.float64) * 10).to(dtype)
    # 1 / 3 is not exact in 16 bits: rounding it to x's dtype first would change results
    factor = torch.tensor(1.0 / 3.0, dtype=stat_dtype(dtype))
    want = expected(x, factor)
    ops.scale_(x, factor)
    assert torch.equal(x, want)


def test_rounding_the_factor_first_would_differ():
    """The test above can tell the two roundings apart: a 16-bit factor gives other bits."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1000, generator=gen).to(torch.bfloat16)
    factor = torch.tensor(1.0 / 3.0)
    assert not torch.equal(expected(x, factor), x * factor.to(torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_factor_one_leaves_x_bitwise_unchanged(dtype):
    x = torch.tensor([1.5, -0.0, 0.0, float("inf"), -float("inf"), float("nan"), 3e-5], dtype=dtype)
    before = x.clone()
    ops.scale_(x, torch.ones((), dtype=stat_dtype(dtype)))
    # bitwise, NaN and the sign of zero included
    int_view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    assert torch.equal(x.view(int_view), before.view(int_view))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_nan_and_inf_factors_follow_multiplication(dtype):
    x = torch.tensor([1.0, -2.0, 0.0], dtype=dtype)
    y = x.clone()
    ops.scale_(x, torch.tensor(float("nan")))
    assert torch.isnan(x).all()
    ops.scale_(y, torch.tensor(float("inf")))
    assert y[0] == float("inf") and y[1] == -float("inf") and torch.isnan(y[2])


def test_multidimensional_contiguous_x():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 4, 5, generator=gen)
    factor = torch.tensor(-2.5)
    want = x * -2.5
    ops.scale_(x, factor)
    assert torch.equal(x, want)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: (torch.ones(4, 4).t(), torch.tensor(2.0)), r"argument 'x' must be contiguous"),
        (lambda: (torch.ones(4, dtype=torch.int32), torch.tensor(2.0)), r"argument 'x' must have a floating dtype"),
        (lambda: (torch.ones(4), torch.tensor(2.0, dtype=torch.float64)),
         r"argument 'factor' must have dtype float32 \(the statistics dtype of 'x'\), got float64"),
        (lambda: (torch.ones(4, dtype=torch.bfloat16), torch.tensor(2.0, dtype=torch.bfloat16)),
         r"argument 'factor' must have dtype float32"),
        (lambda: (torch.ones(4, dtype=torch.float64), torch.tensor(2.0)),
         r"argument 'factor' must have dtype float64"),
        (lambda: (torch.ones(4), torch.tensor([2.0])), r"argument 'factor' must be a 0-D tensor"),
    ],
    ids=["strided", "int", "f64-factor", "bf16-factor", "f32-factor-f64-x", "1-D-factor"],
)
def test_bad_arguments_name_the_argument_and_mutate_nothing(make, match):
    x, factor = make()
    before = x.clone()
    with pytest.raises((RuntimeError, ValueError), match=r"cutlass_nn\.scale_: " + match):
        ops.scale_(x, factor)
    assert torch.equal(x, before)


def test_factor_inside_x_is_rejected():
    x = torch.arange(1.0, 5.0)
    before = x.clone()
    with pytest.raises(RuntimeError, match=r"argument 'factor' must not share memory with 'x'"):
        ops.scale_(x, x[1])
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_opcheck(dtype):
    x = torch.randn(6, 5).to(dtype)
    torch.library.opcheck(_ops.scale_.default, (x, torch.tensor(0.75, dtype=stat_dtype(dtype))))


def test_meta_tensors_check_like_the_kernels():
    x = torch.empty(4, 4, device="meta").t()
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.scale_: argument 'x' must be contiguous"):
        ops.scale_(x, torch.empty((), device="meta"))
    ops.scale_(torch.empty(4, device="meta"), torch.empty((), device="meta"))


@pytest.mark.parametrize(
    "x,factor",
    [
        (torch.ones(4), torch.tensor(2.0, dtype=torch.float64)),
        (torch.ones(4), torch.tensor([2.0])),
    ],
    ids=["dtype", "dim"],
)
def test_fake_messages_match_the_kernels(x, factor):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with pytest.raises(RuntimeError) as real:
        ops.scale_(x.clone(), factor)
    with FakeTensorMode() as mode, pytest.raises(RuntimeError) as fake:
        ops.scale_(mode.from_tensor(x), mode.from_tensor(factor))
    assert str(fake.value).split("cutlass_nn.scale_: ")[1].split("\n")[0] == \
        str(real.value).split("cutlass_nn.scale_: ")[1].split("\n")[0]
