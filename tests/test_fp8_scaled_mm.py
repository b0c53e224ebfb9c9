"""cutlass_nn.ops.fp8_scaled_mm on the CPU: the operator equals cutlass_nn.fp8_reference.scaled_mm
(bitwise: both are the float32 product of the dequantized operands) for every scale shape, format
pair and output dtype; its argument errors name the argument, and its fake implementation
(torch.compile) fails the same way and gives the same output metadata; opcheck passes."""

from __future__ import annotations

import pytest
import torch

import cutlass_nn
from torch._subclasses.fake_tensor import FakeTensorMode

from cutlass_nn import fp8_reference as R
from cutlass_nn import ops


def quantized(rows, cols, fmt, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * 3
    return R.quantize(x, fmt, dim=dim)


SCALES = {
    "tensorwise": (None, None),
    "rowwise": (1, 0),
    "a_rows": (1, None),
    "b_cols": (None, 0),
}


@pytest.mark.parametrize("scales", list(SCALES))
@pytest.mark.parametrize("fmts", [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e4m3", "e5m2")])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 7, 32), (1, 1, 1), (17, 33, 48)])
def test_equals_reference(scales, fmts, out_dtype, shape):
    m, n, k = shape
    dim_a, dim_b = SCALES[scales]
    a, sa = quantized(m, k, fmts[0], dim_a, 1)
    b, sb = quantized(k, n, fmts[1], dim_b, 2)
    bias = torch.randn(n).to(out_dtype)
    for with_bias in (None, bias):
        out = ops.fp8_scaled_mm(a, b, sa, sb, with_bias, out_dtype)
        ref = R.scaled_mm(a, sa, b, sb, out_dtype, with_bias)
        assert out.dtype == out_dtype and out.shape == (m, n)
        assert torch.equal(out, ref)


def test_one_element_scale_and_strided_operands():
    a, sa = quantized(6, 32, "e4m3", None, 3)
    b, sb = quantized(32, 10, "e4m3", None, 4)
    want = R.scaled_mm(a, sa, b, sb)
    # [1] scales, and b as a transposed view of a row-major [N, K] matrix
    out = ops.fp8_scaled_mm(a, b.t().contiguous().t(), sa.reshape(1), sb.reshape(1))
    assert torch.equal(out, want)


def test_result_close_to_unquantized_product():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 256, generator=gen), torch.randn(128, 256, generator=gen)
    a, sa = R.quantize(x, "e4m3", dim=1)
    b, sb = R.quantize(w, "e4m3", dim=1)
    out = ops.fp8_scaled_mm(a, b.t(), sa, sb.t(), out_dtype=torch.float32)
    exact = x @ w.t()
    # e4m3 keeps 3 mantissa bits: relative error per operand <= 2^-4; dot products average it
    assert (out - exact).norm() / exact.norm() < 0.06


def _base():
    a, sa = quantized(8, 32, "e4m3", None, 0)
    b, sb = quantized(32, 16, "e4m3", None, 1)
    return dict(a=a, b=b, a_scale=sa, b_scale=sb, bias=None, out_dtype=torch.bfloat16)


BAD = [
    ("a", dict(a=torch.zeros(8, 32)), "argument 'a' must be a 2-d float8_e4m3fn or float8_e5m2 "
     "tensor, got a float32 tensor of shape [8, 32]"),
    ("a_3d", dict(a=torch.zeros(2, 8, 32).to(torch.float8_e4m3fn)), "argument 'a' must be a 2-d"),
    ("b_rows", dict(b=torch.zeros(16, 32).to(torch.float8_e4m3fn)),
     "argument 'b' must have 32 rows (the columns of 'a'), got shape [16, 32]"),
    ("a_scale_shape", dict(a_scale=torch.ones(1, 8)),
     "argument 'a_scale' must be a float32 tensor of shape [] or [1] (one value) or [8, 1] (one "
     "per row), got a float32 tensor of shape [1, 8]"),
    ("b_scale_shape", dict(b_scale=torch.ones(16, 1)),
     "argument 'b_scale' must be a float32 tensor of shape [] or [1] (one value) or [1, 16] (one "
     "per column), got a float32 tensor of shape [16, 1]"),
    ("scale_dtype", dict(a_scale=torch.ones((), dtype=torch.float64)),
     "argument 'a_scale' must be a float32 tensor"),
    ("out_dtype", dict(out_dtype=torch.int32),
     "argument 'out_dtype' must be bfloat16, float16 or float32, got int32"),
    ("bias_dtype", dict(bias=torch.zeros(16)),
     "argument 'bias' must be a bfloat16 tensor of shape [16] (out_dtype, the columns of 'b'), "
     "got a float32 tensor of shape [16]"),
    ("bias_shape", dict(bias=torch.zeros(8, dtype=torch.bfloat16)), "argument 'bias' must be"),
]


@pytest.mark.parametrize("name, change, message", BAD, ids=[b[0] for b in BAD])
def test_errors(name, change, message):
    kwargs = {**_base(), **change}
    before = {k: v.clone() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(RuntimeError) as err:
        ops.fp8_scaled_mm(**kwargs)
    assert f"cutlass_nn.fp8_scaled_mm: {message}" in str(err.value)
    for k, v in before.items():
        assert torch.equal(kwargs[k].view(torch.uint8) if v.dtype.itemsize == 1 else kwargs[k],
                           v.view(torch.uint8) if v.dtype.itemsize == 1 else v), k
    # The fake implementation (torch.compile's tracing) fails with the same message.
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for k, v in kwargs.items()}
        with pytest.raises(Exception) as fake_err:
            ops.fp8_scaled_mm(**fake)
    assert message in str(fake_err.value)


def test_fake_output_metadata():
    kwargs = _base()
    kwargs["bias"] = torch.zeros(16, dtype=torch.float32)
    kwargs["out_dtype"] = torch.float32
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for k, v in kwargs.items()}
        out = ops.fp8_scaled_mm(**fake)
    assert out.shape == (8, 16) and out.dtype == torch.float32


# opcheck's test_schema compares its inputs before and after the call with arithmetic that torch
# does not implement for float8 dtypes on the CPU; the other checks run.
OPCHECK_UTILS = ("test_faketensor", "test_aot_dispatch_dynamic", "test_autograd_registration")


def test_opcheck():
    kwargs = _base()
    args = (kwargs["a"], kwargs["b"], kwargs["a_scale"], kwargs["b_scale"], None, torch.bfloat16,
            False)
    torch.library.opcheck(torch.ops.cutlass_nn.fp8_scaled_mm.default, args,
                          test_utils=OPCHECK_UTILS)
    bias = torch.randn(16).to(torch.bfloat16)
    args = (kwargs["a"], kwargs["b"], kwargs["a_scale"], kwargs["b_scale"], bias, torch.bfloat16,
            True)
    torch.library.opcheck(torch.ops.cutlass_nn.fp8_scaled_mm.default, args,
                          test_utils=OPCHECK_UTILS)


def test_compile_fullgraph():
    kwargs = _base()

    def f(a, b, sa, sb):
        return ops.fp8_scaled_mm(a, b, sa, sb).float().sum(dim=1)

    want = f(kwargs["a"], kwargs["b"], kwargs["a_scale"], kwargs["b_scale"])
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(
        kwargs["a"], kwargs["b"], kwargs["a_scale"], kwargs["b_scale"]
    )
    assert torch.equal(got, want)


def test_configs_hooks_on_cpu_flavor_or_cuda():
    names = ops.fp8_configs()
    assert isinstance(names, list)
    with ops.force_fp8_config(0):
        pass
    with pytest.raises(RuntimeError, match="_set_fp8_config: argument 'config'"):
        torch.ops.cutlass_nn._set_fp8_config.default(-2)
    with pytest.raises(RuntimeError, match="_set_fp8_swizzle: argument 'swizzle' must be 0 .* got 3"):
        torch.ops.cutlass_nn._set_fp8_swizzle.default(3)
    # a refused configuration leaves the swizzle as it was
    with pytest.raises(RuntimeError, match="_set_fp8_config"):
        with ops.force_fp8_config(-5, swizzle=4):
            pass
    assert torch.ops.cutlass_nn._set_fp8_swizzle.default(0) == 0
    with ops.force_fp8_config(-1, swizzle=2):
        # the CUDA flavor keeps the setting (the CPU flavor has no FP8 kernels to set it for)
        expected = 2 if cutlass_nn.has_cuda_kernels() else 0
        assert torch.ops.cutlass_nn._set_fp8_swizzle.default(2) == expected
    assert torch.ops.cutlass_nn._set_fp8_swizzle.default(0) == 0


# ---------------------------------------------------------------------------------------------
# fp8_quantize
# ---------------------------------------------------------------------------------------------

AXES = {"tensor": None, "row": 1, "column": 0}


def bits(t):
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t


@pytest.mark.parametrize("axis", list(AXES))
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 33), (1, 1), (64, 16), (0, 5), (5, 0)])
@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_equals_reference(axis, fmt, dtype, shape, transpose):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-20, 20, shape, generator=gen).float())).to(dtype)
    data, scale = ops.fp8_quantize(x, fmt, axis, transpose)
    want_data, want_scale = R.quantize_unchecked(x, fmt, AXES[axis])
    if transpose:
        want_data = want_data.t()
        want_scale = want_scale.t() if want_scale.dim() == 2 else want_scale
        assert data.is_contiguous()
    assert data.dtype == want_data.dtype and data.shape == want_data.shape
    assert scale.shape == want_scale.shape and scale.dtype == torch.float32
    assert torch.equal(bits(data), bits(want_data.contiguous()))
    assert torch.equal(scale, want_scale)


def test_quantize_nonfinite_slices():
    x = torch.randn(4, 8)
    x[1, 2] = float("inf")
    x[3, 0] = float("nan")
    data, scale = ops.fp8_quantize(x, "e4m3", "row")
    assert torch.isfinite(scale[[0, 2]]).all() and not torch.isfinite(scale[[1, 3]]).any()
    assert torch.isnan(data[1].float()).any() and torch.isnan(data[3].float()).any()
    assert not torch.isnan(data[[0, 2]].float()).any()


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.zeros(2, 3, 4), "e4m3", "row", False), "argument 'x' must be a 2-d float16"),
        ((torch.zeros(2, 3, dtype=torch.float64), "e4m3", "row", False), "argument 'x' must be a 2-d float16, bfloat16 or float32 tensor, got a float64 tensor of shape [2, 3]"),
        ((torch.zeros(2, 3), "e3m4", "row", False), 'argument \'format\' must be "e4m3" or "e5m2", got "e3m4"'),
        ((torch.zeros(2, 3), "e4m3", "block", False), 'argument \'axis\' must be "tensor", "row" or "column", got "block"'),
    ],
)
def test_quantize_errors(args, message):
    with pytest.raises(RuntimeError) as err:
        ops.fp8_quantize(*args)
    assert f"cutlass_nn.fp8_quantize: {message}" in str(err.value)
    with FakeTensorMode() as mode:
        fake = (mode.from_tensor(args[0]),) + args[1:]
        with pytest.raises(Exception) as fake_err:
            ops.fp8_quantize(*fake)
    assert message in str(fake_err.value)


@pytest.mark.parametrize("axis", list(AXES))
@pytest.mark.parametrize("transpose", [False, True])
def test_quantize_fake_and_opcheck(axis, transpose):
    x = torch.randn(6, 10, dtype=torch.bfloat16)
    with FakeTensorMode() as mode:
        d, s = ops.fp8_quantize(mode.from_tensor(x), "e5m2", axis, transpose)
    rd, rs = ops.fp8_quantize(x, "e5m2", axis, transpose)
    assert d.shape == rd.shape and d.dtype == rd.dtype and s.shape == rs.shape
    torch.library.opcheck(torch.ops.cutlass_nn.fp8_quantize.default, (x, "e5m2", axis, transpose),
                          test_utils=OPCHECK_UTILS)


# ---------------------------------------------------------------------------------------------
# fp8_quantize_both
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", list(AXES))
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 33), (1, 1), (64, 16), (0, 5), (5, 0)])
def test_quantize_both_equals_the_two_layouts(axis, fmt, dtype, shape):
    gen = torch.Generator().manual_seed(3 * sum(shape) + 1)
    x = (torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-20, 20, shape, generator=gen).float())).to(dtype)
    data, data_t, scale = ops.fp8_quantize_both(x, fmt, axis)
    want, want_scale = ops.fp8_quantize(x, fmt, axis, False)
    want_t, _ = ops.fp8_quantize(x, fmt, axis, True)
    assert data.shape == want.shape and data_t.shape == want_t.shape and data_t.is_contiguous()
    assert torch.equal(bits(data), bits(want)) and torch.equal(bits(data_t), bits(want_t))
    assert scale.shape == want_scale.shape and torch.equal(scale, want_scale)


def test_quantize_both_errors_and_opcheck():
    with pytest.raises(RuntimeError, match=r"cutlass_nn.fp8_quantize_both: argument 'axis' must be "
                                           r"\"tensor\", \"row\" or \"column\", got \"block\""):
        ops.fp8_quantize_both(torch.zeros(2, 3), "e4m3", "block")
    with pytest.raises(RuntimeError, match="cutlass_nn.fp8_quantize_both: argument 'x' must be a 2-d"):
        ops.fp8_quantize_both(torch.zeros(3), "e4m3", "tensor")
    x = torch.randn(6, 10, dtype=torch.bfloat16)
    for axis in AXES:
        with FakeTensorMode() as mode:
            d, dt, s = ops.fp8_quantize_both(mode.from_tensor(x), "e5m2", axis)
        rd, rdt, rs = ops.fp8_quantize_both(x, "e5m2", axis)
        assert (d.shape, dt.shape, s.shape) == (rd.shape, rdt.shape, rs.shape)
        assert d.dtype == rd.dtype == dt.dtype
        torch.library.opcheck(torch.ops.cutlass_nn.fp8_quantize_both.default, (x, "e5m2", axis),
                              test_utils=OPCHECK_UTILS)



# ---------------------------------------------------------------------------------------------
# fp8_cast
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", list(AXES))
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 33), (1, 1), (64, 16), (0, 5)])
@pytest.mark.parametrize("transpose", [False, True])
def test_cast_equals_reference(axis, fmt, dtype, shape, transpose):
    gen = torch.Generator().manual_seed(5 * sum(shape) + 2)
    x = (torch.randn(*shape, generator=gen) * torch.exp2(torch.randint(-20, 20, shape, generator=gen).float())).to(dtype)
    _, scale = ops.fp8_quantize(x, fmt, axis)
    data = ops.fp8_cast(x, scale, fmt, transpose)
    want = R.cast_with_scale(x, scale, fmt)
    if transpose:
        want = want.t()
        assert data.is_contiguous()
    assert data.shape == want.shape and torch.equal(bits(data), bits(want.contiguous()))
    # the forward's scale gives the forward's data but where 1 / (1 / q) != q moves a boundary
    # product: at most one FP8 step apart, rarely
    quantized = ops.fp8_quantize(x, fmt, axis, transpose)[0]
    if x.numel():
        steps = (bits(data).int() - bits(quantized).int()).abs()
        assert steps.max() <= 1 and steps.float().mean() < 0.05


def test_cast_errors_fake_and_opcheck():
    x = torch.randn(6, 10)
    with pytest.raises(RuntimeError, match=r"cutlass_nn.fp8_cast: argument 'scale' must be a float32 "
                                           r"tensor of shape \[\] or \[1\] \(one value\), \[6, 1\] "
                                           r"\(per row\) or \[1, 10\] \(per column\), got a float32 "
                                           r"tensor of shape \[6\]"):
        ops.fp8_cast(x, torch.ones(6), "e4m3")
    with pytest.raises(RuntimeError, match="cutlass_nn.fp8_cast: argument 'format'"):
        ops.fp8_cast(x, torch.ones(()), "e3m4")
    for scale in (torch.ones(()), torch.ones(1), torch.ones(6, 1), torch.ones(1, 10)):
        for transpose in (False, True):
            with FakeTensorMode() as mode:
                d = ops.fp8_cast(mode.from_tensor(x), mode.from_tensor(scale), "e4m3", transpose)
            assert d.shape == ops.fp8_cast(x, scale, "e4m3", transpose).shape
            torch.library.opcheck(torch.ops.cutlass_nn.fp8_cast.default, (x, scale, "e4m3", transpose),
                                  test_utils=OPCHECK_UTILS)


def test_fp8_cast_fake_checks_the_scale_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
        with pytest.raises(RuntimeError, match="argument 'scale' must be on meta"):
            torch.ops.cutlass_nn.fp8_cast(x, torch.ones((), device="cpu"), "e4m3", False)
