"""Every argument error names the operator, the argument, what was expected and what was given,
and nothing is mutated when a call fails.

Mixed devices: there is no GPU, so the second device is "meta". A call mixing cpu and meta
tensors is dispatched to the Meta kernel (cutlass_nn's fake implementation, cutlass_nn/ops.py)
or to the CPU kernel (csrc/op_checks.cpp) depending on the dispatch key order; both produce the
same cutlass_nn message, which is what these tests assert.
"""

from __future__ import annotations

import re

import pytest
import torch

import cutlass_nn

ops = torch.ops.cutlass_nn
DTYPE_ERR = RuntimeError  # every check raises through TORCH_CHECK (csrc/validation.h)


def r(*n):
    return torch.randn(n)


def meta(*n):
    return torch.empty(*n, device="meta")


E = re.escape

CASES = [
    # ---- mixed devices
    ("linear weight on meta", lambda: ops.linear(r(3, 4), meta(5, 4)), RuntimeError,
     E("cutlass_nn.linear: argument 'weight' must be on device cpu (the device of 'input'), got meta")),
    ("linear input on meta", lambda: ops.linear(meta(3, 4), r(5, 4)), RuntimeError,
     E("cutlass_nn.linear: argument 'weight' must be on device meta (the device of 'input'), got cpu")),
    ("linear bias on meta", lambda: ops.linear(r(3, 4), r(5, 4), meta(5)), RuntimeError,
     E("cutlass_nn.linear: argument 'bias' must be on device cpu (the device of 'input'), got meta")),
    ("dgrad weight on meta", lambda: ops.linear_dgrad(r(3, 5), meta(5, 4)), RuntimeError,
     E("cutlass_nn.linear_dgrad: argument 'weight' must be on device cpu (the device of 'grad_output'), got meta")),
    ("wgrad input on meta", lambda: ops.linear_wgrad(r(3, 5), meta(3, 4)), RuntimeError,
     E("cutlass_nn.linear_wgrad: argument 'input' must be on device cpu (the device of 'grad_output'), got meta")),
    ("mm b on meta", lambda: cutlass_nn.mm(r(3, 4), meta(4, 2)), RuntimeError,
     E("cutlass_nn.mm: argument 'b' must be on device cpu (the device of 'a'), got meta")),
    ("add2 b on meta", lambda: cutlass_nn.add2(r(3, 4), meta(3, 4)), RuntimeError,
     E("cutlass_nn.add2: argument 'b' must be on device cpu (the device of 'a'), got meta")),
    # ---- dtype mismatch
    ("linear weight dtype", lambda: ops.linear(r(3, 4), r(5, 4).double()), DTYPE_ERR,
     E("cutlass_nn.linear: argument 'weight' must have dtype float32 (the dtype of 'input'), got float64")),
    ("linear bias dtype", lambda: ops.linear(r(3, 4), r(5, 4), r(5).half()), DTYPE_ERR,
     E("cutlass_nn.linear: argument 'bias' must have dtype float32 (the dtype of 'input'), got float16")),
    ("dgrad dtype", lambda: ops.linear_dgrad(r(3, 5).bfloat16(), r(5, 4)), DTYPE_ERR,
     E("cutlass_nn.linear_dgrad: argument 'weight' must have dtype bfloat16 (the dtype of 'grad_output'), got float32")),
    ("wgrad dtype", lambda: ops.linear_wgrad(r(3, 5), r(3, 4).half()), DTYPE_ERR,
     E("cutlass_nn.linear_wgrad: argument 'input' must have dtype float32 (the dtype of 'grad_output'), got float16")),
    ("mm dtype", lambda: cutlass_nn.mm(r(3, 4), r(4, 2).double()), DTYPE_ERR,
     E("cutlass_nn.mm: argument 'b' must have dtype float32 (the dtype of 'a'), got float64")),
    ("add2 dtype", lambda: cutlass_nn.add2(r(3, 4).half(), r(3, 4)), DTYPE_ERR,
     E("cutlass_nn.add2: argument 'b' must have dtype float16 (the dtype of 'a'), got float32")),
    ("accumulate grad_weight dtype",
     lambda: ops.linear_wgrad_accumulate_(r(5, 4).double(), r(3, 5).half(), r(3, 4).half()), DTYPE_ERR,
     E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' must have dtype float16 (the dtype of 'grad_output') or float32, got float64")),
    # ---- non-float dtypes
    ("linear int input", lambda: ops.linear(torch.ones(3, 4, dtype=torch.int32), torch.ones(5, 4, dtype=torch.int32)), DTYPE_ERR,
     E("cutlass_nn.linear: argument 'input' must have a floating dtype (float16, bfloat16, float32 or float64), got int32")),
    ("mm long", lambda: cutlass_nn.mm(torch.ones(3, 4, dtype=torch.long), torch.ones(4, 2, dtype=torch.long)), DTYPE_ERR,
     E("cutlass_nn.mm: argument 'a' must have a floating dtype (float16, bfloat16, float32 or float64), got int64")),
    ("add2 bool", lambda: cutlass_nn.add2(torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)), DTYPE_ERR,
     E("cutlass_nn.add2: argument 'a' must have a floating dtype (float16, bfloat16, float32 or float64), got bool")),
    ("bias_grad int", lambda: ops.bias_grad(torch.ones(3, 4, dtype=torch.int64)), DTYPE_ERR,
     E("cutlass_nn.bias_grad: argument 'grad_output' must have a floating dtype (float16, bfloat16, float32 or float64), got int64")),
    ("add2 complex", lambda: cutlass_nn.add2(r(3).to(torch.complex64), r(3).to(torch.complex64)), DTYPE_ERR,
     r"cutlass_nn\.add2: argument 'a' must have a floating dtype .*got (complex64|ComplexFloat)"),
    # ---- shape mismatch / rank
    ("linear in_features", lambda: ops.linear(r(3, 4), r(5, 6)), RuntimeError,
     E("cutlass_nn.linear: argument 'input' must have size 6 in dimension 1 (in_features = weight.shape[1]), got shape [3, 4]")),
    ("linear 0-d input", lambda: ops.linear(r(), r(5, 4)), RuntimeError,
     E("cutlass_nn.linear: argument 'input' must have at least 1 dimension(s) [*, in_features], got a 0-D tensor of shape []")),
    ("linear 3-d weight", lambda: ops.linear(r(3, 4), r(1, 5, 4)), RuntimeError,
     E("cutlass_nn.linear: argument 'weight' must be a 2-D tensor [out_features, in_features], got a 3-D tensor of shape [1, 5, 4]")),
    ("linear bias size", lambda: ops.linear(r(3, 4), r(5, 4), r(4)), RuntimeError,
     E("cutlass_nn.linear: argument 'bias' must have size 5 in dimension 0 (out_features = weight.shape[0]), got shape [4]")),
    ("linear bias rank", lambda: ops.linear(r(3, 4), r(5, 4), r(1, 5)), RuntimeError,
     E("cutlass_nn.linear: argument 'bias' must be a 1-D tensor [out_features], got a 2-D tensor of shape [1, 5]")),
    ("dgrad out_features", lambda: ops.linear_dgrad(r(3, 6), r(5, 4)), RuntimeError,
     E("cutlass_nn.linear_dgrad: argument 'grad_output' must have size 5 in dimension 1 (out_features = weight.shape[0]), got shape [3, 6]")),
    ("dgrad weight rank", lambda: ops.linear_dgrad(r(3, 5), r(5)), RuntimeError,
     E("cutlass_nn.linear_dgrad: argument 'weight' must be a 2-D tensor [out_features, in_features], got a 1-D tensor of shape [5]")),
    ("wgrad batch", lambda: ops.linear_wgrad(r(2, 5), r(3, 4)), RuntimeError,
     E("cutlass_nn.linear_wgrad: arguments 'grad_output' [*, out_features] and 'input' [*, in_features] must have the same leading (batch) dimensions, got [2, 5] and [3, 4]")),
    ("wgrad batch nd", lambda: ops.linear_wgrad(r(2, 3, 5), r(3, 2, 4)), RuntimeError,
     E("cutlass_nn.linear_wgrad: arguments 'grad_output' [*, out_features] and 'input' [*, in_features] must have the same leading (batch) dimensions, got [2, 3, 5] and [3, 2, 4]")),
    ("wgrad 0-d", lambda: ops.linear_wgrad(r(), r(3, 4)), RuntimeError,
     E("cutlass_nn.linear_wgrad: argument 'grad_output' must have at least 1 dimension(s) [*, out_features], got a 0-D tensor of shape []")),
    ("bias_grad 0-d", lambda: ops.bias_grad(r()), RuntimeError,
     E("cutlass_nn.bias_grad: argument 'grad_output' must have at least 1 dimension(s) [*, out_features], got a 0-D tensor of shape []")),
    ("mm inner", lambda: cutlass_nn.mm(r(3, 4), r(3, 3)), RuntimeError,
     E("cutlass_nn.mm: argument 'b' must have size 4 in dimension 0 (m = a.shape[1]), got shape [3, 3]")),
    ("mm 3-d a", lambda: cutlass_nn.mm(r(2, 3, 4), r(4, 3)), RuntimeError,
     E("cutlass_nn.mm: argument 'a' must be a 2-D tensor [n, m], got a 3-D tensor of shape [2, 3, 4]")),
    ("mm 1-d b", lambda: cutlass_nn.mm(r(3, 4), r(4)), RuntimeError,
     E("cutlass_nn.mm: argument 'b' must be a 2-D tensor [m, p], got a 1-D tensor of shape [4]")),
    ("add2 shape", lambda: cutlass_nn.add2(r(3, 4), r(4, 3)), RuntimeError,
     E("cutlass_nn.add2: argument 'b' must have the shape of 'a' [3, 4], got [4, 3]")),
    ("add2 no broadcasting", lambda: cutlass_nn.add2(r(3, 4), r(4)), RuntimeError,
     E("cutlass_nn.add2: argument 'b' must have the shape of 'a' [3, 4], got [4]")),
    ("mm.out inner", lambda: cutlass_nn.mm(r(3, 4), r(3, 3), out=r(3, 3)), RuntimeError,
     E("cutlass_nn.mm.out: argument 'b' must have size 4 in dimension 0 (m = a.shape[1]), got shape [3, 3]")),
    ("mm.out dtype", lambda: cutlass_nn.mm(r(3, 4), r(4, 2), out=torch.empty(3, 2, dtype=torch.float16)), DTYPE_ERR,
     E("cutlass_nn.mm.out: argument 'out' must have dtype float32 (the dtype of 'a'), got float16")),
    ("from_linear non-linear", lambda: cutlass_nn.CutlassLinear.from_linear(torch.nn.Conv1d(1, 1, 1)), TypeError,
     E("cutlass_nn.CutlassLinear.from_linear: argument 'linear' must be an nn.Linear, got Conv1d")),
]


@pytest.mark.parametrize("fn,exc,match", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_error_message(fn, exc, match):
    with pytest.raises(exc, match=match):
        fn()


def test_module_errors_name_the_operator():
    layer = cutlass_nn.CutlassLinear(4, 5)
    with pytest.raises(RuntimeError, match=E("cutlass_nn.linear: argument 'input' must have size 4")):
        layer(r(2, 3))
    with pytest.raises(DTYPE_ERR, match=E("cutlass_nn.linear: argument 'weight' must have dtype float64")):
        layer(r(2, 4).double())


def test_errors_also_under_fake_tensors():
    """The fake implementations (torch.compile / export) reject what eager rejects."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        with pytest.raises(Exception, match=E("cutlass_nn.linear: argument 'input' must have size 6")):
            ops.linear(r(3, 4), r(5, 6))
        with pytest.raises(Exception, match=E("cutlass_nn.add2: argument 'b' must have the shape of 'a' [3, 4], got [4, 3]")):
            ops.add2(r(3, 4), r(4, 3))
        with pytest.raises(Exception, match=E("cutlass_nn.mm: argument 'b' must have dtype float32 (the dtype of 'a'), got float64")):
            ops.mm(r(3, 4), r(4, 2).double())


@pytest.mark.parametrize(
    "a,b,out,exc",
    [
        (r(3, 4), r(3, 3), torch.full((3, 3), 7.0), RuntimeError),  # inner mismatch
        (r(3, 4), r(4, 2).double(), torch.full((3, 2), 7.0), DTYPE_ERR),  # b dtype
        (r(3, 4), r(4, 2), torch.full((3, 2), 7.0, dtype=torch.float64), DTYPE_ERR),  # out dtype
        (r(3, 4), r(4, 2), torch.full((5, 5), 7.0, dtype=torch.float64), DTYPE_ERR),  # + shape
        (r(2, 3, 4), r(4, 2), torch.full((3, 2), 7.0), RuntimeError),  # a rank
    ],
)
def test_mm_out_error_leaves_out_unchanged(a, b, out, exc):
    before = out.clone()
    ptr, shape, stride = out.data_ptr(), out.shape, out.stride()
    with pytest.raises(exc, match=r"cutlass_nn\.mm\.out: argument '(a|b|out)'"):
        cutlass_nn.mm(a, b, out=out)
    assert out.shape == shape and out.stride() == stride and out.data_ptr() == ptr
    assert torch.equal(out, before)


@pytest.mark.parametrize(
    "gw,dy,x,exc,match",
    [
        (r(4, 5), r(3, 5), r(3, 4), RuntimeError,
         E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' must have size 5 in dimension 0 (out_features = grad_output.shape[-1]), got shape [4, 5]")),
        (r(5, 3), r(3, 5), r(3, 4), RuntimeError,
         E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' must have size 4 in dimension 1 (in_features = input.shape[-1]), got shape [5, 3]")),
        (r(5, 4, 1), r(3, 5), r(3, 4), RuntimeError,
         E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' must be a 2-D tensor [out_features, in_features], got a 3-D tensor of shape [5, 4, 1]")),
        (r(5, 4), r(2, 5), r(3, 4), RuntimeError,
         E("cutlass_nn.linear_wgrad_accumulate_: arguments 'grad_output' [*, out_features] and 'input' [*, in_features] must have the same leading (batch) dimensions, got [2, 5] and [3, 4]")),
        (r(5, 4).half(), r(3, 5).bfloat16(), r(3, 4).bfloat16(), DTYPE_ERR,
         E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' must have dtype bfloat16 (the dtype of 'grad_output') or float32, got float16")),
        (meta(5, 4), r(3, 5), r(3, 4), RuntimeError,
         E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' must be on device cpu (the device of 'grad_output'), got meta")),
    ],
)
def test_accumulate_error_leaves_grad_weight_unchanged(gw, dy, x, exc, match):
    before = gw.clone()
    with pytest.raises(exc, match=match):
        ops.linear_wgrad_accumulate_(gw, dy, x)
    if gw.device.type != "meta":
        assert torch.equal(gw, before)


# ---- arguments written in place -----------------------------------------------------------
# Every operator that writes into an argument refuses, with its own name and the argument's: an
# argument whose elements share memory (expand(), stride 0), a leaf that requires grad (or a view
# of one) while grad mode is on, and operands that share the written argument's memory. The
# tensors' contents are left as they were.

def _expanded(*shape):
    return torch.arange(float(shape[-1])).expand(*shape)


def _stride0(*shape):
    return torch.arange(float(shape[-1])).as_strided(shape, (0, 1))


OVERLAP = "must not have elements that share memory (it is written in place), got shape "
LEAF = "must not be a leaf tensor that requires grad, nor a view of one, while grad mode is on"

WRITTEN_CASES = [
    ("gated_act_backward_ expanded gate_up", lambda: (_expanded(3, 4),),
     lambda gu: ops.gated_act_backward_(r(3, 2), gu, "silu"),
     E("cutlass_nn.gated_act_backward_: argument 'gate_up' " + OVERLAP + "[3, 4] with strides [0, 1]")),
    ("cross_entropy_rows_ expanded logits", lambda: (_expanded(3, 4),),
     lambda z: ops.cross_entropy_rows_(z, torch.tensor([0, 1, 2]), None, -100, 0.0, True),
     E("cutlass_nn.cross_entropy_rows_: argument 'logits' " + OVERLAP + "[3, 4] with strides [0, 1]")),
    ("cross_entropy_rows_ stride-0 logits", lambda: (_stride0(3, 4),),
     lambda z: ops.cross_entropy_rows_(z, torch.tensor([0, 1, 2]), None, -100, 0.0, True),
     E("cutlass_nn.cross_entropy_rows_: argument 'logits' " + OVERLAP + "[3, 4] with strides [0, 1]")),
    ("linear_wgrad_accumulate_ expanded grad_weight", lambda: (_expanded(5, 4),),
     lambda gw: ops.linear_wgrad_accumulate_(gw, r(3, 5), r(3, 4)),
     E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' " + OVERLAP + "[5, 4] with strides [0, 1]")),
    ("mm.out expanded out", lambda: (_expanded(5, 4),),
     lambda out: ops.mm.out(r(5, 3), r(3, 4), out=out),
     E("cutlass_nn.mm.out: argument 'out' " + OVERLAP + "[5, 4] with strides [0, 1]")),
    ("scale_ expanded x", lambda: (_expanded(5, 4),),
     lambda x: ops.scale_(x, torch.tensor(2.0)),
     E("cutlass_nn.scale_: argument 'x' " + OVERLAP + "[5, 4] with strides [0, 1]")),
    ("gated_act_backward_ leaf gate_up", lambda: (r(3, 4).requires_grad_(),),
     lambda gu: ops.gated_act_backward_(r(3, 2), gu, "silu"),
     E("cutlass_nn.gated_act_backward_: argument 'gate_up' " + LEAF) + ".*got a leaf with requires_grad=True"),
    ("cross_entropy_rows_ leaf logits", lambda: (r(3, 4).requires_grad_(),),
     lambda z: ops.cross_entropy_rows_(z, torch.tensor([0, 1, 2]), None, -100, 0.0, True),
     E("cutlass_nn.cross_entropy_rows_: argument 'logits' " + LEAF) + ".*got a leaf with requires_grad=True"),
    ("linear_wgrad_accumulate_ leaf grad_weight", lambda: (r(5, 4).requires_grad_(),),
     lambda gw: ops.linear_wgrad_accumulate_(gw, r(3, 5), r(3, 4)),
     E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_weight' " + LEAF) + ".*got a leaf"),
    ("mm.out leaf out", lambda: (r(5, 4).requires_grad_(),),
     lambda out: ops.mm.out(r(5, 3), r(3, 4), out=out),
     E("cutlass_nn.mm.out: argument 'out' " + LEAF) + ".*got a leaf"),
    ("scale_ leaf x", lambda: (r(5, 4).requires_grad_(),),
     lambda x: ops.scale_(x, torch.tensor(2.0)),
     E("cutlass_nn.scale_: argument 'x' " + LEAF) + ".*got a leaf with requires_grad=True"),
    ("scale_ view of a leaf", lambda: (r(5, 4).requires_grad_(),),
     lambda x: ops.scale_(x[1:], torch.tensor(2.0)),
     E("cutlass_nn.scale_: argument 'x' " + LEAF) + ".*got a view of a leaf with requires_grad=True"),
    ("accumulate grad_output is grad_weight", lambda: (r(4, 4),),
     lambda gw: ops.linear_wgrad_accumulate_(gw, gw, r(4, 4)),
     E("cutlass_nn.linear_wgrad_accumulate_: argument 'grad_output' must not share memory with 'grad_weight' (which is written in place)")),
    ("accumulate input is grad_weight", lambda: (r(4, 4),),
     lambda gw: ops.linear_wgrad_accumulate_(gw, r(4, 4), gw),
     E("cutlass_nn.linear_wgrad_accumulate_: argument 'input' must not share memory with 'grad_weight' (which is written in place)")),
    ("accumulate input overlaps grad_weight partly", lambda: (r(10, 4),),
     lambda base: ops.linear_wgrad_accumulate_(base[:5], r(3, 5), base[4:7]),
     E("cutlass_nn.linear_wgrad_accumulate_: argument 'input' must not share memory with 'grad_weight' (which is written in place)")),
]


@pytest.mark.parametrize("make,call,match", [pytest.param(*c[1:], id=c[0]) for c in WRITTEN_CASES])
def test_written_arguments_are_checked_and_left_unchanged(make, call, match):
    args = make()
    before = [a.detach().clone() for a in args]
    with pytest.raises(RuntimeError, match=match):
        call(*args)
    for a, b in zip(args, before):
        assert torch.equal(a.detach(), b)


def test_a_leaf_that_requires_grad_may_be_written_under_no_grad():
    # what torch's in-place operations allow too: the leaf check is about recording autograd
    x = r(5, 4).requires_grad_()
    want = x.detach() * 2
    with torch.no_grad():
        ops.scale_(x, torch.tensor(2.0))
    assert torch.equal(x.detach(), want)


def test_mm_out_of_another_shape_is_resized_even_when_expanded():
    # an `out` that is resized gets fresh strides before it is written: not refused
    a, b = r(5, 3), r(3, 4)
    out = torch.zeros(1, 2).expand(3, 2)
    with pytest.warns(UserWarning, match="resized"):
        cutlass_nn.mm(a, b, out=out)
    torch.testing.assert_close(out, a @ b)


def _linear_step(layer, x, g):
    cutlass_nn.functional.linear(x, layer.weight).mul(g).sum().backward()


def test_fused_accumulation_into_a_grad_that_shares_the_input_takes_the_usual_path():
    """A .grad sharing memory with the layer's input: the fused path would add into it while
    the GEMM still reads it (a wrong sum before); the usual path gives the right one."""
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 4, generator=gen, dtype=torch.float64))
    x = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    g = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    want = x + g.t() @ x
    w.grad = x  # the same tensor
    with cutlass_nn.fused_wgrad_accumulation():
        cutlass_nn.functional.linear(x, w).mul(g).sum().backward()
    torch.testing.assert_close(w.grad, want, rtol=1e-12, atol=1e-12)


def test_main_grad_that_is_the_input_takes_the_usual_path():
    gen = torch.Generator().manual_seed(1)
    layer = cutlass_nn.CutlassLinear(4, 4, bias=False, dtype=torch.float64)
    (buffer,) = cutlass_nn.attach_main_grads(layer).values()
    buffer.copy_(torch.randn(4, 4, generator=gen, dtype=torch.float64))
    g = torch.randn(4, 4, generator=gen, dtype=torch.float64)
    want = buffer + g.t() @ buffer
    try:
        layer(buffer).mul(g).sum().backward()  # the input is the weight's main gradient
    finally:
        cutlass_nn.detach_main_grads(layer)
    torch.testing.assert_close(buffer, want, rtol=1e-12, atol=1e-12)
    assert layer.weight.grad is None


def test_gated_mlp_main_grad_that_is_the_input_takes_the_usual_path():
    import copy

    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    mlp = cutlass_nn.GatedMLP(4, 3, dtype=torch.float64)
    ref = copy.deepcopy(mlp)
    buffers = cutlass_nn.attach_main_grads(mlp)
    gate = buffers["gate_proj.weight"]  # [3, 4]: a batch of 3 inputs, one storage with up's
    gate.copy_(torch.randn(3, 4, generator=gen, dtype=torch.float64))
    g = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    ref(gate.clone()).mul(g).sum().backward()
    want = {name: buffers[name] + p.grad for name, p in ref.named_parameters()}
    try:
        mlp(gate).mul(g).sum().backward()
    finally:
        cutlass_nn.detach_main_grads(mlp)
    for name in want:
        torch.testing.assert_close(buffers[name], want[name], rtol=1e-12, atol=1e-12, msg=name)


# ---- non-finite logits --------------------------------------------------------------------
# cross_entropy_rows_'s lse is torch.logsumexp's also for rows whose maximum is infinite (+inf
# for a +inf logit, -inf for a row of -inf; NaN stays NaN), and its loss and gradient are
# F.cross_entropy's for every row (NaN for those rows).

INF, NAN = float("inf"), float("nan")
NONFINITE_ROWS = [
    [0.0, INF, 1.0],     # one +inf
    [-INF, -INF, -INF],  # all -inf
    [INF, INF, INF],     # all +inf
    [-INF, 0.5, INF],    # +inf and -inf
    [NAN, INF, 0.0],     # NaN beside +inf: NaN
    [-INF, -INF, NAN],   # NaN beside -inf: NaN
    [-INF, 2.0, -INF],   # finite maximum, -inf elsewhere: finite
    [1.0, 2.0, 3.0],
]


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cross_entropy_rows_of_non_finite_logits_match_torch(dtype, smoothing):
    z = torch.tensor(NONFINITE_ROWS, dtype=dtype)
    t = torch.tensor([0, 1, 2, 0, 1, 2, 1, 2])
    z_ref = z.clone().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(z_ref, t, reduction="none", label_smoothing=smoothing)
    (ref_grad,) = torch.autograd.grad(ref_loss.sum(), z_ref)
    buf = z.clone()
    loss, lse = ops.cross_entropy_rows_(buf, t, None, -100, smoothing, True)
    torch.testing.assert_close(lse, torch.logsumexp(z, 1), equal_nan=True)
    torch.testing.assert_close(loss, ref_loss.detach(), equal_nan=True)
    torch.testing.assert_close(buf, ref_grad, equal_nan=True)
    # ignored rows: zero loss and gradient, the same lse
    buf = z.clone()
    loss, lse2 = ops.cross_entropy_rows_(buf, torch.full_like(t, -100), None, -100, smoothing, True)
    assert torch.equal(loss, torch.zeros_like(loss)) and torch.equal(buf, torch.zeros_like(buf))
    torch.testing.assert_close(lse2, lse, equal_nan=True)


# ---- the right operator and argument --------------------------------------------------------
NAME_CASES = [
    ("add_rms_norm features of x", lambda: cutlass_nn.add_rms_norm(r(2, 5), r(2, 5), r(4)),
     E("cutlass_nn.add_rms_norm: argument 'x' must have size 4 in dimension 1 (features = weight.shape[0]), got shape [2, 5]")),
    ("add_rms_norm residual shape", lambda: cutlass_nn.add_rms_norm(r(2, 5), r(3, 5), r(5)),
     E("cutlass_nn.add_rms_norm: argument 'residual' must have the shape of 'x' [2, 5], got [3, 5]")),
    ("add_rms_norm int x", lambda: ops.add_rms_norm(torch.ones(2, 5, dtype=torch.int32), torch.ones(2, 5, dtype=torch.int32), r(5), 1e-6),
     E("cutlass_nn.add_rms_norm: argument 'x' must have a floating dtype")),
    ("AddRMSNorm features of x", lambda: cutlass_nn.AddRMSNorm(4)(r(2, 5), r(2, 5)),
     E("cutlass_nn.add_rms_norm: argument 'x' must have size 4 in dimension 1 (features = weight.shape[0]), got shape [2, 5]")),
    ("RMSNorm features of input", lambda: cutlass_nn.RMSNorm(4)(r(2, 5)),
     E("cutlass_nn.rms_norm: argument 'input' must have size 4 in dimension 1 (features = weight.shape[0]), got shape [2, 5]")),
    ("rms_norm features of input 3-d", lambda: cutlass_nn.rms_norm(r(2, 3, 5), r(4)),
     E("cutlass_nn.rms_norm: argument 'input' must have size 4 in dimension 2 (features = weight.shape[0]), got shape [2, 3, 5]")),
    ("rms_norm_backward features of h", lambda: ops.rms_norm_backward(r(2, 5), None, r(2, 5), r(4), r(2), True),
     E("cutlass_nn.rms_norm_backward: argument 'h' must have size 4 in dimension 1 (features = weight.shape[0]), got shape [2, 5]")),
]


@pytest.mark.parametrize("fn,match", [pytest.param(*c[1:], id=c[0]) for c in NAME_CASES])
def test_errors_name_the_operator_and_argument_called(fn, match):
    with pytest.raises(RuntimeError, match=match):
        fn()


# ---- main-gradient buffers ------------------------------------------------------------------
MAIN_GRAD_CASES = [
    ("float16 buffer of a float32 weight", torch.float32, lambda: torch.zeros(3, 4, dtype=torch.float16),
     E("cutlass_nn._set_main_grad: argument 'buffer' must have dtype float32 (the dtype of 'weight'), got float16")),
    ("int buffer", torch.float32, lambda: torch.zeros(3, 4, dtype=torch.int32),
     E("cutlass_nn._set_main_grad: argument 'buffer' must have dtype float32 (the dtype of 'weight'), got int32")),
    ("float64 buffer of a bfloat16 weight", torch.bfloat16, lambda: torch.zeros(3, 4, dtype=torch.float64),
     E("cutlass_nn._set_main_grad: argument 'buffer' must have dtype bfloat16 (the dtype of 'weight') or float32, got float64")),
    ("meta buffer", torch.float32, lambda: meta(3, 4),
     E("cutlass_nn._set_main_grad: argument 'buffer' must be on device cpu (the device of 'weight'), got meta")),
    ("transposed buffer", torch.float32, lambda: torch.zeros(4, 3).t(),
     E("cutlass_nn._set_main_grad: argument 'buffer' must be contiguous (the weight-gradient GEMM adds into it in place), got strides [1, 3]")),
    ("buffer shape", torch.float32, lambda: torch.zeros(4, 3),
     E("cutlass_nn._set_main_grad: argument 'buffer' must have the shape of 'weight' [3, 4], got [4, 3]")),
]


@pytest.mark.parametrize("wdtype,make,match", [pytest.param(*c[1:], id=c[0]) for c in MAIN_GRAD_CASES])
def test_set_main_grad_checks_the_buffer(wdtype, make, match):
    w = torch.nn.Parameter(torch.zeros(3, 4, dtype=wdtype))
    with pytest.raises(RuntimeError, match=match):
        ops._set_main_grad(w, make())
    assert ops._main_grad(w) is None  # nothing registered


def test_set_main_grad_refuses_the_weight_itself():
    # the weight-gradient GEMM adds into the buffer: the weight's own memory would be changed
    w = torch.nn.Parameter(torch.randn(3, 4))
    before = w.detach().clone()
    with pytest.raises(RuntimeError, match=E("cutlass_nn._set_main_grad: argument 'buffer' must "
                                             "not share memory with 'weight'")):
        ops._set_main_grad(w, w.detach())
    assert ops._main_grad(w) is None
    assert torch.equal(w.detach(), before)


@pytest.mark.parametrize("wdtype,bdtype", [
    (torch.float32, torch.float32), (torch.float16, torch.float32), (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16), (torch.float64, torch.float64),
])
def test_set_main_grad_takes_the_buffers_the_gemms_add_into(wdtype, bdtype):
    w = torch.nn.Parameter(torch.zeros(3, 4, dtype=wdtype))
    buffer = torch.zeros(3, 4, dtype=bdtype)
    ops._set_main_grad(w, buffer)
    try:
        assert ops._main_grad(w) is buffer
    finally:
        ops._set_main_grad(w, None)


def test_set_main_grad_int_weight():
    w = torch.zeros(3, 4, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=E("cutlass_nn._set_main_grad: argument 'weight' must have a floating dtype (float16, bfloat16, float32 or float64), got int64")):
        ops._set_main_grad(w, torch.zeros(3, 4, dtype=torch.int64))


# ---- mixed devices and fake tensors ---------------------------------------------------------
# A call mixing cpu and meta tensors runs the Meta kernel (the fake implementation), which must
# check devices like the C++ checks do instead of returning uninitialized outputs, and name the
# operator called (gated_act_backward_, not gated_act_backward); and under FakeTensorMode every
# check gives the C++ check's message, shapes included.

LONG = torch.long
MIXED_DEVICE_CASES = [
    ("cross_entropy_rows_ row_scale on meta",
     lambda z: ops.cross_entropy_rows_(z, torch.tensor([0, 1]), meta(2), -100, 0.0, True),
     E("cutlass_nn.cross_entropy_rows_: argument 'row_scale' must be on device cpu (the device of 'logits'), got meta")),
    ("cross_entropy_rows_ target on meta",
     lambda z: ops.cross_entropy_rows_(z, torch.empty(2, dtype=LONG, device="meta"), None, -100, 0.0, True),
     E("cutlass_nn.cross_entropy_rows_: argument 'target' must be on device cpu (the device of 'logits'), got meta")),
    ("cross_entropy_rows_ logits on meta",
     lambda z: ops.cross_entropy_rows_(meta(2, 3), torch.tensor([0, 1]), None, -100, 0.0, True),
     E("cutlass_nn.cross_entropy_rows_: argument 'target' must be on device meta (the device of 'logits'), got cpu")),
    ("cross_entropy_rows_ logits and target on meta",
     lambda z: ops.cross_entropy_rows_(meta(2, 3), torch.empty(2, dtype=LONG, device="meta"), r(2), -100, 0.0, True),
     E("cutlass_nn.cross_entropy_rows_: argument 'row_scale' must be on device meta (the device of 'logits'), got cpu")),
    ("rms_norm_backward rstd on meta",
     lambda z: ops.rms_norm_backward(r(2, 3), None, r(2, 3), r(3), meta(2), True),
     E("cutlass_nn.rms_norm_backward: argument 'rstd' must be on device cpu (the device of 'h'), got meta")),
    ("rms_norm_backward h on meta",
     lambda z: ops.rms_norm_backward(r(2, 3), None, meta(2, 3), r(3), r(2), True),
     E("cutlass_nn.rms_norm_backward: argument 'grad_output' must be on device meta (the device of 'h'), got cpu")),
    ("rms_norm_backward grad_h on meta",
     lambda z: ops.rms_norm_backward(r(2, 3), meta(2, 3), r(2, 3), r(3), r(2), True),
     E("cutlass_nn.rms_norm_backward: argument 'grad_h' must be on device cpu (the device of 'h'), got meta")),
    ("gated_act_backward_ device (meta kernel)", lambda z: ops.gated_act_backward_(r(3, 2), meta(3, 4), "silu"),
     E("cutlass_nn.gated_act_backward_: argument 'grad_output' must be on device meta (the device of 'gate_up'), got cpu")),
    ("gated_act_backward_ activation (meta kernel)", lambda z: ops.gated_act_backward_(meta(3, 2), meta(3, 4), "relu"),
     E('cutlass_nn.gated_act_backward_: argument \'activation\' must be one of "silu", "gelu", "gelu_tanh", got "relu"')),
    ("gated_act_backward_ shape (meta kernel)", lambda z: ops.gated_act_backward_(meta(3, 3), meta(3, 4), "silu"),
     E("cutlass_nn.gated_act_backward_: argument 'grad_output' must have shape [3, 2] (that of 'gate_up' with the last dimension halved), got [3, 3]")),
]


@pytest.mark.parametrize("call,match", [pytest.param(*c[1:], id=c[0]) for c in MIXED_DEVICE_CASES])
def test_mixed_cpu_and_meta_arguments_are_refused(call, match):
    logits = r(2, 3)
    before = logits.clone()
    with pytest.raises(RuntimeError, match=match):
        call(logits)
    assert torch.equal(logits, before)


# (name, call): bad arguments whose eager (CPU) message the fake implementation must repeat
FAKE_PARITY_CASES = [
    ("linear_dgrad out_features", lambda: ops.linear_dgrad(r(3, 6), r(5, 4))),
    ("linear_dgrad 0-d", lambda: ops.linear_dgrad(r(), r(5, 4))),
    ("linear_dgrad weight rank", lambda: ops.linear_dgrad(r(3, 5), r(5))),
    ("linear_wgrad batch", lambda: ops.linear_wgrad(r(2, 5), r(3, 4))),
    ("linear_wgrad 0-d input", lambda: ops.linear_wgrad(r(3, 5), r())),
    ("linear in_features", lambda: ops.linear(r(3, 4), r(5, 6))),
    ("linear weight rank", lambda: ops.linear(r(3, 4), r(1, 5, 4))),
    ("linear bias size", lambda: ops.linear(r(3, 4), r(5, 4), r(4))),
    ("linear_act bias rank", lambda: ops.linear_act(r(3, 4), r(5, 4), r(1, 5), "relu")),
    ("accumulate grad_weight rows", lambda: ops.linear_wgrad_accumulate_(r(4, 5), r(3, 5), r(3, 4))),
    ("accumulate grad_weight rank", lambda: ops.linear_wgrad_accumulate_(r(5, 4, 1), r(3, 5), r(3, 4))),
    ("accumulate expanded grad_weight", lambda: ops.linear_wgrad_accumulate_(r(1, 4).expand(5, 4), r(3, 5), r(3, 4))),
    ("cross_entropy_rows_ vocab 0", lambda: ops.cross_entropy_rows_(r(3, 0), torch.zeros(3, dtype=LONG), None, -100, 0.0, True)),
    ("cross_entropy_rows_ 1-d logits", lambda: ops.cross_entropy_rows_(r(6), torch.zeros(6, dtype=LONG), None, -100, 0.0, True)),
    ("cross_entropy_rows_ expanded logits", lambda: ops.cross_entropy_rows_(r(1, 4).expand(3, 4), torch.zeros(3, dtype=LONG), None, -100, 0.0, True)),
    ("cross_entropy_rows_ target rows", lambda: ops.cross_entropy_rows_(r(3, 4), torch.zeros(2, dtype=LONG), None, -100, 0.0, True)),
    ("cross_entropy_rows_ target rank", lambda: ops.cross_entropy_rows_(r(3, 4), torch.zeros(3, 1, dtype=LONG), None, -100, 0.0, True)),
    ("cross_entropy_rows_ row_scale dtype", lambda: ops.cross_entropy_rows_(r(3, 4), torch.zeros(3, dtype=LONG), r(3).double(), -100, 0.0, True)),
    ("cross_entropy_rows_ row_scale rows", lambda: ops.cross_entropy_rows_(r(3, 4), torch.zeros(3, dtype=LONG), r(4), -100, 0.0, True)),
    ("cross_entropy_rows_ smoothing", lambda: ops.cross_entropy_rows_(r(3, 4), torch.zeros(3, dtype=LONG), None, -100, 1.5, True)),
    ("rms_norm features", lambda: ops.rms_norm(r(3, 4), r(5), 1e-6)),
    ("rms_norm weight rank", lambda: ops.rms_norm(r(3, 4), r(4, 1), 1e-6)),
    ("rms_norm eps", lambda: ops.rms_norm(r(3, 4), r(4), -1e-6)),
    ("rms_norm 0-d", lambda: ops.rms_norm(r(), r(1), 1e-6)),
    ("add_rms_norm residual shape", lambda: ops.add_rms_norm(r(3, 4), r(2, 4), r(4), 1e-6)),
    ("add_rms_norm features", lambda: ops.add_rms_norm(r(3, 4), r(3, 4), r(5), 1e-6)),
    ("rms_norm_backward rstd dtype", lambda: ops.rms_norm_backward(r(3, 4), None, r(3, 4), r(4), r(3).double(), True)),
    ("rms_norm_backward rstd shape", lambda: ops.rms_norm_backward(r(3, 4), None, r(3, 4), r(4), r(4), True)),
    ("rms_norm_backward features", lambda: ops.rms_norm_backward(r(3, 5), None, r(3, 5), r(4), r(3), True)),
    ("gated_act_backward_ shape", lambda: ops.gated_act_backward_(r(3, 3), r(3, 4), "silu")),
    ("gated_act_backward_ activation", lambda: ops.gated_act_backward_(r(3, 2), r(3, 4), "relu")),
    ("gated_act_backward_ expanded gate_up", lambda: ops.gated_act_backward_(r(3, 2), r(1, 4).expand(3, 4), "silu")),
    ("gated_act_backward_ odd gate_up", lambda: ops.gated_act_backward_(r(3, 2), r(3, 5), "silu")),
    ("gated_act_backward 0-d gate_up", lambda: ops.gated_act_backward(r(), r(), "silu")),
    ("scale_ expanded x", lambda: ops.scale_(r(1, 4).expand(3, 4), torch.tensor(2.0))),
    ("mm.out expanded out", lambda: ops.mm.out(r(5, 3), r(3, 4), out=r(1, 4).expand(5, 4))),
]


def _message(call) -> str:
    with pytest.raises(RuntimeError) as info:
        call()
    return str(info.value).splitlines()[0]


@pytest.mark.parametrize("call", [pytest.param(c[1], id=c[0]) for c in FAKE_PARITY_CASES])
def test_fake_implementations_give_the_eager_message(call):
    from torch._subclasses.fake_tensor import FakeTensorMode

    eager = _message(call)
    assert eager.startswith("cutlass_nn.")
    with FakeTensorMode():
        fake = _message(call)
    assert fake == eager


# ---- README's operator table ----------------------------------------------------------------
def _readme_operator_signatures():
    """`name(args)` of every row of README's "Operators" table (the registered schemas)."""
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = text[text.index("### Operators"):]
    table = table[: table.index("\n\n", table.index("| operator |"))]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    first_cells = [row.split(" | ")[0] for row in rows]
    return [sig for cell in first_cells for sig in re.findall(r"`([A-Za-z_0-9.]+\([^`]*\))`", cell)]


def _schema_signature(name: str) -> str:
    packet, _, overload = name.partition(".")
    schema = getattr(getattr(ops, packet), overload or "default")._schema
    args, kw_seen = [], False
    for a in schema.arguments:
        if a.kwarg_only and not kw_seen:
            args.append("*")
            kw_seen = True
        if a.default_value is None and not a.has_default_value():
            args.append(a.name)
        else:
            default = a.default_value
            args.append(f"{a.name}={default!r}" if not isinstance(default, str) else f'{a.name}="{default}"')
    return f"{name}({', '.join(args)})"


def test_readme_operator_table_matches_the_registered_schemas():
    """The operators' arguments and defaults as README documents them are the schemas'
    (cross_entropy_rows_ was documented with defaults its schema does not have)."""
    # (the private hooks, `_name` or `torch.ops.cutlass_nn._name`, are listed with fewer details)
    signatures = [s for s in _readme_operator_signatures() if not s.startswith(("_", "torch."))]
    assert len(signatures) >= 20, signatures
    for sig in signatures:
        assert sig == _schema_signature(sig[: sig.index("(")]), sig
