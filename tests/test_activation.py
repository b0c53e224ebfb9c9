"""Fused-activation linear layers: the operators linear_act, linear_act_aux and activation_grad,
``cutlass_nn.functional.linear(activation=...)`` and ``CutlassLinear(activation=...)``.

CPU (always): forward against a float64 reference for every activation and dtype, single
rounding of z and act(z), gradcheck / gradgradcheck, activation_grad against torch's own
backward (bias gradient included, deterministic), opcheck, torch.compile, the module and the
error messages. GPU (class TestCuda, skipped without a GPU and the CUDA flavor): the same
operators against a float64 reference with the accuracy rule of tests/cuda_helpers.py.
"""

from __future__ import annotations

import copy
import io
import math
import pickle
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_nn
from cuda_helpers import CUDA_MARKS, DTYPE_FLOOR, check_close, matmul_precision, seeded_generator
from cutlass_nn import functional as CF

ops = torch.ops.cutlass_nn
ACTS = ["none", "relu", "gelu", "gelu_tanh"]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
DTYPE_IDS = ["f16", "bf16", "f32", "f64"]


def torch_act(z: torch.Tensor, act: str) -> torch.Tensor:
    """The activation as torch computes it (the reference formulas)."""
    if act == "none":
        return z.clone()
    if act == "relu":
        return F.relu(z)
    if act == "gelu":
        return F.gelu(z)
    if act == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    raise ValueError(act)


def torch_module(act: str) -> nn.Module:
    return {
        "none": nn.Identity(),
        "relu": nn.ReLU(),
        "gelu": nn.GELU(),
        "gelu_tanh": nn.GELU(approximate="tanh"),
    }[act]


def torch_act_grad(g: torch.Tensor, z: torch.Tensor, act: str) -> torch.Tensor:
    """grad_output * act'(z) by torch's autograd, in the dtype of z."""
    z = z.detach().clone().requires_grad_()
    (dz,) = torch.autograd.grad(torch_act(z, act), z, g)
    return dz


def randn(shape, dtype, gen, device="cpu"):
    return torch.randn(shape, dtype=torch.float64, generator=gen).to(device=device, dtype=dtype)


# (leading dims, N = out_features, K = in_features, bias)
LINEAR_CASES = {
    "2d_bias": ((5,), 3, 4, True),
    "2d_nobias": ((5,), 3, 4, False),
    "aligned": ((32,), 64, 128, True),
    "odd": ((37,), 65, 129, True),
    "1d_input": ((), 3, 4, True),
    "3d_bias": ((2, 3), 4, 5, True),
    "4d_nobias": ((2, 1, 3), 7, 3, False),
    "empty_batch": ((0,), 3, 4, True),
    "empty_batch_nd": ((2, 0), 3, 4, False),
    "N0": ((3,), 0, 4, True),
    "K0": ((3,), 5, 0, True),
    "K0_nd": ((2, 3), 5, 0, False),
}


def linear_case(name, dtype, seed=0, requires_grad=False):
    lead, n, k, has_bias = LINEAR_CASES[name]
    g = torch.Generator().manual_seed(seed)
    x = randn((*lead, k), dtype, g).requires_grad_(requires_grad)
    w = randn((n, k), dtype, g).requires_grad_(requires_grad)
    b = randn((n,), dtype, g).requires_grad_(requires_grad) if has_bias else None
    return x, w, b


def _ulp_tol(dtype, k):
    """(rtol, atol) for a once-rounded result of a length-k dot product: one unit of the
    dtype's roundoff plus the float32 (float64) accumulation error."""
    eps = torch.finfo(dtype).eps
    acc_eps = 1e-15 if dtype == torch.float64 else 1e-6
    return eps, acc_eps * 4 * math.sqrt(max(k, 1))


# ---------------------------------------------------------------------------------------------
# CPU: forward
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", LINEAR_CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("act", ACTS)
def test_forward_matches_float64_reference(act, dtype, case):
    x, w, b = linear_case(case, dtype)
    out, z = ops.linear_act_aux(x, w, b, act)
    z64 = F.linear(x.double(), w.double(), None if b is None else b.double())
    ref = torch_act(z64, act)
    assert out.shape == z.shape == z64.shape
    assert out.dtype == z.dtype == dtype
    assert out.is_contiguous() and z.is_contiguous()
    assert out._base is None and z._base is None  # not views: in-place ops on them work
    rtol, atol = _ulp_tol(dtype, x.shape[-1])
    torch.testing.assert_close(z.double(), z64, rtol=rtol, atol=atol)
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)
    assert torch.equal(ops.linear_act(x, w, b, act), out)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("act", ACTS)
def test_16bit_outputs_are_rounded_once_from_float(act, dtype):
    """z = round(acc + bias) and out = round(act(acc + bias)) from the unrounded float value
    (the GPU epilogue), not act(round(z)) rounded again."""
    x, w, b = linear_case("odd", dtype, seed=3)
    out, z = ops.linear_act_aux(x, w, b, act)
    zf = torch.addmm(b.float(), x.float(), w.float().t())  # the same float GEMM
    torch.testing.assert_close(z, zf.to(dtype), rtol=0, atol=0)
    # torch's float act of the float value, rounded once: equal up to the last bits of the
    # float erf / tanh implementations (at most a one-ulp flip at a rounding boundary; in
    # gelu's far negative tail, |act| < 1e-3, the float formulas themselves differ by ~1e-7)
    expect = torch_act(zf, act).to(dtype)
    away = torch.nextafter(expect, torch.where(expect < 0, -math.inf, math.inf).to(dtype))
    ulp = (away.double() - expect.double()).abs()
    diff = (out.double() - expect.double()).abs()
    normal = expect.double().abs() >= 1e-3
    assert (diff / ulp)[normal].max().item() <= 1.0
    if (~normal).any():
        assert (diff - ulp)[~normal].max().item() <= 1e-6
    mismatches = (out != expect)[normal].float().mean().item()
    assert mismatches < 0.02
    if act.startswith("gelu"):
        # act(round(z)) rounded again is visibly different
        twice = torch_act(zf.to(dtype).float(), act).to(dtype)
        assert (twice != expect)[normal].float().mean().item() > 2 * mismatches


def _ops_called(fn) -> list[str]:
    """Names of the cutlass_nn operators that ``fn()`` ran, in order (CPU profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("cutlass_nn::")]


@pytest.mark.parametrize("act", ACTS)
def test_functional_linear_dispatch(act):
    """functional.linear: plain linear for None / "none", else one linear_act call; when that
    records an autograd node, the node's forward runs the fused linear_act_aux (keeping the
    pre-activation) and the backward reuses it instead of recomputing the GEMM; the same values
    either way."""
    x, w, b = linear_case("3d_bias", torch.float32)
    plain = ops.linear(x, w, b)
    torch.testing.assert_close(CF.linear(x, w, b), plain, rtol=0, atol=0)
    torch.testing.assert_close(CF.linear(x, w, b, activation=None), plain, rtol=0, atol=0)
    y = CF.linear(x, w, b, activation=act)
    assert y.grad_fn is None
    torch.testing.assert_close(y, ops.linear_act(x, w, b, act), rtol=0, atol=0)
    wg = w.clone().requires_grad_()
    called = _ops_called(lambda: CF.linear(x, wg, b, activation=act))
    if act == "none":
        assert called == ["cutlass_nn::linear"], called
        return
    assert called == ["cutlass_nn::linear_act", "cutlass_nn::linear_act_aux"], called
    yg = CF.linear(x, wg, b, activation=act)
    assert yg.grad_fn is not None and "LinearActFunction" in yg.grad_fn.name()
    torch.testing.assert_close(yg.detach(), y, rtol=0, atol=0)
    called = _ops_called(lambda: yg.sum().backward())
    assert "cutlass_nn::linear" not in called, called  # no recomputed pre-activation
    assert "cutlass_nn::linear_wgrad" in called and "cutlass_nn::activation_grad" in called
    with torch.no_grad():
        assert CF.linear(x, wg, b, activation=act).grad_fn is None
        assert _ops_called(lambda: CF.linear(x, wg, b, activation=act)) == [
            "cutlass_nn::linear_act"
        ]


def test_relu_special_values_follow_torch():
    """relu: NaN propagates; its gradient is 0 at z <= 0 (even for a NaN or inf incoming
    gradient) and passes through at z = NaN, like torch.relu's backward."""
    z = torch.tensor([[float("nan"), -1.0, -0.0, 0.0, 2.0]])
    out = ops.linear_act(torch.zeros(1, 1), torch.zeros(5, 1), z[0], "relu")  # z = 0 + bias
    ref = F.relu(z)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(out), torch.nan_to_num(ref))
    g = torch.tensor([[3.0, float("nan"), float("inf"), 5.0, 7.0]])
    dz, _ = ops.activation_grad(g, z, "relu", False)
    assert torch.equal(dz, torch_act_grad(g, z, "relu"))
    assert dz.tolist() == [[3.0, 0.0, 0.0, 0.0, 7.0]]


# ---------------------------------------------------------------------------------------------
# CPU: activation_grad
# ---------------------------------------------------------------------------------------------

GRAD_SHAPES = {
    "2d": (7, 5),
    "1d": (6,),
    "3d": (2, 3, 4),
    "many_rows": (1000, 33),  # several 256-row blocks of partial sums
    "empty_rows": (0, 4),
    "empty_cols": (3, 0),
}


@pytest.mark.parametrize("shape", GRAD_SHAPES.values(), ids=GRAD_SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("act", ACTS)
def test_activation_grad_matches_torch(act, dtype, shape):
    g_ = torch.Generator().manual_seed(1)
    g = randn(shape, dtype, g_)
    z = randn(shape, dtype, g_)
    dz, db = ops.activation_grad(g, z, act, True)
    ref64 = torch_act_grad(g.double(), z.double(), act)
    rtol, atol = _ulp_tol(dtype, 1)
    assert dz.dtype == db.dtype == dtype and dz.shape == z.shape
    torch.testing.assert_close(dz.double(), ref64, rtol=rtol, atol=atol)
    # the bias gradient sums the rounded grad_preact over all leading dims
    rows = math.prod(shape[:-1])
    db_ref = dz.double().reshape(rows, shape[-1]).sum(0)
    assert db.shape == (shape[-1],)
    torch.testing.assert_close(db.double(), db_ref, rtol=rtol, atol=_ulp_tol(dtype, rows)[1] * 4)
    # without the bias gradient: the same grad_preact and an empty [0] tensor
    dz2, empty = ops.activation_grad(g, z, act, False)
    assert torch.equal(dz2, dz)
    assert empty.shape == (0,) and empty.dtype == dtype
    # deterministic
    dz3, db3 = ops.activation_grad(g, z, act, True)
    assert torch.equal(dz3, dz) and torch.equal(db3, db)


@pytest.mark.parametrize("act", ACTS)
def test_activation_grad_bias_is_independent_of_threads(act):
    g_ = torch.Generator().manual_seed(2)
    g = randn((3000, 17), torch.float32, g_)
    z = randn((3000, 17), torch.float32, g_)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.activation_grad(g, z, act, True)
    finally:
        torch.set_num_threads(threads)
    many = ops.activation_grad(g, z, act, True)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


def test_activation_grad_strided_inputs():
    g_ = torch.Generator().manual_seed(4)
    g = randn((9, 6), torch.float32, g_).t()  # transposed view [6, 9]
    z = randn((6, 18), torch.float32, g_)[:, ::2]  # strided
    dz, db = ops.activation_grad(g, z, "gelu", True)
    ref = torch_act_grad(g, z, "gelu")
    torch.testing.assert_close(dz, ref)
    torch.testing.assert_close(db, ref.sum(0))
    assert dz.is_contiguous()


# ---------------------------------------------------------------------------------------------
# CPU: gradients
# ---------------------------------------------------------------------------------------------


def _grad_inputs(seed, lead=(2, 3), n=4, k=5, bias=True):
    """float64 inputs whose pre-activation stays away from 0 (relu's kink) by more than the
    finite-difference step."""
    g = torch.Generator().manual_seed(seed)
    while True:  # deterministic: the first draw of the generator's sequence that qualifies
        x = torch.randn((*lead, k), dtype=torch.float64, generator=g)
        w = torch.randn((n, k), dtype=torch.float64, generator=g)
        b = torch.randn((n,), dtype=torch.float64, generator=g) if bias else None
        if F.linear(x, w, b).abs().min() > 1e-2:
            return [t.requires_grad_() if t is not None else None for t in (x, w, b)]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_functional_linear(act, bias):
    x, w, b = _grad_inputs(0, bias=bias)
    args = (x, w, b) if bias else (x, w)

    def f(x, w, b=None):
        return CF.linear(x, w, b, activation=act)

    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_raw_ops(act):
    """linear_act (recomputing z in its backward), both outputs of linear_act_aux, and
    activation_grad with and without the bias gradient."""
    x, w, b = _grad_inputs(1)
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear_act(x, w, b, act), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda x, w, b: ops.linear_act(x, w, b, act), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear_act_aux(x, w, b, act), (x, w, b))
    assert torch.autograd.gradgradcheck(
        lambda x, w, b: ops.linear_act_aux(x, w, b, act), (x, w, b)
    )
    # only the pre-activation output used (the activation output gets no gradient)
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear_act_aux(x, w, b, act)[1], (x, w, b))
    g_ = torch.Generator().manual_seed(2)
    gout = torch.randn(3, 4, dtype=torch.float64, generator=g_, requires_grad=True)
    z = torch.randn(3, 4, dtype=torch.float64, generator=g_)
    z = (z + 0.1 * z.sign()).requires_grad_()  # away from relu's kink
    for bias_grad in (True, False):
        fn = lambda g, z: ops.activation_grad(g, z, act, bias_grad)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (gout, z))
        assert torch.autograd.gradgradcheck(fn, (gout, z))


@pytest.mark.parametrize("act", ACTS)
def test_backward_matches_torch(act):
    """Gradients of CutlassLinear(activation) equal those of nn.Sequential(nn.Linear, act)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 5).double(), torch_module(act))
    layer = cutlass_nn.CutlassLinear.from_linear(ref[0], activation=act)
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    gy = torch.randn(4, 3, 5, dtype=torch.float64)
    grads = []
    for model in (layer, ref):
        xi = x.clone().requires_grad_()
        y = model(xi)
        gx, gw, gb = torch.autograd.grad(y, (xi, ref[0].weight, ref[0].bias), gy)
        grads.append((y.detach(), gx, gw, gb))
    for a, e in zip(*grads):
        torch.testing.assert_close(a, e)


def test_backward_uses_cutlass_ops():
    """The backward of the fused layer runs activation_grad (with the fused bias gradient),
    linear_dgrad and linear_wgrad -- no separate bias_grad pass."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls.append(str(func))
            return func(*args, **(kwargs or {}))

    layer = cutlass_nn.CutlassLinear(4, 3, activation="gelu")
    x = torch.randn(5, 4, requires_grad=True)
    y = layer(x)
    with Recorder() as rec:
        y.backward(torch.ones_like(y))
    cutlass = [c for c in rec.calls if c.startswith("cutlass_nn.")]
    assert cutlass.count("cutlass_nn.activation_grad.default") == 1, cutlass
    assert "cutlass_nn.linear_dgrad.default" in cutlass
    assert "cutlass_nn.linear_wgrad.default" in cutlass
    assert "cutlass_nn.bias_grad.default" not in cutlass


def test_autocast_cpu():
    layer = cutlass_nn.CutlassLinear(8, 4, activation="gelu_tanh")
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32
    ref = F.gelu(F.linear(x, layer.weight, layer.bias), approximate="tanh")
    torch.testing.assert_close(y.float(), ref.detach(), rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------------
# CPU: opcheck and torch.compile
# ---------------------------------------------------------------------------------------------


def _opcheck_samples():
    out = []
    for act in ACTS:
        for case in ("3d_bias", "2d_nobias", "empty_batch", "K0"):
            x, w, b = linear_case(case, torch.float32, requires_grad=True)
            out.append(pytest.param("linear_act", (x, w, b, act), id=f"linear_act-{act}-{case}"))
            out.append(
                pytest.param("linear_act_aux", (x, w, b, act), id=f"linear_act_aux-{act}-{case}")
            )
        for shape in ((2, 3, 4), (0, 3)):
            g_ = torch.Generator().manual_seed(0)
            g = torch.randn(shape, generator=g_).requires_grad_()
            z = torch.randn(shape, generator=g_).requires_grad_()
            for bias_grad in (True, False):
                out.append(
                    pytest.param(
                        "activation_grad",
                        (g, z, act, bias_grad),
                        id=f"activation_grad-{act}-{list(shape)}-{bias_grad}",
                    )
                )
    return out


@pytest.mark.parametrize("op, args", _opcheck_samples())
def test_opcheck(op, args):
    torch.library.opcheck(getattr(ops, op).default, args)


@pytest.mark.slow
def test_compile_fullgraph_matches_eager():
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = nn.Sequential(
        cutlass_nn.CutlassLinear(16, 32, activation="gelu_tanh"), cutlass_nn.CutlassLinear(32, 8)
    )
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    x = torch.randn(4, 5, 16)
    results = []
    for fn, model in ((compiled, compiled_model), (eager, eager)):
        xi = x.clone().requires_grad_()
        y = fn(xi)
        y.backward(torch.cos(y.detach()))
        results.append(
            (y.detach(), xi.grad, *[p.grad.clone() for p in model.parameters()])
        )
    assert len(results[0]) == 6
    for a, e in zip(*results):
        torch.testing.assert_close(a, e)


# ---------------------------------------------------------------------------------------------
# CPU: the module
# ---------------------------------------------------------------------------------------------


def test_module_repr_and_attribute():
    layer = cutlass_nn.CutlassLinear(4, 3, activation="gelu")
    assert layer.activation == "gelu"
    assert repr(layer) == "CutlassLinear(in_features=4, out_features=3, bias=True, activation='gelu')"
    plain = cutlass_nn.CutlassLinear(4, 3, bias=False)
    assert plain.activation is None
    assert repr(plain) == "CutlassLinear(in_features=4, out_features=3, bias=False)"
    assert cutlass_nn.CutlassLinear(4, 3, activation="none").activation is None
    import inspect

    assert "activation" in inspect.signature(cutlass_nn.CutlassLinear).parameters


@pytest.mark.parametrize("act", ACTS[1:])
def test_module_matches_sequential(act):
    torch.manual_seed(0)
    layer = cutlass_nn.CutlassLinear(6, 5, dtype=torch.float64, activation=act)
    ref = nn.Sequential(nn.Linear(6, 5, dtype=torch.float64), torch_module(act))
    ref[0].load_state_dict(layer.state_dict(), strict=True)
    x = torch.randn(2, 4, 6, dtype=torch.float64)
    torch.testing.assert_close(layer(x), ref(x))


def test_module_state_dict_round_trip():
    torch.manual_seed(0)
    layer = cutlass_nn.CutlassLinear(4, 3, activation="relu")
    sd = layer.state_dict()
    assert set(sd) == {"weight", "bias"}  # the activation is not state
    lin = nn.Linear(4, 3)
    lin.load_state_dict(sd, strict=True)
    back = cutlass_nn.CutlassLinear(4, 3, activation="relu")
    back.load_state_dict(lin.state_dict(), strict=True)
    x = torch.randn(2, 4)
    torch.testing.assert_close(back(x), F.relu(lin(x)))


def test_module_from_linear():
    lin = nn.Linear(4, 3)
    layer = cutlass_nn.CutlassLinear.from_linear(lin, activation="gelu_tanh")
    assert layer.weight is lin.weight and layer.bias is lin.bias
    assert layer.activation == "gelu_tanh"
    x = torch.randn(2, 4)
    torch.testing.assert_close(layer(x), F.gelu(lin(x), approximate="tanh"))
    assert cutlass_nn.CutlassLinear.from_linear(lin).activation is None
    with pytest.raises(ValueError, match="'activation'"):
        cutlass_nn.CutlassLinear.from_linear(lin, activation="tanh")


def test_module_pickle_and_deepcopy():
    layer = cutlass_nn.CutlassLinear(4, 3, activation="gelu")
    x = torch.randn(2, 4)
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert clone.activation == "gelu"
        torch.testing.assert_close(clone(x), layer(x))
    buf = io.BytesIO()
    torch.save(layer, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert loaded.activation == "gelu"
    # a layer pickled before the attribute existed: None applies (the attribute's value lives
    # in _activation since it became a checked property)
    old = cutlass_nn.CutlassLinear(4, 3)
    del old.__dict__["_activation"]
    assert pickle.loads(pickle.dumps(old)).activation is None


@pytest.mark.parametrize("bad", ["swish", "GELU", "", 3, ("relu",)])
def test_module_invalid_activation(bad):
    msg = re.escape(
        "cutlass_nn.CutlassLinear: argument 'activation' must be None or one of \"none\", "
        f"\"relu\", \"gelu\", \"gelu_tanh\", got {bad!r}"
    )
    with pytest.raises(ValueError, match=msg):
        cutlass_nn.CutlassLinear(4, 3, activation=bad)


def test_training_example_fuses_hidden_activations():
    """training_examples/train_mlp.py detects CutlassLinear's `activation` argument and fuses the
    hidden layers' activation (the activation slots become nn.Identity, state_dict keys and the
    initial weights unchanged)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "training_examples" / "train_mlp.py"
    spec = importlib.util.spec_from_file_location("_train_mlp_for_test", path)
    train_mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_mlp)
    args = train_mlp.parse_args(["--impl", "cutlass", "--activation", "gelu_tanh"])
    model = train_mlp.build_model(args, "cutlass", torch.device("cpu"))
    reference = train_mlp.build_model(args, "torch", torch.device("cpu"))
    assert model.fused_activation
    for lin, act in zip(model.hidden, model.acts):
        assert isinstance(lin, cutlass_nn.CutlassLinear) and lin.activation == "gelu_tanh"
        assert isinstance(act, nn.Identity)
    assert isinstance(model.head, cutlass_nn.CutlassLinear) and model.head.activation is None
    ref_sd, sd = reference.state_dict(), model.state_dict()
    assert ref_sd.keys() == sd.keys()
    assert all(torch.equal(ref_sd[k], sd[k]) for k in sd)
    x = torch.randn(5, train_mlp.NUM_FEATURES)
    torch.testing.assert_close(model(x), reference(x))


# ---------------------------------------------------------------------------------------------
# CPU: error messages
# ---------------------------------------------------------------------------------------------

E = re.escape


def _meta(*shape):
    return torch.empty(*shape, device="meta")


def _bad_act_msg(op, given='"swish"'):
    return E(
        f"cutlass_nn.{op}: argument 'activation' must be one of \"none\", \"relu\", \"gelu\", "
        f"\"gelu_tanh\", got {given}"
    )


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_unknown_activation(device):
    x, w, b = (torch.randn(3, 4, device=device), torch.randn(5, 4, device=device),
               torch.randn(5, device=device))
    with pytest.raises(RuntimeError, match=_bad_act_msg("linear_act")):
        ops.linear_act(x, w, b, "swish")
    with pytest.raises(RuntimeError, match=_bad_act_msg("linear_act_aux")):
        ops.linear_act_aux(x, w, None, "swish")
    g = torch.randn(3, 5, device=device)
    with pytest.raises(RuntimeError, match=_bad_act_msg("activation_grad")):
        ops.activation_grad(g, g, "swish", True)
    if device == "meta":  # the Python wrappers' autocast query does not know "meta"
        return
    with pytest.raises(RuntimeError, match=_bad_act_msg("linear_act_aux")):
        CF.linear(x, w.requires_grad_(), b, activation="swish")
    with pytest.raises(RuntimeError, match=_bad_act_msg("linear_act")):
        CF.linear(x, w.detach(), b, activation="swish")


def test_non_string_activation():
    x, w = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(RuntimeError, match=_bad_act_msg("linear_act", "3")):
        cutlass_nn.ops.linear_act(x, w, None, 3)
    with pytest.raises(RuntimeError, match=_bad_act_msg("activation_grad", "None")):
        cutlass_nn.ops.activation_grad(x, x, None)


ARG_ERRORS = [
    ("linear_act in_features", lambda: ops.linear_act(torch.randn(3, 4), torch.randn(5, 6), None, "relu"),
     E("cutlass_nn.linear_act: argument 'input' must have size 6 in dimension 1 (in_features = weight.shape[1]), got shape [3, 4]")),
    ("linear_act_aux bias dtype", lambda: ops.linear_act_aux(torch.randn(3, 4), torch.randn(5, 4), torch.randn(5).half(), "gelu"),
     E("cutlass_nn.linear_act_aux: argument 'bias' must have dtype float32 (the dtype of 'input'), got float16")),
    ("activation_grad shape", lambda: ops.activation_grad(torch.randn(3, 4), torch.randn(3, 5), "gelu", True),
     E("cutlass_nn.activation_grad: argument 'preact' must have the shape of 'grad_output' [3, 4], got [3, 5]")),
    ("activation_grad dtype", lambda: ops.activation_grad(torch.randn(3, 4), torch.randn(3, 4).double(), "gelu", False),
     E("cutlass_nn.activation_grad: argument 'preact' must have dtype float32 (the dtype of 'grad_output'), got float64")),
    ("activation_grad int", lambda: ops.activation_grad(torch.ones(3, 4, dtype=torch.int32), torch.ones(3, 4, dtype=torch.int32), "relu", False),
     E("cutlass_nn.activation_grad: argument 'grad_output' must have a floating dtype (float16, bfloat16, float32 or float64), got int32")),
    ("activation_grad 0-d", lambda: ops.activation_grad(torch.randn(()), torch.randn(()), "relu", False),
     E("cutlass_nn.activation_grad: argument 'grad_output' must have at least 1 dimension(s)")),
    ("activation_grad device", lambda: ops.activation_grad(torch.randn(3, 4), _meta(3, 4), "relu", False),
     E("cutlass_nn.activation_grad: argument 'preact' must be on device cpu (the device of 'grad_output'), got meta")),
]


@pytest.mark.parametrize("fn, msg", [pytest.param(f, m, id=i) for i, f, m in ARG_ERRORS])
def test_argument_errors(fn, msg):
    with pytest.raises(RuntimeError, match=msg):
        fn()


@pytest.mark.parametrize(
    "fn",
    [
        lambda: ops.activation_grad(_meta(3, 4), _meta(3, 5), "gelu", True),
        lambda: ops.linear_act(_meta(3, 4), _meta(5, 6), None, "relu"),
    ],
    ids=["activation_grad", "linear_act"],
)
def test_fake_impls_check_shapes(fn):
    with pytest.raises(RuntimeError, match=r"cutlass_nn\.(activation_grad|linear_act): argument"):
        fn()


def test_fake_shapes():
    x, w, b = _meta(2, 3, 4), _meta(5, 4), _meta(5)
    out, z = ops.linear_act_aux(x, w, b, "gelu")
    assert out.shape == z.shape == (2, 3, 5) and out.device.type == "meta"
    assert ops.linear_act(x, w, None, "relu").shape == (2, 3, 5)
    dz, db = ops.activation_grad(_meta(2, 3, 5), _meta(2, 3, 5), "gelu", True)
    assert dz.shape == (2, 3, 5) and db.shape == (5,)
    assert ops.activation_grad(_meta(2, 5), _meta(2, 5), "gelu", False)[1].shape == (0,)


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------

# (M, N, K) = (rows, out_features, in_features)
CUDA_SHAPES = {"aligned": (256, 512, 384), "odd": (37, 129, 65)}
CUDA_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
CUDA_DTYPE_IDS = ["bf16", "f16", "f32"]
# error floors of the accuracy rule (relative, in the norm): as the GEMM tests' f16 / bf16 /
# f32_ieee precisions
CUDA_FLOOR = {torch.bfloat16: 2e-3, torch.float16: 2e-3, torch.float32: 1e-5}


class TestCuda:
    pytestmark = CUDA_MARKS

    @pytest.fixture(autouse=True)
    def _ieee_fp32(self):
        with matmul_precision(False):
            yield

    @pytest.fixture
    def gen(self, request):
        return seeded_generator(request.node.nodeid)

    @pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
    @pytest.mark.parametrize("shape", CUDA_SHAPES.values(), ids=CUDA_SHAPES.keys())
    @pytest.mark.parametrize("act", ACTS)
    @pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=CUDA_DTYPE_IDS)
    def test_linear_act(self, dtype, act, shape, bias, gen):
        m, n, k = shape
        x = torch.randn(m, k, generator=gen, device="cuda").to(dtype)
        w = torch.randn(n, k, generator=gen, device="cuda").to(dtype)
        b = torch.randn(n, generator=gen, device="cuda").to(dtype) if bias else None
        out, z = ops.linear_act_aux(x, w, b, act)
        out2 = ops.linear_act(x, w, b, act)
        b64 = None if b is None else b.double()
        z64 = F.linear(x.double(), w.double(), b64)
        z_torch = F.linear(x, w, b)
        ctx = f"{act} {shape} bias={bias}"
        check_close(z, z_torch, z64, CUDA_FLOOR[dtype], "linear_act_aux z " + ctx)
        check_close(out, torch_act(z_torch, act), torch_act(z64, act), CUDA_FLOOR[dtype],
                    "linear_act_aux out " + ctx)
        check_close(out2, torch_act(z_torch, act), torch_act(z64, act), CUDA_FLOOR[dtype],
                    "linear_act " + ctx)
        assert out.is_contiguous() and z.is_contiguous() and out2.is_contiguous()

    def test_linear_act_3d_and_empty(self, gen):
        x = torch.randn(2, 3, 64, generator=gen, device="cuda").bfloat16()
        w = torch.randn(32, 64, generator=gen, device="cuda").bfloat16()
        out = ops.linear_act(x, w, None, "gelu")
        ref = F.gelu(F.linear(x.double(), w.double()))
        assert out.shape == (2, 3, 32)
        check_close(out, F.gelu(F.linear(x, w)), ref, 2e-3, "3d")
        empty = ops.linear_act_aux(x[:0], w, None, "relu")
        assert empty[0].shape == empty[1].shape == (0, 3, 32)

    @pytest.mark.parametrize("bias_grad", [True, False])
    # 3001x1030: many row chunks, a ragged last column strip and (16-bit types) the scalar path.
    @pytest.mark.parametrize(
        "shape",
        [(256, 512), (37, 129), (4096, 384), (1, 7), (0, 16), (3001, 1030)],
        ids=["256x512", "37x129", "4096x384", "1x7", "0x16", "3001x1030"],
    )
    @pytest.mark.parametrize("act", ACTS)
    @pytest.mark.parametrize("dtype", CUDA_DTYPES + [torch.float64], ids=CUDA_DTYPE_IDS + ["f64"])
    def test_activation_grad(self, dtype, act, shape, bias_grad, gen):
        g = torch.randn(shape, generator=gen, device="cuda").to(dtype)
        z = torch.randn(shape, generator=gen, device="cuda").to(dtype)
        dz, db = ops.activation_grad(g, z, act, bias_grad)
        ref64 = torch_act_grad(g.double(), z.double(), act)
        floor = DTYPE_FLOOR[dtype]
        check_close(dz, torch_act_grad(g, z, act), ref64, floor, f"grad_preact {act} {shape}")
        if bias_grad:
            assert db.shape == (shape[1],) and db.dtype == dtype
            db_torch = torch_act_grad(g, z, act).float().sum(0).to(dtype)
            check_close(db, db_torch, ref64.sum(0), floor, f"grad_bias {act} {shape}")
            # the sum of the returned (rounded) grad_preact
            # (db is rounded once to the tensor dtype: relative tolerance of one rounding)
            unit = {torch.bfloat16: 2**-8, torch.float16: 2**-11}.get(dtype, 1e-5)
            torch.testing.assert_close(
                db.double(), dz.double().sum(0), rtol=unit,
                atol=unit * math.sqrt(shape[0] + 1),
            )
        else:
            assert db.shape == (0,)
        # deterministic, and the same on the CPU (up to the summation order of the bias)
        dz2, db2 = ops.activation_grad(g, z, act, bias_grad)
        assert torch.equal(dz, dz2) and torch.equal(db, db2)
        # (CUDA's and glibc's erf / tanh / exp differ in the last float bits: a one-ulp flip
        # of a 16-bit result, a few ulps of a float32 one)
        dz_cpu, db_cpu = ops.activation_grad(g.cpu(), z.cpu(), act, bias_grad)
        rtol = {torch.float32: 2e-6, torch.float64: 1e-13}.get(dtype, 2 * torch.finfo(dtype).eps)
        torch.testing.assert_close(dz.cpu(), dz_cpu, rtol=rtol, atol=1e-6)

    @pytest.mark.parametrize("cols", [128, 1024])
    @pytest.mark.parametrize("dtype", CUDA_DTYPES + [torch.float64], ids=CUDA_DTYPE_IDS + ["f64"])
    def test_activation_grad_vector_and_scalar_paths_agree(self, dtype, cols, gen):
        """The same data at a 16-byte aligned and a misaligned address (the scalar path of the
        kernels) gives bitwise the same results: the summation order does not depend on it."""
        rows = 1000
        n = rows * cols
        base = torch.randn(2, rows, cols, generator=gen, device="cuda").to(dtype)
        g_a, z_a = base[0], base[1]  # both 16-byte aligned (n * element size % 16 == 0)
        shifted = torch.empty(2 * n + 1, device="cuda", dtype=dtype)
        shifted[1:].view(2, rows, cols).copy_(base)
        g_u, z_u = shifted[1 : n + 1].view(rows, cols), shifted[n + 1 :].view(rows, cols)
        assert g_a.data_ptr() % 16 == 0 and z_a.data_ptr() % 16 == 0
        assert g_u.data_ptr() % 16 != 0 and z_u.data_ptr() % 16 != 0
        assert torch.equal(g_u, g_a) and torch.equal(z_u, z_a)
        aligned = ops.activation_grad(g_a, z_a, "gelu", True)
        misaligned = ops.activation_grad(g_u, z_u, "gelu", True)
        assert torch.equal(aligned[0], misaligned[0])
        assert torch.equal(aligned[1], misaligned[1])

    @pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
    @pytest.mark.parametrize("act", ACTS[1:])
    @pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=CUDA_DTYPE_IDS)
    def test_module_forward_backward(self, dtype, act, bias, gen):
        """CutlassLinear(activation) against nn.Sequential(nn.Linear, act): outputs and all
        gradients, with a float64 run of the torch model as the reference."""
        torch.manual_seed(0)
        ref = nn.Sequential(nn.Linear(384, 256, bias=bias), torch_module(act)).cuda()
        layer = cutlass_nn.CutlassLinear(384, 256, bias=bias, activation=act).cuda()
        layer.load_state_dict(ref[0].state_dict(), strict=True)
        ref64 = copy.deepcopy(ref).double()
        x = torch.randn(8, 32, 384, generator=gen, device="cuda")
        gy = torch.randn(8, 32, 256, generator=gen, device="cuda")
        results = {}
        for name, model, dt in (("ours", layer.to(dtype), dtype), ("torch", ref.to(dtype), dtype),
                                ("ref", ref64, torch.float64)):
            xi = x.detach().to(dt).clone().requires_grad_()  # a fresh leaf per model
            y = model(xi)
            y.backward(gy.to(dt))
            lin = model if name == "ours" else model[0]
            results[name] = [y.detach(), xi.grad, lin.weight.grad] + (
                [lin.bias.grad] if bias else []
            )
        for i, what in enumerate(["out", "grad_input", "grad_weight", "grad_bias"][: len(results["ours"])]):
            check_close(results["ours"][i], results["torch"][i], results["ref"][i],
                        CUDA_FLOOR[dtype], f"module {what} {act}")

    def test_last_kernel_name_after_linear_act(self, gen):
        x = torch.randn(256, 384, generator=gen, device="cuda").bfloat16()
        w = torch.randn(512, 384, generator=gen, device="cuda").bfloat16()
        b = torch.randn(512, generator=gen, device="cuda").bfloat16()
        ops.linear_act(x, w, b, "gelu_tanh")
        torch.cuda.synchronize()
        assert cutlass_nn.ops.last_kernel_name() != ""
