"""gated_act / gated_act_backward / gated_mlp on the CPU backend and the Python surface around
them: float64 reference, gradcheck and gradgradcheck, packed vs separate weights, argument
errors (same message as the C++ checks, fake implementations alike), opcheck, torch.compile,
autocast, the GatedMLP module as a drop-in for transformers' LlamaMLP (state_dict both ways, the
packed gate+up layout and what keeps it), activation recognition, and convert(fuse_mlp=True) on
transformers models. The CUDA kernels are tested in tests/test_cuda_gated_mlp.py."""

from __future__ import annotations

import copy
import functools
import logging
import pickle
import shutil

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import cutlass_nn
from cutlass_nn import GatedMLP
from cutlass_nn import functional as F

ops = torch.ops.cutlass_nn
ACTS = ["silu", "gelu", "gelu_tanh"]
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
TORCH_ACTS = {
    "silu": TF.silu,
    "gelu": TF.gelu,
    "gelu_tanh": functools.partial(TF.gelu, approximate="tanh"),
}


def _double(t):
    return None if t is None else t.double()


def ref_gated_act(gate_up, activation):
    """float64 act(gate) * up of the (already rounded) gate_up."""
    gate, up = _double(gate_up).chunk(2, dim=-1)
    return TORCH_ACTS[activation](gate) * up


def ref_gated_mlp(x, gate_w, up_w, down_w, gate_b=None, up_b=None, down_b=None, activation="silu"):
    """The gated MLP in float64 torch ops, from the given (rounded) tensors; no intermediate
    rounding, so a low-precision operator is compared with the exact result."""
    x = x.double()
    gate = TF.linear(x, gate_w.double(), _double(gate_b))
    up = TF.linear(x, up_w.double(), _double(up_b))
    return TF.linear(TORCH_ACTS[activation](gate) * up, down_w.double(), _double(down_b))


def rel_err(got, ref):
    """Largest error relative to the largest reference value (what one rounding of the output
    and of the intermediates bounds, also where single entries cancel to ~0)."""
    if ref.numel() == 0:
        return 0.0
    scale = ref.double().abs().max().clamp_min(1e-30)
    return ((got.double() - ref.double()).abs().max() / scale).item()


#: which of (gate_bias, up_bias, down_bias) are given
BIASES = {
    "nobias": (False, False, False),
    "bias": (True, True, True),
    "gate_up_bias": (True, True, False),
    "down_bias": (False, False, True),
}


def mlp_args(lead, k, n, out, dtype=torch.float64, bias=False, requires_grad=False, seed=0):
    """(input, gate_w, up_w, down_w, gate_b, up_b, down_b) with values of O(1) outputs; the gate
    and up weights as separate tensors. ``bias``: a bool (all three or none) or a BIASES key."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        t = (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
        return t.requires_grad_(requires_grad)

    x = rnd(*lead, k)
    gw, uw = rnd(n, k, scale=k**-0.5), rnd(n, k, scale=k**-0.5)
    dw = rnd(out, n, scale=n**-0.5)
    which = BIASES[bias] if isinstance(bias, str) else (bool(bias),) * 3
    biases = [rnd(size, scale=0.5) if on else None for size, on in zip((n, n, out), which)]
    return (x, gw, uw, dw, *biases)


def is_packed(module):
    """The layout GatedMLP keeps: up's weight directly after gate's in one contiguous storage
    (and the biases likewise, when there are biases)."""

    def adjacent(a, b):
        return (
            a.is_contiguous()
            and b.is_contiguous()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and b.storage_offset() == a.storage_offset() + a.numel()
        )

    gate, up = module.gate_proj, module.up_proj
    ok = adjacent(gate.weight, up.weight)
    if gate.bias is not None:
        ok = ok and adjacent(gate.bias, up.bias)
    return ok


def _transformers():
    return pytest.importorskip("transformers")


# ---- gated_act -------------------------------------------------------------------------------

GATE_UP_SHAPES = [(2,), (1, 2), (3, 8), (2, 5, 14), (0, 6), (4, 3, 0), (7, 130)]


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", GATE_UP_SHAPES, ids=str)
def test_gated_act_matches_float64_reference(shape, dtype, activation):
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[-1])
    gate_up = (2 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
    out = F.gated_act(gate_up, activation)
    assert out.dtype == dtype and out.shape == (*shape[:-1], shape[-1] // 2)
    assert out.is_contiguous()
    # computed in float (double for float64), rounded once
    assert rel_err(out, ref_gated_act(gate_up, activation)) <= 2 * torch.finfo(dtype).eps
    assert torch.equal(out, cutlass_nn.ops.gated_act(gate_up, activation))


def test_gated_act_default_activation_is_silu():
    gate_up = torch.randn(3, 10)
    assert torch.equal(F.gated_act(gate_up), F.gated_act(gate_up, "silu"))


def test_gated_act_of_a_non_contiguous_input():
    base = torch.randn(6, 20, dtype=torch.float64)
    gate_up = base[:, 2:18]  # rows with a stride of 20
    assert not gate_up.is_contiguous()
    torch.testing.assert_close(F.gated_act(gate_up, "gelu"), ref_gated_act(gate_up, "gelu"))
    gate_up_t = torch.randn(8, 5, dtype=torch.float64).t()  # [5, 8], column-major
    torch.testing.assert_close(F.gated_act(gate_up_t, "silu"), ref_gated_act(gate_up_t, "silu"))


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 2), (3, 8), (2, 5, 14), (0, 6)], ids=str)
def test_gated_act_backward_matches_float64_autograd(shape, dtype, activation):
    g = torch.Generator().manual_seed(shape[-1])
    gate_up = (2 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype)
    grad_out = torch.randn((*shape[:-1], shape[-1] // 2), generator=g, dtype=torch.float64).to(dtype)
    grad_gate_up, out = cutlass_nn.ops.gated_act_backward(grad_out, gate_up, activation)
    assert grad_gate_up.dtype == dtype and grad_gate_up.shape == gate_up.shape
    assert out.dtype == dtype and out.shape == grad_out.shape
    ref_in = gate_up.double().requires_grad_()
    (ref_grad,) = torch.autograd.grad(ref_gated_act(ref_in, activation), ref_in, grad_out.double())
    bound = 4 * torch.finfo(dtype).eps
    # each half on its own: the up half (grad_out * act(gate)) and the gate half differ in scale
    n = shape[-1] // 2
    assert rel_err(grad_gate_up[..., :n], ref_grad[..., :n]) <= bound
    assert rel_err(grad_gate_up[..., n:], ref_grad[..., n:]) <= bound
    # the recomputed forward is the forward (the gated MLP's backward uses it for down's
    # weight gradient)
    assert torch.equal(out, F.gated_act(gate_up, activation))


@pytest.mark.parametrize("activation", ACTS)
def test_gated_act_gradcheck_and_gradgradcheck(activation):
    g = torch.Generator().manual_seed(2)
    gate_up = torch.randn(3, 2, 10, dtype=torch.float64, generator=g, requires_grad=True)
    f = functools.partial(F.gated_act, activation=activation)
    assert torch.autograd.gradcheck(f, (gate_up,))
    assert torch.autograd.gradgradcheck(f, (gate_up,))


def test_gated_act_through_autograd_matches_the_backward_operator():
    gate_up = torch.randn(4, 12, requires_grad=True)
    grad_out = torch.randn(4, 6)
    F.gated_act(gate_up, "gelu_tanh").backward(grad_out)
    expected, _ = cutlass_nn.ops.gated_act_backward(grad_out, gate_up.detach(), "gelu_tanh")
    torch.testing.assert_close(gate_up.grad, expected, rtol=0, atol=0)


# ---- gated_mlp: forward ----------------------------------------------------------------------

# (leading dims, in, n, out): odd and even n, in from 1 to 70, 1-D / 2-D / 3-D input, empty
# batches, out != in
MLP_SHAPES = [
    ((), 9, 6, 4),
    ((3,), 1, 1, 1),
    ((1,), 16, 8, 16),
    ((2, 5), 7, 3, 5),
    ((0,), 8, 4, 8),
    ((2, 0, 3), 5, 2, 3),
    ((5,), 70, 33, 17),
    ((4, 3), 64, 128, 64),
]


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", MLP_SHAPES, ids=str)
def test_gated_mlp_matches_float64_reference(shape, dtype, activation, bias):
    lead, k, n, out_features = shape
    args = mlp_args(lead, k, n, out_features, dtype=dtype, bias=bias, seed=k * 7 + n)
    out = F.gated_mlp(*args, activation=activation)
    assert out.dtype == dtype and out.shape == (*lead, out_features)
    # the operator rounds the gate+up output, the gated activation and the output once each
    # (float accumulation): a few roundings of the dtype, relative to the largest output
    assert rel_err(out, ref_gated_mlp(*args, activation)) <= 8 * torch.finfo(dtype).eps
    assert torch.equal(out, cutlass_nn.ops.gated_mlp(*args, activation=activation))


def test_gated_mlp_default_activation_is_silu():
    args = mlp_args((3,), 8, 6, 8)
    torch.testing.assert_close(F.gated_mlp(*args), ref_gated_mlp(*args, activation="silu"))
    assert torch.equal(F.gated_mlp(*args), F.gated_mlp(*args, activation="silu"))


def test_gated_mlp_with_a_non_contiguous_input_and_weights():
    x, gw, uw, dw, *_ = mlp_args((4,), 6, 5, 3)
    x_nc = x.t().contiguous().t()  # same values, column-major
    gw_nc, dw_nc = gw.t().contiguous().t(), dw.t().contiguous().t()
    assert not (x_nc.is_contiguous() or gw_nc.is_contiguous() or dw_nc.is_contiguous())
    out = F.gated_mlp(x_nc, gw_nc, uw, dw_nc, activation="gelu")
    torch.testing.assert_close(out, ref_gated_mlp(x, gw, uw, dw, activation="gelu"))


def _weight_layouts(n, k, seed=0):
    """(name, gate_w, up_w) with the same values laid out in different ways: the operator reads
    the first without a copy; every other one must give the same result."""
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(n, k, generator=g, dtype=torch.float64).float()
    up = torch.randn(n, k, generator=g, dtype=torch.float64).float()
    packed = torch.cat((gate, up))
    up_first = torch.cat((up, gate))  # one storage, up directly before gate: not the layout
    gap = torch.cat((gate, torch.zeros(1, k), up))  # one row between them
    same = torch.cat((gate, gate))
    column_major = torch.cat((gate, up)).t().contiguous().t()  # one storage, transposed
    return [
        ("packed", packed[:n], packed[n:]),
        ("separate", gate.clone(), up.clone()),
        ("up_first", up_first[n:], up_first[:n]),
        ("gap", gap[:n], gap[n + 1 :]),
        ("column_major", column_major[:n], column_major[n:]),
        ("same_storage_gate_is_up", same[:n], same[:n]),
    ]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("n, k", [(5, 7), (8, 16), (1, 3)], ids=str)
def test_packed_and_unpacked_weights_give_identical_results(n, k, activation, bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, k, generator=g)
    dw = torch.randn(4, n, generator=g)
    biases = (torch.randn(n, generator=g), torch.randn(n, generator=g), torch.randn(4, generator=g))
    biases = biases if bias else (None, None, None)
    grad_out = torch.randn(3, 2, 4, generator=g)
    layouts = _weight_layouts(n, k)
    results = {}
    for name, gw, uw in layouts:
        gw_leaf, uw_leaf = nn.Parameter(gw), nn.Parameter(uw)  # aliasing the layout's storage
        xi = x.clone().requires_grad_()
        out = F.gated_mlp(xi, gw_leaf, uw_leaf, dw, *biases, activation)
        out.backward(grad_out)
        results[name] = (out.detach(), xi.grad, gw_leaf.grad, uw_leaf.grad)
    _, gate, up = layouts[1]
    ref = ref_gated_mlp(x, gate, up, dw, *biases, activation)
    assert rel_err(results["packed"][0], ref) <= 8 * torch.finfo(torch.float32).eps
    for name, got in results.items():
        if name == "same_storage_gate_is_up":
            continue  # other values (gate == up): compared below
        for a, b, what in zip(got, results["packed"], ("out", "x.grad", "gate.grad", "up.grad")):
            assert torch.equal(a, b), f"{name}: {what}"
    same = ref_gated_mlp(x, gate, gate, dw, *biases, activation)
    assert rel_err(results["same_storage_gate_is_up"][0], same) <= 8 * torch.finfo(torch.float32).eps


# ---- gated_mlp: autograd ---------------------------------------------------------------------


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("activation", ACTS)
def test_gated_mlp_gradcheck_and_gradgradcheck(activation, bias):
    args = mlp_args((2, 3), 5, 4, 3, bias=bias, requires_grad=True, seed=3)
    given = [a is not None for a in args]
    tensors = tuple(a for a in args if a is not None)

    def f(*ts):
        it = iter(ts)
        full = [next(it) if g else None for g in given]
        return F.gated_mlp(*full, activation=activation)

    assert torch.autograd.gradcheck(f, tensors)
    assert torch.autograd.gradgradcheck(f, tensors)


ARG_NAMES = ("input", "gate_weight", "up_weight", "down_weight", "gate_bias", "up_bias", "down_bias")


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("only", ARG_NAMES)
def test_gated_mlp_backward_when_only_one_argument_requires_grad(bias, only):
    """e.g. frozen gate and up projections: the backward computes just what is needed."""
    args = list(mlp_args((2, 3), 5, 4, 3, bias=bias, seed=5))
    i = ARG_NAMES.index(only)
    if args[i] is None:
        pytest.skip(f"no {only} in this configuration")
    args[i] = args[i].clone().requires_grad_()
    (got,) = torch.autograd.grad(F.gated_mlp(*args).sum(), args[i])
    ref_args = [a if j != i else a.detach().clone().requires_grad_() for j, a in enumerate(args)]
    (expected,) = torch.autograd.grad(ref_gated_mlp(*ref_args).sum(), ref_args[i])
    torch.testing.assert_close(got, expected)


def test_gated_mlp_gradcheck_with_packed_weights_and_some_inputs_without_grad():
    x, gw, uw, dw, *_ = mlp_args((4,), 6, 3, 2)
    buf = torch.cat((gw, uw)).requires_grad_()

    def f(buf_, dw_):
        return F.gated_mlp(x, buf_[:3], buf_[3:], dw_, activation="gelu")

    dw.requires_grad_()
    assert torch.autograd.gradcheck(f, (buf, dw))
    assert torch.autograd.gradgradcheck(f, (buf, dw))
    x.requires_grad_()
    assert torch.autograd.gradcheck(lambda x_: F.gated_mlp(x_, gw, uw, dw.detach()), (x,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gated_mlp_gradients_match_float64_reference(dtype):
    args = mlp_args((3, 5), 24, 20, 24, dtype=dtype, bias=True, requires_grad=True, seed=4)
    grad_out = torch.randn(3, 5, 24, dtype=torch.float64).to(dtype)
    out = F.gated_mlp(*args, activation="silu")
    grads = torch.autograd.grad(out, args, grad_out)
    ref_args = [a.detach().double().requires_grad_() for a in args]
    ref = ref_gated_mlp(*ref_args, activation="silu")
    ref_grads = torch.autograd.grad(ref, ref_args, grad_out.double())
    names = ("input", "gate_weight", "up_weight", "down_weight", "gate_bias", "up_bias", "down_bias")
    for name, got, expected in zip(names, grads, ref_grads):
        assert got.dtype == dtype and got.shape == expected.shape, name
        assert rel_err(got, expected) <= 16 * torch.finfo(dtype).eps, name


def test_gated_mlp_empty_batch_gradients_are_zeros():
    x, gw, uw, dw, gb, ub, db = mlp_args((0, 3), 6, 4, 5, dtype=torch.float32, bias=True,
                                         requires_grad=True)
    out = F.gated_mlp(x, gw, uw, dw, gb, ub, db)
    assert out.shape == (0, 3, 5)
    out.sum().backward()
    for t in (gw, uw, dw, gb, ub, db):
        assert torch.equal(t.grad, torch.zeros_like(t))
    assert x.grad.shape == x.shape


# ---- argument errors -------------------------------------------------------------------------


def _x(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype)


ERROR_CASES = [
    (lambda: ops.gated_act(_x(3, 5), "silu"),
     r"cutlass_nn\.gated_act: argument 'gate_up' must have an even last dimension"),
    (lambda: ops.gated_act(_x(3, 4), "relu"),
     r"cutlass_nn\.gated_act: argument 'activation' must be one of \"silu\", \"gelu\", \"gelu_tanh\""),
    (lambda: ops.gated_act(torch.ones(3, 4, dtype=torch.int32), "silu"),
     r"cutlass_nn\.gated_act: argument 'gate_up' must have a floating dtype"),
    (lambda: ops.gated_act(torch.tensor(1.0), "silu"),
     r"cutlass_nn\.gated_act: argument 'gate_up' must have at least 1 dimension"),
    (lambda: ops.gated_act_backward(_x(3, 3), _x(3, 4), "silu"),
     r"cutlass_nn\.gated_act_backward: argument 'grad_output' must have shape \[3, 2\]"),
    (lambda: ops.gated_act_backward(_x(3, 2, dtype=torch.float64), _x(3, 4), "silu"),
     r"cutlass_nn\.gated_act_backward: argument 'grad_output' must have dtype float32"),
    (lambda: ops.gated_act_backward(_x(3, 2), _x(3, 4), "none"),
     r"cutlass_nn\.gated_act_backward: argument 'activation' must be one of"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 4), _x(4, 3), activation="relu"),
     r"cutlass_nn\.gated_mlp: argument 'activation' must be one of"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(2, 4), _x(4, 3)),
     r"cutlass_nn\.gated_mlp: argument 'up_weight'"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 5), _x(4, 3)),
     r"cutlass_nn\.gated_mlp: argument 'up_weight'"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 4), _x(4, 2)),
     r"cutlass_nn\.gated_mlp: argument 'down_weight'"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 5), _x(3, 5), _x(4, 3)),
     r"cutlass_nn\.gated_mlp: argument '(gate_weight|input)'"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 4), _x(4, 3, 1)),
     r"cutlass_nn\.gated_mlp: argument 'down_weight'"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 4), _x(4, 3), _x(3), None),
     r"cutlass_nn\.gated_mlp: arguments? .*'gate_bias'.*'up_bias'"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 4), _x(4, 3), None, _x(3)),
     r"cutlass_nn\.gated_mlp: arguments? .*'gate_bias'.*'up_bias'"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 4), _x(4, 3), _x(3), _x(3), _x(3)),
     r"cutlass_nn\.gated_mlp: argument 'down_bias' must have size 4 in dimension 0 \(\[out\]\), got shape \[3\]"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4), _x(3, 4), _x(4, 3), _x(2), _x(2)),
     r"cutlass_nn\.gated_mlp: argument 'gate_bias' must have size 3 in dimension 0 \(\[n\]\), got shape \[2\]"),
    (lambda: ops.gated_mlp(torch.ones(2, 4, dtype=torch.int64), _x(3, 4), _x(3, 4), _x(4, 3)),
     r"cutlass_nn\.gated_mlp: argument 'input' must have a floating dtype"),
    (lambda: ops.gated_mlp(_x(2, 4), _x(3, 4, dtype=torch.float64), _x(3, 4), _x(4, 3)),
     r"cutlass_nn\.gated_mlp: argument 'gate_weight' must have dtype float32"),
    (lambda: ops.gated_mlp(torch.tensor(1.0), _x(3, 1), _x(3, 1), _x(4, 3)),
     r"cutlass_nn\.gated_mlp: argument 'input' must have at least 1 dimension"),
    # the internal gate+up operators gated_mlp runs its gate+up GEMMs through
    (lambda: ops._gate_up_linear(_x(2, 4), _x(3, 4), _x(2, 4)),
     r"cutlass_nn\._gate_up_linear: argument 'up_weight' must have the shape of 'gate_weight' \[3, 4\], got \[2, 4\]"),
    (lambda: ops._gate_up_linear(_x(2, 4), _x(3, 5), _x(3, 5)),
     r"cutlass_nn\._gate_up_linear: argument 'gate_weight' must have size 4 in dimension 1"),
    (lambda: ops._gate_up_linear(_x(2, 4), _x(3, 4), _x(3, 4), _x(3), None),
     r"cutlass_nn\._gate_up_linear: arguments 'gate_bias' and 'up_bias' must be given both or neither"),
    (lambda: ops._gate_up_linear(_x(2, 4), _x(3, 4), _x(3, 4), _x(2), _x(2)),
     r"cutlass_nn\._gate_up_linear: argument 'gate_bias' must have size 3"),
    (lambda: ops._gate_up_linear(_x(2, 4), _x(3, 4, dtype=torch.float64), _x(3, 4)),
     r"cutlass_nn\._gate_up_linear: argument 'gate_weight' must have dtype float32"),
    (lambda: ops._gate_up_linear(torch.ones(2, 4, dtype=torch.int64), _x(3, 4), _x(3, 4)),
     r"cutlass_nn\._gate_up_linear: argument 'input' must have a floating dtype"),
    (lambda: ops._gate_up_dgrad(_x(2, 5), _x(3, 4), _x(3, 4)),
     r"cutlass_nn\._gate_up_dgrad: argument 'grad_gate_up' must have last dimension 2n = 6 \(n = gate_weight.shape\[0\]\), got shape \[2, 5\]"),
    (lambda: ops._gate_up_dgrad(_x(2, 6), _x(3, 4), _x(3, 5)),
     r"cutlass_nn\._gate_up_dgrad: argument 'up_weight' must have the shape of 'gate_weight'"),
    (lambda: ops._gate_up_dgrad(_x(2, 6), _x(3, 4, 1), _x(3, 4, 1)),
     r"cutlass_nn\._gate_up_dgrad: argument 'gate_weight' must be a 2-D tensor \[n, in\], got a 3-D"),
    (lambda: ops._pack_gate_up(_x(3, 4), _x(3, 5), torch.bfloat16),
     r"cutlass_nn\._pack_gate_up: argument 'up' must have the shape of 'gate' \[3, 4\], got \[3, 5\]"),
    (lambda: ops._pack_gate_up(_x(3, 4), _x(3, 4, dtype=torch.float64), torch.bfloat16),
     r"cutlass_nn\._pack_gate_up: argument 'up' must have dtype float32 \(the dtype of 'gate'\), got float64"),
    (lambda: ops._pack_gate_up(_x(12), _x(12), torch.bfloat16),
     r"cutlass_nn\._pack_gate_up: argument 'gate' must be a 2-D tensor \[n, in\], got a 1-D"),
    (lambda: ops._pack_gate_up(_x(3, 4), _x(3, 4), torch.int32),
     r"cutlass_nn\._pack_gate_up: argument 'dtype' must be a floating dtype \(float16, bfloat16, float32 or float64\), got int32"),
    (lambda: ops._pack_gate_up(torch.ones(3, 4, dtype=torch.int64), torch.ones(3, 4, dtype=torch.int64), torch.float32),
     r"cutlass_nn\._pack_gate_up: argument 'gate' must have a floating dtype"),
    (lambda: ops._gate_up_dgrad(torch.tensor(1.0), _x(3, 4), _x(3, 4)),
     r"cutlass_nn\._gate_up_dgrad: argument 'grad_gate_up' must have at least 1 dimension"),
]


@pytest.mark.parametrize("call, message", ERROR_CASES)
def test_argument_errors_name_operator_and_argument(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("call, message", ERROR_CASES)
def test_fake_implementations_raise_like_eager(call, message):
    # the same message, word for word, as the C++ checks give for the same arguments
    from torch._subclasses.fake_tensor import FakeTensorMode

    with pytest.raises(RuntimeError) as eager:
        call()
    with FakeTensorMode(), pytest.raises(RuntimeError, match=message) as fake:
        call()
    assert str(fake.value).splitlines()[0] == str(eager.value).splitlines()[0]


def test_functional_forms_reject_a_non_string_activation_by_name():
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.gated_act: argument 'activation' must be one of"):
        F.gated_act(torch.randn(2, 4), None)
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.gated_mlp: argument 'activation' must be one of"):
        F.gated_mlp(*mlp_args((2,), 4, 3, 4), activation=1)


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = ops.gated_mlp(torch.empty(2, 3, 8), torch.empty(6, 8), torch.empty(6, 8),
                            torch.empty(5, 6))
        assert out.shape == (2, 3, 5)
        assert ops.gated_act(torch.empty(4, 10), "gelu").shape == (4, 5)
        grad, out = ops.gated_act_backward(torch.empty(4, 5), torch.empty(4, 10), "gelu")
        assert grad.shape == (4, 10) and out.shape == (4, 5)


# ---- opcheck, torch.compile, autocast ---------------------------------------------------------


def _opcheck_samples():
    samples = []
    for act in ACTS:
        for shape in ((3, 8), (2, 3, 6), (0, 4)):
            gate_up = torch.randn(shape, requires_grad=True)
            grad_out = torch.randn((*shape[:-1], shape[-1] // 2))
            samples.append(pytest.param("gated_act", (gate_up, act), id=f"gated_act-{act}-{list(shape)}"))
            samples.append(
                pytest.param("gated_act_backward", (grad_out, gate_up.detach(), act),
                             id=f"gated_act_backward-{act}-{list(shape)}")
            )
        for lead, bias in (((4,), False), ((2, 3), True), ((0,), True)):
            args = mlp_args(lead, 6, 5, 4, dtype=torch.float32, bias=bias, requires_grad=True)
            samples.append(
                pytest.param("gated_mlp", (*args, act), id=f"gated_mlp-{act}-{list(lead)}-{bias}")
            )
    x, gw, uw, dw, *_ = mlp_args((3,), 6, 5, 4, dtype=torch.float32)
    buf = torch.cat((gw, uw)).requires_grad_()
    samples.append(pytest.param("gated_mlp", (x, buf[:5], buf[5:], dw, None, None, None, "silu"),
                                id="gated_mlp-packed"))
    b = torch.randn(10)
    for name, (g, u) in (("packed", (buf.detach()[:5], buf.detach()[5:])), ("separate", (gw, uw))):
        samples.append(pytest.param("_gate_up_linear", (x, g, u), id=f"_gate_up_linear-{name}"))
        samples.append(pytest.param("_gate_up_linear", (x, g, u, b[:5], b[5:]),
                                    id=f"_gate_up_linear-{name}-bias"))
        samples.append(pytest.param("_gate_up_dgrad", (torch.randn(2, 3, 10), g, u),
                                    id=f"_gate_up_dgrad-{name}"))
    for dtype in (torch.bfloat16, torch.float32, torch.float64):
        samples.append(pytest.param(
            "_pack_gate_up", (torch.randn(5, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True), dtype),
            id=f"_pack_gate_up-{dtype}"))
    return samples


@pytest.mark.parametrize("op, args", _opcheck_samples())
def test_opcheck(op, args):
    torch.library.opcheck(getattr(ops, op).default, args)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_gate_up_operators_are_linear_over_the_joined_weights(packed, bias):
    # float64: the GEMM over the weights' own storage (packed) and over their concatenation
    # (separate) must both give exactly linear / linear_dgrad over torch.cat
    gen = torch.Generator().manual_seed(3)
    n, k = 5, 7
    x = torch.randn(2, 3, k, dtype=torch.float64, generator=gen)
    buf = torch.randn(2 * n, k, dtype=torch.float64, generator=gen)
    g, u = (buf[:n], buf[n:]) if packed else (buf[:n].clone(), buf[n:].clone())
    gb, ub = (torch.randn(n, dtype=torch.float64, generator=gen) for _ in range(2))
    biases = (gb, ub) if bias else (None, None)
    joined_bias = torch.cat((gb, ub)) if bias else None
    before = [t.clone() for t in (x, g, u)]
    out = ops._gate_up_linear(x, g, u, *biases)
    assert torch.equal(out, ops.linear(x, torch.cat((g, u)), joined_bias))
    torch.testing.assert_close(out, TF.linear(x, torch.cat((g, u)), joined_bias))
    grad = torch.randn(2, 3, 2 * n, dtype=torch.float64, generator=gen)
    dgrad = ops._gate_up_dgrad(grad, g, u)
    assert torch.equal(dgrad, ops.linear_dgrad(grad, torch.cat((g, u))))
    torch.testing.assert_close(dgrad, grad @ torch.cat((g, u)))
    assert all(torch.equal(a, b) for a, b in zip((x, g, u), before))  # inputs untouched


def test_gate_up_operators_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        w = torch.empty(6, 8)
        assert ops._gate_up_linear(torch.empty(2, 3, 8), w, w).shape == (2, 3, 12)
        assert ops._gate_up_dgrad(torch.empty(2, 3, 12), w, w).shape == (2, 3, 8)


@pytest.mark.parametrize("op", ["_gate_up_linear", "_gate_up_dgrad"])
def test_gate_up_operators_refuse_inputs_that_require_grad(op):
    # no backward of their own: refused by name, where the dispatcher's fallback would have
    # given packed weights' up half no gradient
    buf = torch.randn(10, 4, requires_grad=True)
    x = torch.randn(3, 4 if op == "_gate_up_linear" else 10)
    call = getattr(ops, op)
    with pytest.raises(RuntimeError, match=rf"cutlass_nn\.{op}: an internal operator of gated_mlp, not differentiable"):
        call(x, buf[:5], buf[5:])
    with torch.no_grad():  # without a node to record they run
        assert call(x, buf[:5], buf[5:]).shape[-1] == (10 if op == "_gate_up_linear" else 4)
    assert call(x, buf.detach()[:5], buf.detach()[5:]).requires_grad is False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_pack_gate_up_casts_into_one_buffer_and_gives_each_weight_its_gradient(dtype):
    gate = torch.randn(5, 7, requires_grad=True)
    up = torch.randn(5, 7, requires_grad=True)
    packed = ops._pack_gate_up(gate, up, dtype)
    assert packed.dtype == dtype and packed.shape == (10, 7) and packed.is_contiguous()
    assert torch.equal(packed, torch.cat((gate, up)).to(dtype))
    grad = torch.randn(10, 7).to(dtype)
    packed.backward(grad)
    assert gate.grad.dtype == up.grad.dtype == torch.float32
    assert torch.equal(gate.grad, grad[:5].float()) and torch.equal(up.grad, grad[5:].float())


def test_pack_gate_up_gradcheck_and_gradgradcheck():
    gate = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    up = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    f = lambda g, u: ops._pack_gate_up(g, u, torch.float64)  # noqa: E731
    assert torch.autograd.gradcheck(f, (gate, up))
    assert torch.autograd.gradgradcheck(f, (gate, up))


def _aot_recording_backend(graphs):
    """A torch.compile backend that runs AOTAutograd and keeps its forward and backward graphs
    in ``graphs`` (they then run as traced, without Inductor)."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified

    def keep(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    return backend


def _aot_graphs(module, x):
    """The forward and backward graphs AOTAutograd traces for module(x) (fullgraph)."""
    import torch._dynamo as dynamo

    graphs = []
    dynamo.reset()
    y = torch.compile(module, backend=_aot_recording_backend(graphs), fullgraph=True)(x)
    y.sum().backward()
    return graphs


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_compiled_gated_mlp_copies_no_weight(bias):
    # Traced through gated_mlp's autograd, the gate+up GEMM used to be recorded as a cat of the two
    # weights (a copy of both per layer, kept for the backward's input gradient); now the graphs
    # call the gate+up operators, which take the packed weights' storage as it is when they run.
    torch.manual_seed(0)
    module = GatedMLP(16, 24, activation="silu", bias=bias)
    x = torch.randn(2, 3, 16, requires_grad=True)
    graphs = _aot_graphs(module, x)
    assert len(graphs) == 2  # forward, backward
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if "cat" in t], targets
    assert sum("_gate_up_linear" in t for t in targets) == 1, targets
    assert sum("_gate_up_dgrad" in t for t in targets) == 1, targets
    module.zero_grad(set_to_none=True)
    ref = copy.deepcopy(module)
    x2 = torch.randn(2, 3, 16)
    got = _fwd_bwd(torch.compile(module, fullgraph=True), module, x2)
    want = _fwd_bwd(ref, ref, x2)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
def test_compiled_autocast_step_copies_no_weight(packed):
    # float32 weights under autocast: the traced graphs cast gate and up into one buffer
    # (_pack_gate_up) whose halves the gate+up operators then read as one operand when the graph
    # runs: no concatenation at run time, forward or backward (separately cast, each operator
    # concatenated them), and the step is eager autocast's
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    mlp = GatedMLP(16, 24, activation="silu")
    if not packed:  # the weights in separate storages: the cast packs them all the same
        mlp.gate_proj.weight.data = mlp.gate_proj.weight.data.clone()
    x = torch.randn(2, 3, 16)

    def run(fn):
        xx = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(xx)
        y.float().sum().backward()
        grads = [xx.grad] + [p.grad for p in mlp.parameters()]
        mlp.zero_grad(set_to_none=True)
        return [y.detach()] + grads

    import torch._dynamo as dynamo

    graphs = []
    dynamo.reset()
    compiled = torch.compile(mlp, backend=_aot_recording_backend(graphs), fullgraph=True)
    run(compiled)
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert sum("_pack_gate_up" in t for t in targets) == 1, targets
    assert not [t for t in targets if "aten.cat" in t], targets
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        got = run(compiled)

    def under_gate_up_operator(event):
        while event is not None:
            if event.name.startswith("cutlass_nn::_gate_up_"):
                return True
            event = event.cpu_parent
        return False

    # (the CPU kernel of gated_act_backward assembles its [*, 2n] result with a cat of its own;
    # what must not happen is a concatenation of the weights by the gate+up operators)
    cats = [e for e in prof.events() if e.name == "aten::cat"]
    assert not [e for e in cats if under_gate_up_operator(e)]
    assert {e.name for e in prof.events()} >= {"cutlass_nn::_gate_up_linear",
                                               "cutlass_nn::_gate_up_dgrad"}
    want = run(mlp)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


class _GraphRecorder:
    """A torch.compile backend that keeps the FX graphs dynamo hands it."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def _fwd_bwd(fn, module, x):
    x = x.clone().requires_grad_()
    y = fn(x)
    y.backward(torch.cos(y.detach()))
    return [y.detach(), x.grad] + [p.grad.clone() for p in module.parameters()]


def test_compile_fullgraph_traces_one_gated_mlp_op():
    import torch._dynamo

    torch._dynamo.reset()
    backend = _GraphRecorder()
    torch.manual_seed(0)
    module = GatedMLP(16, 24, activation="gelu_tanh", bias=True)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(torch.compile(module, backend=backend, fullgraph=True)(x), module(x))
    assert len(backend.graphs) == 1
    targets = [str(n.target) for n in backend.graphs[0].graph.nodes if n.op == "call_function"]
    assert sum("cutlass_nn.gated_mlp" in t for t in targets) == 1, targets


@pytest.mark.parametrize(
    "backend, activation, bias",
    [
        ("aot_eager", "silu", False),  # LlamaMLP's configuration: every default argument
        ("aot_eager", "gelu_tanh", True),
        pytest.param("inductor", "silu", True, marks=pytest.mark.slow),
    ],
)
def test_compile_fullgraph_forward_and_backward_match_eager(backend, activation, bias):
    import torch._dynamo

    if backend == "inductor" and not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        pytest.skip("inductor's CPU backend needs a C++ compiler")
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = GatedMLP(16, 24, activation=activation, bias=bias)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, backend=backend)
    x = torch.randn(4, 5, 16)
    got = _fwd_bwd(compiled, compiled_model, x)
    expected = _fwd_bwd(eager, eager, x)
    assert len(got) == 2 + (6 if bias else 3)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e)


def test_autocast_bfloat16_on_cpu():
    transformers = _transformers()
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, hidden_act="silu",
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    stock = transformers.models.llama.modeling_llama.LlamaMLP(cfg)
    ours = GatedMLP.from_module(copy.deepcopy(stock))
    x = torch.randn(3, 7, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ours(x)
        y_stock = stock(x)
    assert y.dtype == torch.bfloat16
    # both sides round to bfloat16 at different points: a few bfloat16 steps apart
    assert rel_err(y, y_stock) <= 8 * torch.finfo(torch.bfloat16).eps
    y.float().pow(2).sum().backward()
    y_stock.float().pow(2).sum().backward()
    for (name, p), q in zip(stock.named_parameters(), ours.parameters()):
        assert q.grad.dtype == torch.float32, name
        assert rel_err(q.grad, p.grad) <= 16 * torch.finfo(torch.bfloat16).eps, name


def test_autocast_leaves_float64_alone():
    args = mlp_args((3,), 8, 6, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.gated_mlp(*args)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref_gated_mlp(*args))


# ---- the GatedMLP module ---------------------------------------------------------------------


def _llama_mlp(hidden=24, intermediate=40, bias=False, act="silu", seed=0):
    transformers = _transformers()
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate,
                                   hidden_act=act, mlp_bias=bias, num_attention_heads=2,
                                   num_key_value_heads=1)
    torch.manual_seed(seed)
    mlp = transformers.models.llama.modeling_llama.LlamaMLP(cfg)
    if bias:
        with torch.no_grad():
            for p in mlp.parameters():
                if p.dim() == 1:
                    p.normal_()  # sizeable biases: a bias on the wrong path would show
    return mlp


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_module_is_a_drop_in_for_llama_mlp(bias):
    stock = _llama_mlp(bias=bias)
    ours = GatedMLP(24, 40, bias=bias)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in stock.state_dict().items()
    }
    assert list(ours.state_dict()) == list(stock.state_dict())
    ours.load_state_dict(stock.state_dict(), strict=True)
    assert is_packed(ours)
    x = torch.randn(3, 5, 24, dtype=torch.float64).float()
    y_stock, y = stock(x), ours(x)
    torch.testing.assert_close(y, y_stock, rtol=1e-5, atol=1e-6)
    grad_out = torch.randn_like(y)
    y_stock.backward(grad_out)
    y.backward(grad_out)
    for (name, p), (name2, q) in zip(stock.named_parameters(), ours.named_parameters()):
        assert name == name2
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5, msg=name)
    # and back, strictly
    other = _llama_mlp(bias=bias, seed=1)
    other.load_state_dict(ours.state_dict(), strict=True)
    torch.testing.assert_close(other(x), y_stock, rtol=1e-5, atol=1e-6)


def test_module_initialization_is_llama_mlps_under_the_same_seed():
    stock = _llama_mlp(bias=True, seed=5)  # biases overwritten there: compare the weights
    torch.manual_seed(5)
    ours = GatedMLP(24, 40, bias=True)
    for name, p in stock.named_parameters():
        if name.endswith("weight"):
            assert torch.equal(ours.get_parameter(name), p), name


def test_module_attributes_and_repr():
    m = GatedMLP(8, 12, activation="gelu", bias=True, dtype=torch.float64)
    assert (m.hidden_size, m.intermediate_size, m.activation) == (8, 12, "gelu")
    assert all(isinstance(getattr(m, n), cutlass_nn.CutlassLinear)
               for n in ("gate_proj", "up_proj", "down_proj"))
    assert m.gate_proj.weight.dtype == torch.float64
    assert repr(m).startswith(
        "GatedMLP(\n  hidden_size=8, intermediate_size=12, activation='gelu', bias=True\n"
        "  (gate_proj): CutlassLinear(in_features=8, out_features=12, bias=True)"
    )
    assert "bias=False" in repr(GatedMLP(4, 4))
    assert GatedMLP(4, 4).activation == "silu"


@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_module_forward_is_the_formula(activation, bias):
    torch.manual_seed(0)
    m = GatedMLP(10, 14, activation=activation, bias=bias, dtype=torch.float64)
    x = torch.randn(2, 3, 10, dtype=torch.float64)
    g, u, d = m.gate_proj, m.up_proj, m.down_proj
    torch.testing.assert_close(m(x), d(TORCH_ACTS[activation](g(x)) * u(x)))


@pytest.mark.parametrize(
    "activation, error, message",
    [
        ("relu", ValueError, r"cutlass_nn\.GatedMLP: argument 'activation' must be one of \"silu\""),
        ("none", ValueError, r"cutlass_nn\.GatedMLP: argument 'activation'"),
        (None, TypeError, r"cutlass_nn\.GatedMLP: argument 'activation' must be a string"),
        (nn.SiLU(), TypeError, r"cutlass_nn\.GatedMLP: argument 'activation' must be a string"),
    ],
)
def test_module_rejects_an_unknown_activation_before_allocating(monkeypatch, activation, error,
                                                                 message):
    def no_allocation(*args, **kwargs):
        raise AssertionError("allocated parameters before checking the activation")

    monkeypatch.setattr(cutlass_nn.modules.CutlassLinear, "__init__", no_allocation)
    with pytest.raises(error, match=message):
        GatedMLP(8, 16, activation=activation)


def test_hooks_on_the_projections_are_honoured():
    torch.manual_seed(0)
    m = GatedMLP(6, 8, dtype=torch.float64)
    x = torch.randn(4, 6, dtype=torch.float64)
    fused = m(x)
    seen = []
    handle = m.down_proj.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape))
    torch.testing.assert_close(m(x), fused)
    assert seen == [torch.Size([4, 8])]
    handle.remove()
    scaled = m.up_proj.register_forward_hook(lambda mod, args, out: out * 2)
    gate, up = TF.linear(x, m.gate_proj.weight), TF.linear(x, m.up_proj.weight)
    torch.testing.assert_close(m(x), TF.linear(TF.silu(gate) * 2 * up, m.down_proj.weight))
    scaled.remove()


def test_a_replaced_projection_is_called():
    torch.manual_seed(0)
    m = GatedMLP(6, 8, dtype=torch.float64)
    m.down_proj = nn.Sequential(m.down_proj, nn.Tanh())  # e.g. a wrapper added later
    x = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(
        m(x), torch.tanh(TF.linear(TF.silu(m.gate_proj(x)) * m.up_proj(x), m.down_proj[0].weight))
    )


# ---- packing ---------------------------------------------------------------------------------


def _param_ids(module):
    return [id(p) for p in module.parameters()]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_packed_after_construction(bias):
    m = GatedMLP(8, 12, bias=bias)
    assert is_packed(m)
    assert m.gate_proj.weight.untyped_storage().nbytes() == 2 * 12 * 8 * 4
    assert m.gate_proj.weight.requires_grad and m.up_proj.weight.requires_grad
    assert isinstance(m.gate_proj.weight, nn.Parameter)


@pytest.mark.parametrize("conversion", ["double", "half", "to_float64", "to_bfloat16_cpu"])
def test_packing_survives_dtype_conversion_with_the_same_parameters(conversion):
    m = GatedMLP(8, 12, bias=True)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    ids = _param_ids(m)
    if conversion == "double":
        m.double()
        dtype = torch.float64
    elif conversion == "half":
        m.half()
        dtype = torch.float16
    elif conversion == "to_float64":
        m.to(torch.float64)
        dtype = torch.float64
    else:
        m.to("cpu", torch.bfloat16)
        dtype = torch.bfloat16
    assert _param_ids(m) == ids
    assert is_packed(m)
    for n, p in m.named_parameters():
        assert p.dtype == dtype
        assert torch.equal(p, before[n].to(dtype)), n


def test_packing_survives_conversion_inside_a_parent_model():
    model = nn.Sequential(nn.Linear(4, 8), GatedMLP(8, 12))
    model.to(torch.float64)
    assert is_packed(model[1]) and model[1].gate_proj.weight.dtype == torch.float64


def test_to_without_a_change_keeps_the_storage():
    m = GatedMLP(8, 12)
    ptr = m.gate_proj.weight.data_ptr()
    m.to(torch.float32)
    m.float()
    assert m.gate_proj.weight.data_ptr() == ptr and is_packed(m)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_packing_survives_deepcopy_and_pickle(bias):
    torch.manual_seed(0)
    m = GatedMLP(8, 12, bias=bias)
    x = torch.randn(3, 8)
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert is_packed(clone)
        assert clone.gate_proj.weight.data_ptr() != m.gate_proj.weight.data_ptr()
        torch.testing.assert_close(clone(x), m(x), rtol=0, atol=0)
        clone.load_state_dict(GatedMLP(8, 12, bias=bias).state_dict())  # still an independent copy
        assert is_packed(clone) and is_packed(m)


def test_packing_survives_load_state_dict():
    m = GatedMLP(8, 12, bias=True)
    ids = _param_ids(m)
    ptr = m.gate_proj.weight.data_ptr()
    source = GatedMLP(8, 12, bias=True).state_dict()
    m.load_state_dict(source)  # copies into the parameters
    assert _param_ids(m) == ids and m.gate_proj.weight.data_ptr() == ptr and is_packed(m)
    for n, t in source.items():
        assert torch.equal(m.state_dict()[n], t)
    # assign=True puts the state_dict's tensors in place: packed again (values unchanged)
    separate = {n: t.clone() for n, t in GatedMLP(8, 12, bias=True).state_dict().items()}
    m.load_state_dict(separate, assign=True)
    assert is_packed(m)
    for n, t in separate.items():
        assert torch.equal(m.state_dict()[n], t)
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in m.parameters())


def test_packing_after_materializing_from_meta():
    m = GatedMLP(8, 12, bias=True, device="meta")
    assert m.gate_proj.weight.is_meta
    m.to_empty(device="cpu")
    assert is_packed(m) and m.gate_proj.weight.device.type == "cpu"


def test_packing_survives_optimizer_steps():
    torch.manual_seed(0)
    m = GatedMLP(8, 12, bias=True)
    ids = _param_ids(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(2):
        m(torch.randn(4, 8)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    assert is_packed(m) and _param_ids(m) == ids


def test_state_dict_saves_and_loads_with_torch_and_safetensors(tmp_path):
    torch.manual_seed(0)
    m = GatedMLP(8, 12, bias=True)
    torch.save(m.state_dict(), tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt")
    assert set(loaded) == set(m.state_dict())
    for n, t in m.state_dict().items():
        assert torch.equal(loaded[n], t)
    safetensors_torch = pytest.importorskip("safetensors.torch")
    safetensors_torch.save_file(m.state_dict(), tmp_path / "m.safetensors")
    fresh = GatedMLP(8, 12, bias=True)
    fresh.load_state_dict(safetensors_torch.load_file(tmp_path / "m.safetensors"), strict=True)
    assert is_packed(fresh)
    x = torch.randn(2, 8)
    torch.testing.assert_close(fresh(x), m(x), rtol=0, atol=0)


# ---- from_module and the activations it recognizes -------------------------------------------


class SourceMLP(nn.Module):
    """The transformers gated MLP formula, with a free act_fn."""

    def __init__(self, act_fn, hidden=12, n=20, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, n, bias=bias, dtype=torch.float64)
        self.up_proj = nn.Linear(hidden, n, bias=bias, dtype=torch.float64)
        self.down_proj = nn.Linear(n, hidden, bias=bias, dtype=torch.float64)
        self.act_fn = act_fn

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _recognized_act_fns():
    cases = [
        ("nn.SiLU", lambda: nn.SiLU(), "silu"),
        ("F.silu", lambda: TF.silu, "silu"),
        ("nn.GELU", lambda: nn.GELU(), "gelu"),
        ("F.gelu", lambda: TF.gelu, "gelu"),
        ("nn.GELU-tanh", lambda: nn.GELU(approximate="tanh"), "gelu_tanh"),
    ]
    for key, act in [
        ("silu", "silu"),
        ("swish", "silu"),
        ("gelu", "gelu"),
        ("gelu_python", "gelu"),
        ("gelu_pytorch_tanh", "gelu_tanh"),
        ("gelu_python_tanh", "gelu_tanh"),
        ("gelu_new", "gelu_tanh"),
    ]:
        cases.append((f"ACT2FN[{key}]", functools.partial(_act2fn, key), act))
    return [pytest.param(make, act, id=name) for name, make, act in cases]


def _act2fn(key):
    return _transformers().activations.ACT2FN[key]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("make_act_fn, activation", _recognized_act_fns())
def test_from_module_reads_the_activation_and_computes_what_the_module_does(
    make_act_fn, activation, bias
):
    torch.manual_seed(0)
    source = SourceMLP(make_act_fn(), bias=bias)
    x = torch.randn(3, 4, 12, dtype=torch.float64)
    expected = source(x)
    ids = _param_ids(source)
    ours = GatedMLP.from_module(source)
    assert ours.activation == activation
    assert _param_ids(ours) == ids  # the Parameter objects themselves, not copies
    assert is_packed(ours) and is_packed(source)  # the source now uses the packed buffer too
    torch.testing.assert_close(ours(x), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(source(x), expected, rtol=0, atol=0)


def test_from_module_of_a_transformers_llama_mlp_shares_parameters():
    stock = _llama_mlp(bias=True)
    x = torch.randn(2, 24)
    expected = stock(x)
    ours = GatedMLP.from_module(stock)
    for name, p in stock.named_parameters():
        assert ours.get_parameter(name) is p, name
    assert (ours.hidden_size, ours.intermediate_size, ours.activation) == (24, 40, "silu")
    torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-6)


def test_from_module_with_an_explicit_activation():
    source = SourceMLP(nn.Identity())  # not recognized, but the caller says what it is
    assert GatedMLP.from_module(source, activation="gelu").activation == "gelu"
    with pytest.raises(ValueError, match=r"cutlass_nn\.GatedMLP\.from_module: argument 'activation'"):
        GatedMLP.from_module(source, activation="relu")


def test_from_module_carries_training_mode_and_hooks():
    source = SourceMLP(nn.SiLU()).eval()
    source.up_proj.train()
    calls = []
    source.register_forward_hook(lambda mod, args, out: calls.append("mlp"))
    source.register_forward_pre_hook(lambda mod, args: calls.append("pre"))
    ours = GatedMLP.from_module(source)
    assert not ours.training and not ours.gate_proj.training and ours.up_proj.training
    ours(torch.randn(2, 12, dtype=torch.float64))
    assert calls == ["pre", "mlp"]


def _unrecognized_act_fns():
    cases = [
        ("nn.ReLU", lambda: nn.ReLU(), "ReLU"),
        ("nn.Tanh", lambda: nn.Tanh(), "Tanh"),
        ("lambda", lambda: (lambda t: TF.silu(t)), "function"),
        ("missing", lambda: None, "NoneType"),
    ]
    for key, name in [("gelu_fast", "FastGELUActivation"), ("quick_gelu", "QuickGELUActivation"),
                      ("gelu_10", "ClippedGELUActivation"), ("relu", "ReLU")]:
        cases.append((f"ACT2FN[{key}]", functools.partial(_act2fn, key), name))
    return [pytest.param(make, name, id=label) for label, make, name in cases]


@pytest.mark.parametrize("make_act_fn, type_name", _unrecognized_act_fns())
def test_from_module_rejects_an_unknown_activation_naming_its_type(make_act_fn, type_name):
    source = SourceMLP(make_act_fn())
    with pytest.raises(TypeError, match=rf"cutlass_nn\.GatedMLP\.from_module: .*act_fn.*{type_name}"):
        GatedMLP.from_module(source)


def test_from_module_checks_what_transformers_activations_really_compute():
    transformers = _transformers()
    act = transformers.activations.GELUActivation()
    act.act = TF.silu  # not a gelu any more
    with pytest.raises(TypeError, match="GELUActivation"):
        GatedMLP.from_module(SourceMLP(act))
    tanh = transformers.activations.GELUTanh()
    tanh.act = TF.gelu  # the exact gelu: not what its name says
    with pytest.raises(TypeError, match="GELUTanh"):
        GatedMLP.from_module(SourceMLP(tanh))

    class MyGELU(transformers.activations.GELUActivation):  # a subclass may change the forward
        def forward(self, x):
            return super().forward(x) * 2

    with pytest.raises(TypeError, match="MyGELU"):
        GatedMLP.from_module(SourceMLP(MyGELU()))


def test_from_module_rejects_other_structures():
    with pytest.raises(TypeError, match=r"cutlass_nn\.GatedMLP\.from_module: argument 'mlp' must have an nn\.Linear 'gate_proj'"):
        GatedMLP.from_module(nn.Sequential(nn.Linear(2, 2)))
    lora_like = SourceMLP(nn.SiLU())
    lora_like.up_proj = nn.Sequential(nn.Linear(12, 20))
    with pytest.raises(TypeError, match=r"argument 'mlp' must have an nn\.Linear 'up_proj'"):
        GatedMLP.from_module(lora_like)
    with_act = SourceMLP(nn.SiLU())
    with_act.down_proj = cutlass_nn.CutlassLinear(20, 12, activation="relu")
    with pytest.raises(TypeError, match=r"'down_proj'"):
        GatedMLP.from_module(with_act)
    bad_shape = SourceMLP(nn.SiLU())
    bad_shape.up_proj = nn.Linear(12, 21)
    with pytest.raises(TypeError, match=r"must have gate_proj and up_proj of shape \[n, hidden\]"):
        GatedMLP.from_module(bad_shape)
    mixed_bias = SourceMLP(nn.SiLU(), bias=True)
    mixed_bias.down_proj = nn.Linear(20, 12, bias=False)
    with pytest.raises(TypeError, match=r"must have a bias on all of .* or on none"):
        GatedMLP.from_module(mixed_bias)
    with pytest.raises(TypeError, match=r"argument 'mlp' must be an nn\.Module"):
        GatedMLP.from_module("mlp")


def test_from_module_takes_already_converted_projections():
    source = SourceMLP(nn.SiLU())
    cutlass_nn.convert(source)  # gate/up/down are now CutlassLinear
    ours = GatedMLP.from_module(source)
    assert ours.gate_proj.weight is source.gate_proj.weight and is_packed(ours)


# ---- convert(fuse_mlp=True) ------------------------------------------------------------------


def _tiny_llama(seed=0, **overrides):
    transformers = _transformers()
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128)
    cfg.update(overrides)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))


def _ids():
    return torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))


def _count(model, kind):
    return sum(type(m) is kind for m in model.modules())


def test_convert_fuse_mlp_on_a_transformers_llama(caplog):
    stock = _tiny_llama()
    ours = _tiny_llama()
    ours.load_state_dict(stock.state_dict())
    ids = _ids()
    with torch.no_grad():
        before = ours(input_ids=ids).logits
    names = []

    def accept_all(name, module):
        names.append(name)
        return True

    with caplog.at_level(logging.INFO, logger="cutlass_nn.convert"):
        assert cutlass_nn.convert(ours, accept_all, fuse_mlp=True) is ours
    mlps = [ours.model.layers[i].mlp for i in range(2)]
    assert all(type(m) is GatedMLP and m.activation == "silu" and is_packed(m) for m in mlps)
    # 4 attention projections per layer and lm_head, plus the 3 projections of each GatedMLP;
    # the replaced MLPs' own projections were not converted (nor offered to filter_fn) again
    assert _count(ours, GatedMLP) == 2 and _count(ours, cutlass_nn.CutlassLinear) == 2 * 4 + 1 + 2 * 3
    assert _count(ours, nn.Linear) == 0
    assert "model.layers.0.mlp" in names and not any(".mlp." in n for n in names)
    assert len(names) == len(set(names)) == 2 * 4 + 1 + 2
    assert "9 nn.Linear -> CutlassLinear, 0 RMSNorm -> cutlass_nn.RMSNorm, 2 gated MLP -> " \
           "cutlass_nn.GatedMLP" in caplog.text
    assert list(ours.state_dict()) == list(stock.state_dict())
    with torch.no_grad():
        after = ours(input_ids=ids).logits
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    # a training step: the same loss and gradients as the unconverted model
    ls, lo = stock(input_ids=ids, labels=ids).loss, ours(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(lo, ls, rtol=1e-5, atol=1e-5)
    ls.backward()
    lo.backward()
    ours_params = dict(ours.named_parameters())
    for name, p in stock.named_parameters():
        torch.testing.assert_close(ours_params[name].grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    # the state_dict goes back into a stock model, strictly
    _tiny_llama(1).load_state_dict(ours.state_dict(), strict=True)


def test_convert_fuse_mlp_with_biases_and_fuse_norm():
    stock = _tiny_llama(mlp_bias=True)
    ours = copy.deepcopy(stock)
    cutlass_nn.convert(ours, fuse_mlp=True, fuse_norm=True)
    assert _count(ours, GatedMLP) == 2 and _count(ours, cutlass_nn.RMSNorm) == 5
    assert all(m.gate_proj.bias is not None and is_packed(m)
               for m in ours.modules() if type(m) is GatedMLP)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, stock(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)


def test_convert_filter_fn_can_refuse_an_mlp():
    model = _tiny_llama()
    cutlass_nn.convert(model, lambda name, m: name != "model.layers.0.mlp", fuse_mlp=True)
    kept, fused = model.model.layers[0].mlp, model.model.layers[1].mlp
    assert type(fused) is GatedMLP
    assert type(kept).__name__ == "LlamaMLP"
    # its projections were then considered one by one
    assert all(type(getattr(kept, n)) is cutlass_nn.CutlassLinear
               for n in ("gate_proj", "up_proj", "down_proj"))


def test_convert_without_fuse_mlp_leaves_the_mlps():
    model = _tiny_llama()
    cutlass_nn.convert(model)
    assert _count(model, GatedMLP) == 0
    mlp = model.model.layers[0].mlp
    assert type(mlp).__name__ == "LlamaMLP" and type(mlp.gate_proj) is cutlass_nn.CutlassLinear
    # ... and a second convert with fuse_mlp fuses those (CutlassLinear projections)
    cutlass_nn.convert(model, fuse_mlp=True)
    assert _count(model, GatedMLP) == 2


def test_convert_fuse_mlp_keeps_a_shared_mlp_shared():
    mlp = _llama_mlp()
    model = nn.ModuleDict({"a": mlp, "b": nn.Sequential(mlp)})
    names = []
    cutlass_nn.convert(model, lambda name, m: names.append(name) or True, fuse_mlp=True)
    assert type(model["a"]) is GatedMLP and model["b"][0] is model["a"]
    assert names == ["a"]


def test_convert_fuse_mlp_of_a_root_mlp():
    mlp = _llama_mlp()
    x = torch.randn(2, 24)
    expected = mlp(x)
    root = cutlass_nn.convert(mlp, fuse_mlp=True)
    assert type(root) is GatedMLP
    torch.testing.assert_close(root(x), expected, rtol=1e-5, atol=1e-6)


def test_convert_fuse_mlp_leaves_what_it_does_not_recognize():
    # an MLP of the right class with an activation GatedMLP does not compute
    relu_model = _tiny_llama(hidden_act="relu")
    cutlass_nn.convert(relu_model, fuse_mlp=True)
    assert _count(relu_model, GatedMLP) == 0
    assert type(relu_model.model.layers[0].mlp.gate_proj) is cutlass_nn.CutlassLinear
    # the right structure in a class that is not a known transformers MLP
    source = nn.Sequential(SourceMLP(nn.SiLU()))
    cutlass_nn.convert(source, fuse_mlp=True)
    assert type(source[0]) is SourceMLP and type(source[0].gate_proj) is cutlass_nn.CutlassLinear


def test_convert_warning_names_what_was_looked_for():
    with pytest.warns(UserWarning, match=r"no nn\.Linear or gated MLP layer of this Sequential"):
        cutlass_nn.convert(nn.Sequential(nn.ReLU()), fuse_mlp=True)
    with pytest.warns(UserWarning, match=r"no nn\.Linear, RMSNorm or gated MLP layer"):
        cutlass_nn.convert(nn.Sequential(nn.ReLU()), fuse_mlp=True, fuse_norm=True)


def test_gated_mlp_classes_compute_the_formula():
    """GATED_MLPS lists the transformers classes whose forward is the gated formula; each one
    that this transformers has is checked against a GatedMLP sharing its parameters."""
    transformers = _transformers()
    import importlib

    from cutlass_nn.convert import GATED_MLPS

    modules = {"Llama": "llama", "Mistral": "mistral", "Qwen2": "qwen2", "Qwen3": "qwen3",
               "Gemma": "gemma", "Gemma2": "gemma2", "Gemma3": "gemma3"}
    checked = 0
    for prefix, module_name in modules.items():
        assert f"{prefix}MLP" in GATED_MLPS
        try:
            mod = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
        except ImportError:
            continue
        config_cls = getattr(transformers, f"{prefix}TextConfig" if prefix == "Gemma3" else f"{prefix}Config")
        cfg = config_cls(hidden_size=16, intermediate_size=24, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=8)
        torch.manual_seed(0)
        mlp = getattr(mod, f"{prefix}MLP")(cfg).double()
        x = torch.randn(3, 16, dtype=torch.float64)
        expected = mlp(x)
        fused = cutlass_nn.convert(mlp, fuse_mlp=True)
        assert type(fused) is GatedMLP, prefix
        torch.testing.assert_close(fused(x), expected, rtol=1e-12, atol=1e-12, msg=prefix)
        checked += 1
    assert checked >= 1


def test_convert_fuse_mlp_on_a_gemma_model():
    transformers = _transformers()
    if not hasattr(transformers, "GemmaConfig"):
        pytest.skip("this transformers has no Gemma")
    cfg = transformers.GemmaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=128, hidden_activation="gelu_pytorch_tanh")
    torch.manual_seed(0)
    stock = transformers.GemmaForCausalLM(cfg)
    ours = copy.deepcopy(stock)
    cutlass_nn.convert(ours, fuse_mlp=True)
    mlps = [m for m in ours.modules() if type(m) is GatedMLP]
    assert len(mlps) == 2 and all(m.activation == "gelu_tanh" for m in mlps)
    ids = _ids()
    ls, lo = stock(input_ids=ids, labels=ids).loss, ours(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(lo, ls, rtol=1e-5, atol=1e-5)
    ls.backward()
    lo.backward()
    ours_params = dict(ours.named_parameters())
    for name, p in stock.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(ours_params[name].grad, p.grad, rtol=1e-4, atol=1e-5,
                                       msg=name)


def test_save_pretrained_of_a_converted_model_round_trips(tmp_path):
    transformers = _transformers()
    stock = _tiny_llama()
    ours = copy.deepcopy(stock)
    cutlass_nn.convert(ours, fuse_mlp=True)
    ours.save_pretrained(tmp_path)
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    ids = _ids()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, stock(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)


def _gated_kernels_run(fn):
    """Names of the gated-activation operators ``fn`` runs (CPU profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events() if e.name.startswith("cutlass_nn::gated_act")}


def test_backward_overwrites_its_saved_output_only_when_the_graph_is_not_kept():
    torch.manual_seed(0)
    args = [torch.randn(s, requires_grad=True) for s in ((5, 6), (4, 6), (4, 6), (3, 4))]
    y = ops.gated_mlp(*args)
    # one backward: the in-place form (its gradient written over the saved gate+up output)
    assert _gated_kernels_run(lambda: y.sum().backward()) == {"cutlass_nn::gated_act_backward_"}
    once = [a.grad.clone() for a in args]
    for a in args:
        a.grad = None
    y = ops.gated_mlp(*args)
    # retain_graph: the saved output must survive, so the out-of-place form runs ...
    assert _gated_kernels_run(lambda: y.sum().backward(retain_graph=True)) == {
        "cutlass_nn::gated_act_backward"
    }
    y.sum().backward()  # ... and a second backward through the same graph sees it intact
    for a, g in zip(args, once):
        torch.testing.assert_close(a.grad, 2 * g)


def test_inplace_backward_operator_matches_the_out_of_place_one():
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(7, 10, generator=gen)
    grad = torch.randn(7, 5, generator=gen)
    want_grad, want_out = ops.gated_act_backward(grad, gate_up, "gelu_tanh")
    buf = gate_up.clone()
    out = ops.gated_act_backward_(grad, buf, "gelu_tanh")
    assert torch.equal(buf, want_grad) and torch.equal(out, want_out)
    with pytest.raises(RuntimeError, match="cutlass_nn.gated_act_backward_: argument 'gate_up' must be contiguous"):
        ops.gated_act_backward_(grad, gate_up.t().contiguous().t(), "silu")
    shared = torch.randn(7 * 15)
    with pytest.raises(RuntimeError, match="cutlass_nn.gated_act_backward_: argument 'grad_output' must not share"):
        ops.gated_act_backward_(shared[:35].view(7, 5), shared[:70].view(7, 10), "silu")
    torch.library.opcheck(ops.gated_act_backward_.default, (grad, gate_up.clone(), "silu"))


def test_autocast_casts_packed_weights_into_one_buffer_without_a_concatenation():
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    mlp = cutlass_nn.GatedMLP(32, 48)
    x = torch.randn(5, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = mlp(x)
    assert "aten::cat" not in {e.name for e in prof.events()}
    y.float().sum().backward()
    # the same weights as three separate tensors: cached casts and a concatenation per call
    sep = [p.detach().clone().requires_grad_() for p in
           (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_sep = ops.gated_mlp(x, *sep)
    y_sep.float().sum().backward()
    assert torch.equal(y, y_sep)
    for p, s in zip((mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight), sep):
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, s.grad)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
def test_eager_autocast_backward_forms_no_packed_weight_gradient(packed):
    # under autocast the float32 gate and up weights are cast into the halves of one buffer;
    # each half's gradient goes straight back to its weight (one node for both halves), not
    # through [2n, in] zero-filled gradients of the packed buffer that are summed and split again
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    n, k = 48, 32
    mlp = cutlass_nn.GatedMLP(k, n)
    if not packed:
        mlp.gate_proj.weight.data = mlp.gate_proj.weight.data.clone()
    x = torch.randn(5, k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mlp(x)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        y.float().pow(2).sum().backward()
    packed_sized = [e.name for e in prof.events()
                    if e.name in ("aten::zeros", "aten::add", "aten::add_", "aten::zero_",
                                  "aten::fill_", "aten::new_zeros")
                    and any(list(s) == [2 * n, k] for s in e.input_shapes if s)]
    assert not packed_sized, packed_sized
    # the same computation with the casts written out in torch ops
    w = [p.detach().clone().requires_grad_() for p in
         (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)]
    wb = [t.to(torch.bfloat16) for t in w]
    y_ref = ops.gated_mlp(x.to(torch.bfloat16), *wb)
    y_ref.float().pow(2).sum().backward()
    assert torch.equal(y, y_ref)
    for p, r in zip((mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight), w):
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, r.grad)


def test_eager_autocast_frozen_half_gets_no_gradient_cast():
    # a frozen gate weight under autocast: its half of the packed gradient is not cast back to
    # float32 (one [n, in] cast fewer than with both weights trainable), the other weight's
    # gradient is unchanged
    from torch.profiler import ProfilerActivity, profile

    def backward_casts_and_grads(freeze_gate):
        torch.manual_seed(0)
        n, k = 48, 32
        mlp = cutlass_nn.GatedMLP(k, n)
        mlp.gate_proj.weight.data = mlp.gate_proj.weight.data.clone()  # separate weights
        mlp.gate_proj.weight.requires_grad_(not freeze_gate)
        x = torch.randn(5, k)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = mlp(x)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            y.float().pow(2).sum().backward()
        casts = sum(1 for e in prof.events() if e.name == "aten::_to_copy"
                    and e.input_shapes and list(e.input_shapes[0]) == [n, k])
        return casts, mlp.gate_proj.weight.grad, mlp.up_proj.weight.grad

    casts_both, _, up_grad_both = backward_casts_and_grads(False)
    casts_frozen, gate_grad, up_grad = backward_casts_and_grads(True)
    assert gate_grad is None
    assert casts_frozen == casts_both - 1, (casts_both, casts_frozen)
    assert up_grad.dtype == torch.float32 and torch.equal(up_grad, up_grad_both)


def test_eager_autocast_gated_mlp_double_backward_matches_written_out_casts():
    # the packing node's backward is differentiable: second derivatives through it equal those
    # through the casts written out in torch ops (autocast leaves float64 alone, so gradgradcheck
    # cannot run through it)
    torch.manual_seed(0)
    w = [torch.randn(s, requires_grad=True) for s in ((6, 4), (6, 4), (4, 6))]
    x = torch.randn(3, 4, requires_grad=True)

    def grads(use_autocast):
        if use_autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = ops.gated_mlp(x, *w)
        else:
            y = ops.gated_mlp(x.to(torch.bfloat16), *[t.to(torch.bfloat16) for t in w])
        g = torch.autograd.grad(y.float().pow(2).sum(), [x, *w], create_graph=True)
        gg = torch.autograd.grad(sum(t.float().pow(2).sum() for t in g), [x, *w])
        return list(g) + list(gg)

    for a, b in zip(grads(True), grads(False)):
        torch.testing.assert_close(a, b)


def test_saved_tensor_hooks_keep_the_out_of_place_backward():
    """A pack hook may keep its own reference to the saved gate+up output: the backward must
    not write over it."""
    torch.manual_seed(0)
    args = [torch.randn(s, requires_grad=True) for s in ((5, 6), (4, 6), (4, 6), (3, 4))]
    packed = []

    def pack(t):
        packed.append((t, t.clone()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = ops.gated_mlp(*args)
    assert _gated_kernels_run(lambda: y.sum().backward()) == {"cutlass_nn::gated_act_backward"}
    assert all(torch.equal(t, copy) for t, copy in packed)
