"""The torch.ops.cutlass_nn operators on CPU: correctness against torch, out= semantics, opcheck,
gradcheck / gradgradcheck, and that the backward of linear runs the cutlass_nn operators."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import cutlass_nn
from conftest import (
    DTYPE_IDS,
    DTYPES,
    LINEAR_CASES,
    MM_CASES,
    as_params,
    assert_close_ref,
    op_overload,
    sample_inputs,
    tol,
)

ops = torch.ops.cutlass_nn


def _sum_leading(t):
    return t.clone() if t.dim() == 1 else t.flatten(0, -2).sum(0)


def _wgrad_ref(dy, x):
    return torch.einsum("...n,...k->nk", dy, x)


REFERENCES = {
    "linear": lambda x, w, b: F.linear(x, w, b),
    "linear_dgrad": lambda dy, w: torch.matmul(dy, w),
    "linear_wgrad": _wgrad_ref,
    "bias_grad": _sum_leading,
    "mm": torch.mm,
    "mm.out": lambda a, b, out: torch.mm(a, b),
    "add2": torch.add,
    "linear_wgrad_accumulate_": lambda gw, dy, x: gw + _wgrad_ref(dy, x).to(gw.dtype),
}


def _cast(t, dtype):
    if t is None:
        return None
    return t.detach().to(dtype)


def _reduction(args):
    return max([max(t.shape, default=1) for t in args if isinstance(t, torch.Tensor)], default=1)


def _call(op, args, kwargs):
    """Runs an operator and returns its result (the mutated argument for in-place ones)."""
    result = op_overload(op)(*args, **kwargs)
    if op == "linear_wgrad_accumulate_":
        assert result is None
        return args[0]
    if op == "mm.out":
        # the schema returns nothing ('-> ()'); the result is in `out`
        assert result is None
        return kwargs["out"]
    return result


# ---------------------------------------------------------------------------------------------
# correctness
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op,args,kwargs", as_params(sample_inputs(torch.float64)))
def test_op_matches_torch(op, args, kwargs, dtype):
    args = tuple(_cast(a, dtype) for a in args)
    kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
    ref_args = tuple(a.clone() if a is not None else None for a in args)
    ref_kwargs = {k: v.clone() for k, v in kwargs.items()}
    expected = REFERENCES[op](*ref_args, **ref_kwargs)
    expected64 = REFERENCES[op](
        *(_cast(a, torch.float64) for a in ref_args),
        **{k: _cast(v, torch.float64) for k, v in ref_kwargs.items()},
    )
    actual = _call(op, args, kwargs)
    assert actual.dtype == dtype
    assert_close_ref(actual, expected, expected64, reduction=_reduction(args))


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_wgrad_accumulate_fp32_main_grad(in_dtype, lead):
    g = torch.Generator().manual_seed(1)
    dy = torch.randn(*lead, 5, generator=g).to(in_dtype)
    x = torch.randn(*lead, 7, generator=g).to(in_dtype)
    grad_weight = torch.randn(5, 7, generator=g)  # float32 main gradient
    before = grad_weight.clone()
    ptr = grad_weight.data_ptr()
    assert cutlass_nn.ops.linear_wgrad_accumulate_(grad_weight, dy, x) is None
    assert grad_weight.dtype == torch.float32 and grad_weight.data_ptr() == ptr
    expected = (before.double() + _wgrad_ref(dy.double(), x.double())).float()
    torch.testing.assert_close(grad_weight, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(grad_weight, before)
    # a second call accumulates again
    cutlass_nn.ops.linear_wgrad_accumulate_(grad_weight, dy, x)
    expected2 = (before.double() + 2 * _wgrad_ref(dy.double(), x.double())).float()
    torch.testing.assert_close(grad_weight, expected2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_python_wrappers_match_ops(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 4, generator=g).to(dtype)
    w = torch.randn(5, 4, generator=g).to(dtype)
    b = torch.randn(5, generator=g).to(dtype)
    dy = torch.randn(2, 3, 5, generator=g).to(dtype)
    t = tol(dtype, 6)
    torch.testing.assert_close(cutlass_nn.functional.linear(x, w, b), F.linear(x, w, b), **t)
    torch.testing.assert_close(cutlass_nn.linear(x, w), F.linear(x, w), **t)
    torch.testing.assert_close(cutlass_nn.ops.linear_dgrad(dy, w), dy @ w, **t)
    torch.testing.assert_close(cutlass_nn.ops.linear_wgrad(dy, x), _wgrad_ref(dy, x), **t)
    torch.testing.assert_close(cutlass_nn.ops.bias_grad(dy), dy.sum((0, 1)), **t)
    a2, b2 = x[0], w.t()
    torch.testing.assert_close(cutlass_nn.mm(a2, b2), a2 @ b2, **t)
    torch.testing.assert_close(cutlass_nn.functional.mm(a2, b2), a2 @ b2, **t)
    torch.testing.assert_close(cutlass_nn.ops.mm(a2, b2), a2 @ b2, **t)
    torch.testing.assert_close(cutlass_nn.add2(x, x * 2), x + x * 2, **t)
    torch.testing.assert_close(cutlass_nn.ops.add2(x, x), x + x, **t)


# ---------------------------------------------------------------------------------------------
# mm out= semantics
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def ab():
    g = torch.Generator().manual_seed(3)
    return torch.randn(3, 4, generator=g), torch.randn(4, 2, generator=g)


@pytest.mark.parametrize("mm", [cutlass_nn.mm, cutlass_nn.ops.mm_out], ids=["mm", "ops.mm_out"])
def test_mm_out_right_shape(ab, mm):
    a, b = ab
    out = torch.full((3, 2), float("nan"))
    ptr = out.data_ptr()
    result = mm(a, b, out=out) if mm is cutlass_nn.mm else mm(a, b, out)
    assert result is out
    assert out.data_ptr() == ptr
    torch.testing.assert_close(out, a @ b)


RESIZE_WARNING = r"^cutlass_nn\.mm: an output with one or more elements was resized"


def _resize_warnings(recorded):
    return [w for w in recorded if "resized" in str(w.message)]


def test_mm_out_wrong_shape_is_resized_with_warning(ab, capfd):
    a, b = ab
    out = torch.zeros(5, 5)
    # torch.mm's deprecation warning for resizing a non-empty out, as a Python UserWarning
    with pytest.warns(UserWarning, match=RESIZE_WARNING) as recorded:
        result = cutlass_nn.mm(a, b, out=out)
    assert result is out and out.shape == (3, 2)
    torch.testing.assert_close(out, a @ b)
    assert len(_resize_warnings(recorded)) == 1
    # the warning points at the caller (this file), not at cutlass_nn's wrapper
    assert _resize_warnings(recorded)[0].filename == __file__
    # and c10 prints nothing on stderr (the C++ op resizes silently)
    assert "resized" not in capfd.readouterr().err


def test_mm_out_wrong_shape_warns_like_torch(ab):
    a, b = ab
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.mm(a, b, out=torch.zeros(5, 5))  # the torch behavior we mirror
    with pytest.warns(UserWarning, match=RESIZE_WARNING):
        cutlass_nn.mm(a, b, out=torch.zeros(5, 5))
    with pytest.warns(UserWarning, match=RESIZE_WARNING) as recorded:
        cutlass_nn.ops.mm_out(a, b, torch.zeros(5, 5))
    assert _resize_warnings(recorded)[0].filename == __file__


def test_mm_out_wrong_shape_warning_can_be_made_an_error(ab):
    a, b = ab
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(UserWarning, match=RESIZE_WARNING):
            cutlass_nn.mm(a, b, out=torch.zeros(5, 5))


def test_mm_out_op_resizes_silently(ab, capfd, recwarn):
    """The raw operator returns nothing and resizes without a warning (the Python wrapper
    warns)."""
    a, b = ab
    out = torch.zeros(5, 5)
    assert ops.mm.out(a, b, out=out) is None
    assert out.shape == (3, 2)
    torch.testing.assert_close(out, a @ b)
    assert not _resize_warnings(recwarn.list)
    assert "resized" not in capfd.readouterr().err


def test_mm_out_empty_out_resized_without_warning(ab, capfd, recwarn):
    a, b = ab
    out = torch.empty(0)
    assert cutlass_nn.mm(a, b, out=out) is out
    assert out.shape == (3, 2)
    torch.testing.assert_close(out, a @ b)
    assert not _resize_warnings(recwarn.list)
    assert "resized" not in capfd.readouterr().err


def test_mm_out_non_contiguous(ab):
    a, b = ab
    base = torch.full((2, 3), float("nan"))
    out = base.t()  # [3, 2], strides (1, 3)
    assert not out.is_contiguous()
    stride, ptr = out.stride(), out.data_ptr()
    result = cutlass_nn.mm(a, b, out=out)
    assert result is out
    assert out.stride() == stride and out.data_ptr() == ptr
    torch.testing.assert_close(out, a @ b)
    torch.testing.assert_close(base, (a @ b).t())  # landed in the original storage


def test_mm_out_aliases_input():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(4, 4, generator=g)
    b = torch.randn(4, 4, generator=g)
    expected_a = a @ b
    assert cutlass_nn.mm(a, b, out=a) is a
    torch.testing.assert_close(a, expected_a)
    a = torch.randn(4, 4, generator=g)
    expected_b = a @ b
    cutlass_nn.mm(a, b, out=b)
    torch.testing.assert_close(b, expected_b)


def test_mm_out_dtype_mismatch(ab):
    a, b = ab
    out = torch.zeros(3, 2, dtype=torch.float64)
    with pytest.raises(
        (TypeError, RuntimeError),
        match=r"cutlass_nn\.mm\.out: argument 'out' must have dtype float32 .*got float64",
    ):
        cutlass_nn.mm(a, b, out=out)
    assert torch.equal(out, torch.zeros(3, 2, dtype=torch.float64))


def test_mm_out_device_mismatch(ab):
    a, b = ab
    out = torch.empty(3, 2, device="meta")
    with pytest.raises(
        RuntimeError,
        match=r"cutlass_nn\.mm\.out: argument 'out' must be on device cpu \(the device of 'a'\), "
        r"got meta",
    ):
        cutlass_nn.mm(a, b, out=out)


@pytest.mark.parametrize("which", ["a", "b", "out"])
def test_mm_out_with_requires_grad_raises(ab, which):
    a, b = ab
    out = torch.zeros(3, 2)
    {"a": a, "b": b, "out": out}[which].requires_grad_()
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.mm: .*out=.*automatic differentiation"):
        cutlass_nn.mm(a, b, out=out)
    with torch.no_grad():  # fine without autograd, like torch.mm
        cutlass_nn.mm(a, b, out=out)
    torch.testing.assert_close(out.detach(), a.detach() @ b.detach())


# ---------------------------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "op,args,kwargs",
    as_params(sample_inputs(torch.float32) + sample_inputs(torch.float64, requires_grad=True)),
)
def test_opcheck(op, args, kwargs):
    # every default test_util (test_schema, test_autograd_registration, test_faketensor,
    # test_aot_dispatch_dynamic), mm.out included
    torch.library.opcheck(op_overload(op), args, kwargs)


def test_mm_out_schema_returns_nothing():
    # an out= custom op that returns an alias cannot be functionalized by AOTAutograd
    assert len(ops.mm.out._schema.returns) == 0


def test_opcheck_mm_out_aot_dispatch(ab):
    a, b = ab
    torch.library.opcheck(
        ops.mm.out, (a, b), {"out": torch.empty(3, 2)}, test_utils=("test_aot_dispatch_dynamic",)
    )


# ---------------------------------------------------------------------------------------------
# gradcheck / gradgradcheck (float64)
# ---------------------------------------------------------------------------------------------


def _subsets(n):
    return [s for r in range(1, n + 1) for s in itertools.combinations(range(n), r)]


def _gradchecks(fn, inputs):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5)
    assert torch.autograd.gradgradcheck(fn, inputs, eps=1e-6, atol=1e-5)


def _linear_params():
    params = []
    for c in LINEAR_CASES:
        n_in = 3 if c.bias else 2
        subsets = _subsets(n_in) if c.name in ("2d_bias", "3d_bias", "2d_nobias") else [
            tuple(range(n_in))
        ]
        for s in subsets:
            params.append(pytest.param(c, s, id=f"{c.name}-grads{s}"))
    return params


@pytest.mark.parametrize("case,grads", _linear_params())
def test_gradcheck_linear(case, grads):
    x, w, b, _ = case.tensors(torch.float64)
    inputs = [x, w, b][: 3 if case.bias else 2]
    for i in grads:
        inputs[i].requires_grad_()
    _gradchecks(lambda *t: cutlass_nn.ops.linear(*t), tuple(inputs))


def _backward_op_params(op, n_args):
    params = []
    for c in LINEAR_CASES:
        for s in _subsets(n_args) if c.name in ("2d_bias", "3d_bias") else [tuple(range(n_args))]:
            params.append(pytest.param(c, s, id=f"{c.name}-grads{s}"))
    return params


@pytest.mark.parametrize("case,grads", _backward_op_params("linear_dgrad", 2))
def test_gradcheck_linear_dgrad(case, grads):
    _, w, _, dy = case.tensors(torch.float64)
    inputs = [dy, w]
    for i in grads:
        inputs[i].requires_grad_()
    _gradchecks(cutlass_nn.ops.linear_dgrad, tuple(inputs))


@pytest.mark.parametrize("case,grads", _backward_op_params("linear_wgrad", 2))
def test_gradcheck_linear_wgrad(case, grads):
    x, _, _, dy = case.tensors(torch.float64)
    inputs = [dy, x]
    for i in grads:
        inputs[i].requires_grad_()
    _gradchecks(cutlass_nn.ops.linear_wgrad, tuple(inputs))


@pytest.mark.parametrize("case", LINEAR_CASES, ids=[c.name for c in LINEAR_CASES])
def test_gradcheck_bias_grad(case):
    _, _, _, dy = case.tensors(torch.float64)
    _gradchecks(cutlass_nn.ops.bias_grad, (dy.requires_grad_(),))


@pytest.mark.parametrize("grads", _subsets(2))
@pytest.mark.parametrize("case", MM_CASES, ids=[c.name for c in MM_CASES])
def test_gradcheck_mm(case, grads):
    inputs = list(case.tensors(torch.float64))
    for i in grads:
        inputs[i].requires_grad_()
    _gradchecks(cutlass_nn.mm, tuple(inputs))


@pytest.mark.parametrize("grads", _subsets(2))
@pytest.mark.parametrize("layout", ["contig", "t", "slice"])
def test_gradcheck_add2(layout, grads):
    from conftest import PairCase

    inputs = list(PairCase("x", (3, 4), (3, 4), layout).tensors(torch.float64))
    for i in grads:
        inputs[i].requires_grad_()
    _gradchecks(cutlass_nn.add2, tuple(inputs))


# ---------------------------------------------------------------------------------------------
# the backward really runs the cutlass_nn operators
# ---------------------------------------------------------------------------------------------


class _OpLog(TorchDispatchMode):
    """Records the top-level operators dispatched (the kernels they call inside are not seen)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket._qualified_op_name))
        return func(*args, **(kwargs or {}))


def test_linear_backward_dispatches_cutlass_ops():
    x = torch.randn(2, 3, 4, requires_grad=True)
    layer = cutlass_nn.CutlassLinear(4, 5)
    y = layer(x)
    with _OpLog() as log:
        y.backward(torch.randn_like(y))
    names = log.names
    for op in ("cutlass_nn::linear_dgrad", "cutlass_nn::linear_wgrad", "cutlass_nn::bias_grad"):
        assert op in names, names
    assert not any(n in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul") for n in names)
    assert not any(n == "aten::sum" for n in names), names


def test_linear_forward_dispatches_cutlass_op():
    layer = cutlass_nn.CutlassLinear(4, 5)
    with _OpLog() as log:
        layer(torch.randn(3, 4))
    assert "cutlass_nn::linear" in log.names
    assert not any(n.startswith("aten::") and "mm" in n for n in log.names), log.names


def test_mm_and_add2_backward_dispatch_cutlass_ops():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, 2, requires_grad=True)
    c = torch.randn(3, 2, requires_grad=True)
    y = cutlass_nn.add2(cutlass_nn.mm(a, b), c)
    with _OpLog() as log:
        y.sum().backward()
    assert log.names.count("cutlass_nn::mm") == 2, log.names
    assert "aten::mm" not in log.names


# ---------------------------------------------------------------------------------------------
# Autograd in C++: one node per call, none when nothing needs it
# ---------------------------------------------------------------------------------------------


def test_linear_autograd_records_one_node_and_backward_records_none():
    """The C++ autograd kernel records one node whose edges go straight to the inputs (no extra
    bookkeeping node); a backward without create_graph records no graph; with create_graph the
    gradients are differentiable; calls that need no gradient record nothing."""
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    y = ops.linear(x, w, b)
    assert "LinearFunction" in y.grad_fn.name()
    assert [type(f).__name__ for f, _ in y.grad_fn.next_functions] == ["AccumulateGrad"] * 3
    y.sum().backward()
    assert x.grad.grad_fn is None and w.grad.grad_fn is None and b.grad.grad_fn is None
    torch.testing.assert_close(w.grad, torch.ones(4, 3, dtype=torch.float64).t() @ x.detach())
    (gx,) = torch.autograd.grad(ops.linear(x, w, b).pow(2).sum(), x, create_graph=True)
    assert gx.requires_grad and gx.grad_fn is not None
    with torch.no_grad():
        assert ops.linear(x, w, b).grad_fn is None
    assert ops.linear(x.detach(), w.detach(), b.detach()).grad_fn is None
    for fn, args in (
        (ops.mm, (x.t(), torch.randn(4, 2, dtype=torch.float64))),
        (ops.add2, (x, x)),
        (ops.linear_dgrad, (torch.randn(4, 3, dtype=torch.float64), w)),
        (ops.linear_wgrad, (torch.randn(4, 3, dtype=torch.float64), x)),
        (ops.bias_grad, (x,)),
    ):
        out = fn(*args)
        assert out.grad_fn is not None and "CppNode" in out.grad_fn.name(), fn


def test_set_epilogue_without_c_schema_and_round_trip():
    # The switch the step-sweep's "+c" candidates and the dispatch tests use: a bool in, the
    # previous setting out (the CPU flavor has no such kernels and answers True).
    op = torch.ops.cutlass_nn._set_epilogue_without_c
    assert str(op.default._schema) == "cutlass_nn::_set_epilogue_without_c(bool enabled) -> bool"
    previous = op(False)
    try:
        assert previous is True
        # the CUDA flavor keeps the setting just made; the CPU flavor has nothing to keep
        assert op(False) is (cutlass_nn.build_info()["flavor"] != "cuda")
    finally:
        op(previous)
    assert op(True) is True
