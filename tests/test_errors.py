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
