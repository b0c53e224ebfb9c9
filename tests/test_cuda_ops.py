"""The torch.ops.cutlass_nn operators on a CUDA GPU: accuracy against a float64 reference (relative
to PyTorch's own accuracy), for every dtype / TF32 mode, both kernel paths (default = SM90 on
Hopper, and forced SM80), aligned and misaligned shapes and layouts, with poisoned outputs;
degenerate sizes, gradcheck, hypothesis shapes, argument errors and kernel dispatch."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cutlass_nn
from cuda_helpers import (
    CUDA_MARKS,
    DTYPE_FLOOR,
    DTYPE_IDS,
    DTYPES,
    FLOOR_16BIT_INTO_F32,
    GEMM_OPS,
    LAYOUTS,
    NAN,
    PATHS,
    PRECISION_IDS,
    PRECISIONS,
    assert_finite,
    assert_unchanged,
    check_close,
    clone_all,
    gemm_args,
    gemm_out_shape,
    kernel_path,
    make_matrix,
    make_vector,
    matmul_precision,
    poison_allocator,
    run_ours,
    run_torch,
    to64,
)

pytestmark = CUDA_MARKS

ops = cutlass_nn.ops


@pytest.fixture
def prec(request):
    """A Precision (indirect parameter); its TF32 setting holds for the whole test."""
    with matmul_precision(request.param.tf32):
        yield request.param


@pytest.fixture
def path(request):
    """A kernel path (indirect parameter), active for the whole test."""
    with kernel_path(request.param):
        yield request.param


def _prec_params(**kw):
    return pytest.mark.parametrize("prec", PRECISIONS, ids=PRECISION_IDS, indirect=True, **kw)


def _path_params():
    return pytest.mark.parametrize("path", PATHS, indirect=True)


# (M, N, K): aligned to 128 / to 8 or 16, then misaligned (odd K or N, M of 1 or 7).
GEMM_SHAPES = {
    "a128": (256, 128, 384),
    "a8": (24, 40, 72),
    "m7_a16": (7, 64, 128),
    "odd": (33, 257, 65),
    "m1_k4097": (1, 33, 4097),
    "n1_k257": (130, 1, 257),
    "n_odd": (64, 9, 16),
}


# ---------------------------------------------------------------------------------------------
# GEMM operators: accuracy, poisoned outputs, inputs untouched
# ---------------------------------------------------------------------------------------------


@_prec_params()
@_path_params()
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", GEMM_SHAPES.values(), ids=GEMM_SHAPES.keys())
@pytest.mark.parametrize("op", GEMM_OPS)
def test_gemm_op_accuracy(op, shape, layout, path, prec, gen):
    m, n, k = shape
    args = gemm_args(op, m, n, k, prec.dtype, layout, gen)
    before = clone_all(args)
    out_shape = gemm_out_shape(op, m, n, k)
    poison_allocator(out_shape[0] * out_shape[1], prec.dtype)
    ours = run_ours(op, args)
    context = f"{op} {shape} {layout} path={path} {prec.name}"
    assert_finite(ours, context)
    assert ours.shape == out_shape
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), prec.floor, context)
    assert_unchanged(args, before, context)


@_prec_params()
@_path_params()
@pytest.mark.parametrize("op", ["linear", "linear_dgrad", "linear_wgrad"])
@pytest.mark.parametrize("noncontig", [False, True], ids=["contig", "permuted"])
def test_linear_ops_nd(op, noncontig, path, prec, gen):
    """3-D [B, S, *] operands (flattened over the leading dims), contiguous or permuted views."""
    b, s, n, k = 3, 5, 24, 40
    dtype = prec.dtype

    def nd(last):
        if noncontig:
            return make_matrix(b * last, s, dtype, "contig", gen).view(b, last, s).transpose(1, 2)
        return make_matrix(b * s, last, dtype, "contig", gen).view(b, s, last)

    w = make_matrix(n, k, dtype, "contig", gen)
    if op == "linear":
        args = (nd(k), w, make_vector(n, dtype, "contig", gen))
    elif op == "linear_dgrad":
        args = (nd(n), w)
    else:
        args = (nd(n), nd(k))
    ours = run_ours(op, args)
    context = f"{op} 3-D {'permuted' if noncontig else 'contig'} path={path} {prec.name}"
    check_close(ours, run_torch(op, args), run_torch(op, to64(args)), prec.floor, context)


# ---------------------------------------------------------------------------------------------
# mm.out: NaN-prefilled outputs, strided and wrong-shape outputs
# ---------------------------------------------------------------------------------------------

MM_OUT_SHAPES = {"a128": (128, 256, 128), "odd": (33, 257, 65), "m1": (1, 40, 7)}


@_prec_params()
@_path_params()
@pytest.mark.parametrize("in_layout", ["contig", "transposed", "offset"])
@pytest.mark.parametrize("out_kind", ["contig", "colslice", "transposed", "wrong_shape"])
@pytest.mark.parametrize("shape", MM_OUT_SHAPES.values(), ids=MM_OUT_SHAPES.keys())
def test_mm_out(shape, out_kind, in_layout, path, prec, gen):
    m, n, k = shape
    dtype = prec.dtype
    a = make_matrix(m, k, dtype, in_layout, gen)
    b = make_matrix(k, n, dtype, in_layout, gen)
    if out_kind == "contig":
        buf = torch.full((m, n), NAN, dtype=dtype, device="cuda")
        out = buf
    elif out_kind == "colslice":
        buf = torch.full((m, n + 5), NAN, dtype=dtype, device="cuda")
        out = buf[:, :n]
    elif out_kind == "transposed":
        buf = torch.full((n, m), NAN, dtype=dtype, device="cuda")
        out = buf.t()
    else:
        buf = torch.empty(0, dtype=dtype, device="cuda")
        out = buf
    result = cutlass_nn.mm(a, b, out=out)
    assert result is out
    context = f"mm.out {shape} out={out_kind} in={in_layout} path={path} {prec.name}"
    assert_finite(out, context)
    check_close(out, torch.mm(a, b), torch.mm(a.double(), b.double()), prec.floor, context)
    if out_kind == "colslice":
        assert torch.isnan(buf[:, n:]).all(), f"[{context}] wrote past the output slice"


# ---------------------------------------------------------------------------------------------
# linear_wgrad_accumulate_
# ---------------------------------------------------------------------------------------------

ACC_SHAPES = {"a128": (256, 128, 256), "odd": (33, 65, 257), "batch1": (1, 24, 40)}


@_prec_params()
@_path_params()
@pytest.mark.parametrize("gw_dtype", ["same", "f32"])
@pytest.mark.parametrize("gw_layout", ["contig", "colslice", "transposed"])
@pytest.mark.parametrize("shape", ACC_SHAPES.values(), ids=ACC_SHAPES.keys())
def test_wgrad_accumulate(shape, gw_layout, gw_dtype, path, prec, gen):
    """grad_weight += grad_output^T @ input, in place, into a same-dtype or float32 grad_weight
    (contiguous, a column slice whose NaN padding must survive, or a transposed view)."""
    if gw_dtype == "f32" and prec.dtype in (torch.float32, torch.float64):
        pytest.skip("a float32 grad_weight is for 16-bit inputs")
    m, n, k = shape
    dtype = prec.dtype
    acc_dtype = dtype if gw_dtype == "same" else torch.float32
    dy = make_matrix(m, n, dtype, "contig", gen)
    x = make_matrix(m, k, dtype, "contig", gen)
    if gw_layout == "colslice":
        buf = torch.full((n, k + 3), NAN, dtype=acc_dtype, device="cuda")
        gw = buf[:, :k]
        gw.copy_(make_matrix(n, k, acc_dtype, "contig", gen))
    else:
        gw = make_matrix(n, k, acc_dtype, gw_layout, gen)
    start = gw.clone()
    ops.linear_wgrad_accumulate_(gw, dy, x)
    context = f"wgrad_accumulate_ {shape} gw={gw_layout}/{acc_dtype} path={path} {prec.name}"
    ref64 = start.double() + dy.double().t() @ x.double()
    if acc_dtype == dtype:
        torch_same = start + torch.mm(dy.t(), x)
        floor = prec.floor
    else:
        torch_same = start + torch.mm(dy.t().float(), x.float())
        floor = FLOOR_16BIT_INTO_F32
    check_close(gw, torch_same, ref64, floor, context)
    if gw_layout == "colslice":
        assert torch.isnan(buf[:, k:]).all(), f"[{context}] wrote past grad_weight"


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@_path_params()
def test_wgrad_accumulate_nd_repeated(in_dtype, path, gen):
    """Several micro-batches of 3-D inputs accumulated into one fp32 main gradient."""
    n, k = 40, 24
    gw = torch.zeros(n, k, dtype=torch.float32, device="cuda")
    ref64 = torch.zeros(n, k, dtype=torch.float64, device="cuda")
    torch_same = torch.zeros(n, k, dtype=torch.float32, device="cuda")
    with matmul_precision(False):
        for _ in range(4):
            dy = make_matrix(2 * 7, n, in_dtype, "contig", gen).view(2, 7, n)
            x = make_matrix(2 * 7, k, in_dtype, "contig", gen).view(2, 7, k)
            ops.linear_wgrad_accumulate_(gw, dy, x)
            ref64 += run_torch("linear_wgrad", to64((dy, x)))
            torch_same += run_torch("linear_wgrad", (dy.float(), x.float()))
        check_close(gw, torch_same, ref64, FLOOR_16BIT_INTO_F32, f"accumulate x4 path={path}")


# ---------------------------------------------------------------------------------------------
# bias_grad
# ---------------------------------------------------------------------------------------------

BIAS_GRAD_SHAPES = {
    "1x1": (1, 1),
    "7x33": (7, 33),
    "1000x257": (1000, 257),
    "4096x64": (4096, 64),
    "3x5x17": (3, 5, 17),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", BIAS_GRAD_SHAPES.values(), ids=BIAS_GRAD_SHAPES.keys())
def test_bias_grad(shape, layout, dtype, gen):
    rows, cols = shape[0] * (shape[1] if len(shape) == 3 else 1), shape[-1]
    dy = make_matrix(rows, cols, dtype, layout, gen).reshape(shape)
    before = dy.clone()
    poison_allocator(cols, dtype)
    ours = ops.bias_grad(dy)
    context = f"bias_grad {shape} {layout}"
    assert_finite(ours, context)
    dims = tuple(range(dy.dim() - 1))
    check_close(ours, dy.sum(dims), dy.double().sum(dims), DTYPE_FLOOR[dtype], context)
    assert_unchanged((dy,), (before,), context)


# ---------------------------------------------------------------------------------------------
# add2
# ---------------------------------------------------------------------------------------------

# 5000011: more elements than the scalar kernel's grid has threads (2048 per SM), so on the
# misaligned layouts its threads run several grid-stride steps, not all the same number; on the
# aligned ones, a vector-kernel grid of thousands of blocks with a ragged last block and a tail.
ADD2_SHAPES = {
    "0": (0,),
    "1": (1,),
    "7": (7,),
    "1000003": (1000003,),
    "5000011": (5000011,),
    "33x65": (33, 65),
}
ADD2_LAYOUTS = ["contig", "offset_a", "offset_both", "strided"]


def _add2_operand(shape, dtype, layout, gen):
    numel = 1
    for s in shape:
        numel *= s
    if layout == "offset":
        return make_vector(numel, dtype, "offset", gen).view(shape)
    if layout == "strided":
        if len(shape) == 2:
            return make_matrix(shape[0], shape[1], dtype, "transposed", gen)
        return make_vector(numel, dtype, "colslice", gen)
    return make_vector(numel, dtype, "contig", gen).view(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", ADD2_LAYOUTS)
@pytest.mark.parametrize("shape", ADD2_SHAPES.values(), ids=ADD2_SHAPES.keys())
def test_add2(shape, layout, dtype, gen):
    a_layout = {"offset_a": "offset", "offset_both": "offset"}.get(layout, layout)
    b_layout = {"offset_a": "contig", "offset_both": "offset"}.get(layout, layout)
    a = _add2_operand(shape, dtype, a_layout, gen)
    b = _add2_operand(shape, dtype, b_layout, gen)
    before = clone_all((a, b))
    poison_allocator(a.numel(), dtype)
    ours = ops.add2(a, b)
    context = f"add2 {shape} {layout}"
    assert_finite(ours, context)
    check_close(ours, a + b, a.double() + b.double(), DTYPE_FLOOR[dtype], context)
    assert_unchanged((a, b), before, context)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(7,), (33, 65), (2, 0, 3)], ids=["7", "33x65", "empty"])
def test_add2_backward(shape, dtype, gen):
    a = torch.randn(shape, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    b = torch.randn(shape, device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    g = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    cutlass_nn.Add2()(a, b).backward(g)
    assert torch.equal(a.grad, g) and torch.equal(b.grad, g)


# ---------------------------------------------------------------------------------------------
# Degenerate sizes: M, N or K of 0 or 1
# ---------------------------------------------------------------------------------------------

DEGENERATE = [
    pytest.param(op, (m, n, k), id=f"{op}-M{m}N{n}K{k}")
    for op in GEMM_OPS
    for m, n, k in itertools.product([0, 1, 5], repeat=3)
    if 0 in (m, n, k) or 1 in (m, n, k)
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("op,shape", DEGENERATE)
def test_gemm_degenerate_sizes(op, shape, dtype, gen):
    """K = 0 gives the bias (or zeros); M or N = 0 an empty result; sizes of 1 are plain GEMMs."""
    m, n, k = shape
    args = gemm_args(op, m, n, k, dtype, "contig", gen)
    out_shape = gemm_out_shape(op, m, n, k)
    poison_allocator(out_shape[0] * out_shape[1], dtype)
    with matmul_precision(False):
        ours = run_ours(op, args)
        context = f"{op} M={m} N={n} K={k}"
        assert ours.shape == out_shape, context
        assert_finite(ours, context)
        check_close(ours, run_torch(op, args), run_torch(op, to64(args)), 2e-3, context)


@pytest.mark.parametrize("n", [0, 1, 5])
@pytest.mark.parametrize("lead", [(0,), (1,), (2, 0)], ids=["M0", "M1", "2x0"])
def test_bias_grad_degenerate(lead, n, gen):
    dy = torch.randn((*lead, n), device="cuda", generator=gen)
    poison_allocator(n, dy.dtype)
    ours = ops.bias_grad(dy)
    dims = tuple(range(dy.dim() - 1))
    check_close(ours, dy.sum(dims), dy.double().sum(dims), 1e-6, f"bias_grad {tuple(dy.shape)}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)], ids=["0", "2x0", "0x3"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_cutlass_linear_empty_batch(lead, bias, dtype, gen):
    layer = cutlass_nn.CutlassLinear(24, 40, bias=bias, device="cuda", dtype=dtype)
    x = torch.randn((*lead, 24), device="cuda", dtype=dtype, generator=gen, requires_grad=True)
    y = layer(x)
    assert y.shape == (*lead, 40)
    poison_allocator(40 * 24, dtype)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert_finite(layer.weight.grad, "empty-batch weight grad")
    assert torch.count_nonzero(layer.weight.grad) == 0
    if bias:
        assert_finite(layer.bias.grad, "empty-batch bias grad")
        assert torch.count_nonzero(layer.bias.grad) == 0


# ---------------------------------------------------------------------------------------------
# Autograd through the modules: gradients match torch's nn.Linear
# ---------------------------------------------------------------------------------------------


@_prec_params()
@_path_params()
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("input_grad", [True, False], ids=["xgrad", "no_xgrad"])
@pytest.mark.parametrize("shape", [(2, 64, 128, 256), (1, 7, 33, 65)], ids=["aligned", "odd"])
def test_cutlass_linear_backward(shape, input_grad, bias, path, prec, gen):
    b, s, k, n = shape
    dtype = prec.dtype
    layer = cutlass_nn.CutlassLinear(k, n, bias=bias, device="cuda", dtype=dtype)
    x = torch.randn(b, s, k, device="cuda", dtype=dtype, generator=gen, requires_grad=input_grad)
    gy = torch.randn(b, s, n, device="cuda", dtype=dtype, generator=gen)

    def grads(weight, bias_, x_):
        x_ = x_.detach().requires_grad_(input_grad)
        weight = weight.detach().requires_grad_()
        bias_ = None if bias_ is None else bias_.detach().requires_grad_()
        y = F.linear(x_, weight, bias_)
        y.backward(gy.to(y.dtype))
        return [y, weight.grad] + ([x_.grad] if input_grad else []) + ([bias_.grad] if bias else [])

    y = layer(x)
    y.backward(gy)
    ours = [y, layer.weight.grad] + ([x.grad] if input_grad else []) + (
        [layer.bias.grad] if bias else []
    )
    same = grads(layer.weight, layer.bias, x)
    bias64 = None if layer.bias is None else layer.bias.double()
    ref = grads(layer.weight.double(), bias64, x.double())
    names = ["output", "weight.grad", "input.grad", "bias.grad"]
    if not input_grad:
        names.remove("input.grad")
    for name, o, t, r in zip(names, ours, same, ref):
        check_close(o, t, r, prec.floor, f"CutlassLinear {name} {shape} path={path} {prec.name}")


# ---------------------------------------------------------------------------------------------
# gradcheck (float64)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("lead", [(4,), (2, 3)], ids=["2d", "3d"])
def test_gradcheck_cutlass_linear(lead, bias, gen):
    layer = cutlass_nn.CutlassLinear(5, 3, bias=bias, device="cuda", dtype=torch.float64)
    x = torch.randn((*lead, 5), device="cuda", dtype=torch.float64, generator=gen)
    x.requires_grad_()
    params = {name: p.detach().clone().requires_grad_() for name, p in layer.named_parameters()}
    names = list(params)

    def fn(x_, *ps):
        return torch.func.functional_call(layer, dict(zip(names, ps)), (x_,))

    inputs = (x, *params.values())
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def test_gradcheck_add2(gen):
    a = torch.randn(3, 4, device="cuda", dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(4, 3, device="cuda", dtype=torch.float64, generator=gen).t().requires_grad_()
    assert torch.autograd.gradcheck(cutlass_nn.Add2(), (a, b))


@pytest.mark.parametrize("transposed", [False, True], ids=["contig", "transposed"])
def test_gradcheck_mm(transposed, gen):
    def make(r, c):
        layout = "transposed" if transposed else "contig"
        return make_matrix(r, c, torch.float64, layout, gen).requires_grad_()

    assert torch.autograd.gradcheck(cutlass_nn.mm, (make(3, 4), make(4, 5)))


# ---------------------------------------------------------------------------------------------
# Hypothesis shapes
# ---------------------------------------------------------------------------------------------

_HYP_FLOOR = {torch.float16: 2e-3, torch.bfloat16: 2e-3, torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    m=st.integers(0, 300),
    n=st.integers(0, 300),
    k=st.integers(0, 300),
    bias=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_linear_hypothesis(dtype, m, n, k, bias, seed):
    """Forward and all gradients of linear vs torch, sizes 0..300 (odd ones included)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    w = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype) if bias else None
    gy = torch.randn(m, n, device="cuda", generator=gen).to(dtype)

    def fwd_bwd(fn, cast):
        leaves = [t if t is None else cast(t).requires_grad_() for t in (x, w, b)]
        y = fn(*leaves)
        y.backward(cast(gy))
        return [y] + [t.grad for t in leaves if t is not None]

    with matmul_precision(False):
        ours = fwd_bwd(cutlass_nn.linear, lambda t: t.detach().clone())
        same = fwd_bwd(F.linear, lambda t: t.detach().clone())
        ref = fwd_bwd(F.linear, lambda t: t.detach().double())
        for i, (o, t, r) in enumerate(zip(ours, same, ref)):
            check_close(o, t, r, _HYP_FLOOR[dtype], f"linear M={m} N={n} K={k} bias={bias} #{i}")


# ---------------------------------------------------------------------------------------------
# Argument errors
# ---------------------------------------------------------------------------------------------


def _cuda(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda", dtype=dtype)


BAD_CALLS = {
    "linear_weight_cpu": (
        lambda: ops.linear(_cuda(4, 8), torch.randn(3, 8)),
        RuntimeError,
        [r"cutlass_nn\.linear", "argument 'weight'", "device"],
    ),
    "linear_input_cpu": (
        lambda: ops.linear(torch.randn(4, 8), _cuda(3, 8)),
        RuntimeError,
        [r"cutlass_nn\.linear", "argument 'weight'", "device"],
    ),
    "linear_bias_cpu": (
        lambda: ops.linear(_cuda(4, 8), _cuda(3, 8), torch.randn(3)),
        RuntimeError,
        [r"cutlass_nn\.linear", "argument 'bias'", "device"],
    ),
    "linear_dtype_mix": (
        lambda: ops.linear(_cuda(4, 8, dtype=torch.bfloat16), _cuda(3, 8)),
        RuntimeError,
        [r"cutlass_nn\.linear", "argument 'weight'", "dtype", "bfloat16", "float32"],
    ),
    "linear_shape": (
        lambda: ops.linear(_cuda(4, 8), _cuda(3, 9)),
        RuntimeError,
        [r"cutlass_nn\.linear", "argument 'input'", "in_features"],
    ),
    "linear_int_dtype": (
        lambda: ops.linear(torch.ones(4, 8, device="cuda", dtype=torch.int32), _cuda(3, 8)),
        RuntimeError,
        [r"cutlass_nn\.linear", "argument 'input'", "floating dtype", "int32"],
    ),
    "dgrad_shape": (
        lambda: ops.linear_dgrad(_cuda(4, 5), _cuda(3, 8)),
        RuntimeError,
        [r"cutlass_nn\.linear_dgrad", "argument 'grad_output'", "out_features"],
    ),
    "wgrad_batch_mismatch": (
        lambda: ops.linear_wgrad(_cuda(4, 3), _cuda(5, 8)),
        RuntimeError,
        [r"cutlass_nn\.linear_wgrad", "leading"],
    ),
    "accumulate_gw_cpu": (
        lambda: ops.linear_wgrad_accumulate_(torch.zeros(3, 8), _cuda(4, 3), _cuda(4, 8)),
        RuntimeError,
        [r"cutlass_nn\.linear_wgrad_accumulate_", "argument 'grad_weight'", "device"],
    ),
    "accumulate_gw_dtype": (
        lambda: ops.linear_wgrad_accumulate_(
            _cuda(3, 8, dtype=torch.float16), _cuda(4, 3, dtype=torch.bfloat16),
            _cuda(4, 8, dtype=torch.bfloat16),
        ),
        RuntimeError,
        [r"cutlass_nn\.linear_wgrad_accumulate_", "argument 'grad_weight'", "dtype"],
    ),
    "mm_device_mix": (
        lambda: ops.mm(_cuda(4, 8), torch.randn(8, 3)),
        RuntimeError,
        [r"cutlass_nn\.mm", "argument 'b'", "device"],
    ),
    "mm_shape": (
        lambda: ops.mm(_cuda(4, 8), _cuda(7, 3)),
        RuntimeError,
        [r"cutlass_nn\.mm", "argument 'b'"],
    ),
    "mm_out_dtype": (
        lambda: ops.mm_out(_cuda(4, 8), _cuda(8, 3), _cuda(4, 3, dtype=torch.float64)),
        RuntimeError,
        [r"cutlass_nn\.mm\.out", "argument 'out'", "dtype"],
    ),
    "add2_shape": (
        lambda: ops.add2(_cuda(4, 8), _cuda(8, 4)),
        RuntimeError,
        [r"cutlass_nn\.add2", "argument 'b'", "shape"],
    ),
    "add2_device_mix": (
        lambda: ops.add2(_cuda(4, 8), torch.randn(4, 8)),
        RuntimeError,
        [r"cutlass_nn\.add2", "argument 'b'", "device"],
    ),
}


@pytest.mark.parametrize("call,exc,patterns", BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_bad_arguments(call, exc, patterns):
    with pytest.raises(exc) as info:
        call()
    for pattern in patterns:
        assert info.match(pattern)
    torch.cuda.synchronize()  # no asynchronous error was left behind


# ---------------------------------------------------------------------------------------------
# Kernel dispatch
# ---------------------------------------------------------------------------------------------


def _sm90_device() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("op", GEMM_OPS)
def test_dispatch_sm90_vs_forced_sm80(op, dtype, gen):
    if not _sm90_device():
        pytest.skip("needs an SM 9.0 (Hopper) GPU")
    if "90a" not in cutlass_nn.build_info()["cuda_archs"]:
        pytest.skip("the extension was built without sm_90a kernels")
    args = gemm_args(op, 256, 128, 512, dtype, "contig", gen)
    run_ours(op, args)
    default_name = ops.last_kernel_name()
    with cutlass_nn.ops.force_sm80_kernels():
        run_ours(op, args)
        forced_name = ops.last_kernel_name()
    assert "sm90" in default_name.lower(), default_name
    assert "sm80" in forced_name.lower(), forced_name
    assert default_name != forced_name


@pytest.mark.parametrize("prec", PRECISIONS, ids=PRECISION_IDS, indirect=True)
def test_dispatch_names_a_kernel(prec, gen):
    """Every GEMM reports the kernel it ran; float32 uses plain TF32 kernels exactly when allowed,
    and fp32-accurate kernels (3xTF32 or SIMT) otherwise."""
    args = gemm_args("linear", 64, 64, 64, prec.dtype, "contig", gen)
    run_ours("linear", args)
    name = ops.last_kernel_name()
    assert name
    if prec.dtype == torch.float32:
        plain_tf32 = "tf32" in name.lower() and "3xtf32" not in name.lower()
        assert plain_tf32 == prec.tf32, name
        if not prec.tf32:
            assert "3xtf32" in name or "simt" in name, name


def test_force_sm80_restores_previous_state(gen):
    args = gemm_args("linear", 64, 64, 64, torch.bfloat16, "contig", gen)
    run_ours("linear", args)
    before = ops.last_kernel_name()
    with cutlass_nn.ops.force_sm80_kernels():
        with cutlass_nn.ops.force_sm80_kernels(False):
            run_ours("linear", args)
            assert ops.last_kernel_name() == before
    run_ours("linear", args)
    assert ops.last_kernel_name() == before
