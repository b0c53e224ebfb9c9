"""FP8 linear layers on the CPU (the ATen path of fp8_scaled_mm): cutlass_nn.fp8.linear and
CutlassLinear(precision="fp8") equal cutlass_nn.fp8_reference's Fp8LinearReference (bitwise in
16-bit, to float32 summation order in float32), for both recipes and gradient formats, 3-d
inputs, with and without bias, partial needs; the state_dict is nn.Linear's;
convert(precision="fp8") applies the size rule and reports it; autocast gives the autocast dtype;
torch.compile (fullgraph) traces it; bad arguments fail by name before anything changes."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from torch import nn

import cutlass_nn
from cutlass_nn import fp8
from cutlass_nn.fp8_reference import Fp8LinearReference, Fp8Recipe

RECIPES = [Fp8Recipe(s, g) for s in ("tensorwise", "rowwise") for g in ("e4m3", "e5m2")]


def _pair(seed=0, n=48, k=32, bias=True, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    layer = nn.Linear(k, n, bias=bias, dtype=dtype)
    return layer


@pytest.mark.parametrize("recipe", RECIPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_layer_equals_reference(recipe, bias, dtype):
    stock = _pair(bias=bias, dtype=dtype)
    ours = cutlass_nn.CutlassLinear.from_linear(stock, precision="fp8", fp8_recipe=recipe)
    x = torch.randn(2, 5, 32, dtype=dtype, requires_grad=True)
    g = torch.randn(2, 5, 48, dtype=dtype)
    y = ours(x)
    y.backward(g)
    grads = (x.grad, ours.weight.grad, None if not bias else ours.bias.grad)
    w = stock.weight.detach().clone().requires_grad_()
    b = stock.bias.detach().clone().requires_grad_() if bias else None
    x2 = x.detach().clone().requires_grad_()
    y2 = Fp8LinearReference.apply(x2, w, b, recipe)
    y2.backward(g)
    same = _same_up_to_fp32_summation_order
    assert same(y, y2)
    assert same(grads[0], x2.grad) and same(grads[1], w.grad)
    if bias:
        assert same(grads[2], b.grad)


def _same_up_to_fp32_summation_order(a, b):
    """Bitwise for 16-bit results. A float32 result keeps the float32 matmul's last bits, which
    depend on the operands' memory layout (the layer's ATen path and the reference multiply the
    same dequantized values with differently strided operands; with torch 2.13.0's CPU build the
    input gradient differed by 2.4e-7): a few ulps allowed, far below any scale or
    quantization error (an e4m3 step is 6% of the value)."""
    if a.dtype != torch.float32:
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=4e-6, atol=1e-6)


def test_only_the_needed_gradients():
    layer = cutlass_nn.CutlassLinear(32, 48, precision="fp8", dtype=torch.bfloat16)
    layer.weight.requires_grad_(False)
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is None and layer.bias.grad is not None
    x = torch.randn(4, 32, dtype=torch.bfloat16)  # no input gradient
    layer.weight.requires_grad_(True)
    layer(x).sum().backward()
    assert layer.weight.grad is not None


@pytest.mark.parametrize("scaling", ["tensorwise", "rowwise"])
def test_backward_quantizes_a_tensorwise_gradient_once(scaling):
    """Tensorwise: the output gradient is quantized once, in both layouts (fp8_quantize_both);
    rowwise needs two scalings of it (per row for dX, per column for dW)."""
    layer = cutlass_nn.CutlassLinear(32, 48, precision="fp8", dtype=torch.bfloat16,
                                     fp8_recipe=Fp8Recipe(scaling))
    y = layer(torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y.sum().backward()
    names = [e.name for e in prof.events()]
    both = names.count("cutlass_nn::fp8_quantize_both")
    single = names.count("cutlass_nn::fp8_quantize")
    cast = names.count("cutlass_nn::fp8_cast")
    # tensorwise: dY once (both layouts), W^T and X^T cast with the forward's scales;
    # rowwise: dY twice, W^T and X^T per column
    expected = (1, 0, 2) if scaling == "tensorwise" else (0, 4, 0)
    assert (both, single, cast) == expected, (both, single, cast)


def test_close_to_bf16_layer():
    torch.manual_seed(0)
    stock = nn.Linear(256, 128, dtype=torch.float32)
    ours = cutlass_nn.CutlassLinear.from_linear(stock, precision="fp8",
                                                fp8_recipe=Fp8Recipe("rowwise"))
    x = torch.randn(64, 256)
    want, got = stock(x), ours(x)
    assert ((got - want).norm() / want.norm()).item() < 0.06


def test_state_dict_and_repr():
    stock = _pair()
    ours = cutlass_nn.CutlassLinear(32, 48, precision="fp8", dtype=torch.bfloat16)
    assert list(ours.state_dict()) == list(stock.state_dict())
    ours.load_state_dict(stock.state_dict(), strict=True)
    stock.load_state_dict(ours.state_dict(), strict=True)
    assert "precision='fp8'" in repr(ours) and "tensorwise" in repr(ours)


def test_activation_after_fp8_gemm():
    ours = cutlass_nn.CutlassLinear(32, 48, activation="gelu_tanh", precision="fp8")
    x = torch.randn(3, 32)
    plain = cutlass_nn.CutlassLinear.from_linear(ours, activation="none")  # keeps the FP8
    assert torch.equal(ours(x), torch.nn.functional.gelu(plain(x), approximate="tanh"))


def test_autocast_gives_autocast_dtype():
    layer = cutlass_nn.CutlassLinear(32, 48, precision="fp8")  # float32 parameters
    x = torch.randn(4, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32


def test_compile_fullgraph():
    torch.manual_seed(0)
    layer = cutlass_nn.CutlassLinear(32, 48, precision="fp8", dtype=torch.bfloat16)
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().square().sum().backward()
    want = (y.detach(), x.grad.clone(), layer.weight.grad.clone())
    x.grad = None
    layer.weight.grad = None
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    y = compiled(x)
    y.float().square().sum().backward()
    assert torch.equal(y, want[0]) and torch.equal(x.grad, want[1])
    assert torch.equal(layer.weight.grad, want[2])


def test_eligible():
    assert fp8.eligible(1024, 4096) and fp8.eligible(4096, 1024)
    assert not fp8.eligible(1024, 1000) and not fp8.eligible(768, 4096)
    assert not fp8.eligible(1032, 4096)  # not a multiple of 16


def test_convert_applies_the_size_rule(caplog):
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 10))
    with caplog.at_level(logging.INFO, logger="cutlass_nn.convert"):
        cutlass_nn.convert(model, precision="fp8", fp8_recipe=Fp8Recipe("rowwise"))
    assert model[0].precision == "fp8" and model[0].fp8_recipe == Fp8Recipe("rowwise")
    assert model[2].precision is None and isinstance(model[2], cutlass_nn.CutlassLinear)
    assert "1 layers in FP8 (0); 1 kept in their dtype" in caplog.text


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(precision="fp16"), ValueError, "argument 'precision' must be None, \"none\" or \"fp8\""),
        (dict(precision="fp8", fp8_recipe="rowwise"), TypeError, "argument 'fp8_recipe' must be"),
        (dict(fp8_recipe=Fp8Recipe()), ValueError, "argument 'fp8_recipe' needs precision"),
    ],
)
def test_convert_errors_change_nothing(kwargs, error, message):
    model = nn.Sequential(nn.Linear(1024, 1024))
    with pytest.raises(error, match=message):
        cutlass_nn.convert(model, **kwargs)
    assert type(model[0]) is nn.Linear


def test_layer_errors():
    with pytest.raises(ValueError, match="CutlassLinear: argument 'precision'"):
        cutlass_nn.CutlassLinear(4, 4, precision="int8")
    with pytest.raises(TypeError, match="fp8.linear: argument 'recipe'"):
        fp8.linear(torch.randn(2, 4), torch.randn(3, 4), None, "tensorwise")
    with pytest.raises(ValueError, match="fp8.linear: argument 'input' must have a last dimension of 4"):
        fp8.linear(torch.randn(2, 5), torch.randn(3, 4))
    with pytest.raises(ValueError, match="argument 'bias' must be None or a tensor of shape \\[3\\]"):
        fp8.linear(torch.randn(2, 4), torch.randn(3, 4), torch.randn(4))
    with pytest.raises(TypeError, match="argument 'input' must be a float16, bfloat16 or float32"):
        fp8.linear(torch.randn(2, 4).to(torch.float8_e4m3fn), torch.randn(3, 4))
    with pytest.raises(TypeError, match="argument 'weight' must be a float16, bfloat16 or float32"):
        fp8.linear(torch.randn(2, 4), torch.randn(3, 4, dtype=torch.float64))


def test_nonfinite_input_gives_nan_not_garbage():
    layer = cutlass_nn.CutlassLinear(32, 8, precision="fp8", fp8_recipe=Fp8Recipe("rowwise"))
    x = torch.randn(3, 32)
    x[1, 5] = float("inf")
    y = layer(x)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[0]).all() and torch.isfinite(y[2]).all()


# ---------------------------------------------------------------------------------------------
# GatedMLP(precision="fp8")
# ---------------------------------------------------------------------------------------------


def _gated_reference(params, x, recipe, activation="silu"):
    """fp8.gated_mlp's arithmetic from the reference's FP8 linear: gate and up as one FP8 layer
    over the concatenated weight (one quantization of x; tensorwise, one weight scale), the
    gated activation of cutlass_nn.ops, the down projection an FP8 layer."""
    bias = params.get("gate_proj.bias")
    gate_up_bias = None if bias is None else torch.cat((bias, params["up_proj.bias"]))
    gate_up = Fp8LinearReference.apply(
        x, torch.cat((params["gate_proj.weight"], params["up_proj.weight"])), gate_up_bias, recipe
    )
    hidden = cutlass_nn.ops.gated_act(gate_up, activation)
    return Fp8LinearReference.apply(hidden, params["down_proj.weight"],
                                    params.get("down_proj.bias"), recipe)


@pytest.mark.parametrize("recipe", RECIPES, ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_gated_mlp_fp8_equals_its_reference(recipe, bias, activation):
    torch.manual_seed(3)
    mlp = cutlass_nn.GatedMLP(32, 48, activation=activation, bias=bias, dtype=torch.bfloat16,
                              precision="fp8", fp8_recipe=recipe)
    assert "precision='fp8'" in repr(mlp)
    assert all(m.precision == "fp8" and m.fp8_recipe == recipe
               for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    y = mlp(x)
    y.backward(g)
    params = {n: p.detach().clone().requires_grad_() for n, p in mlp.named_parameters()}
    x2 = x.detach().clone().requires_grad_()
    y2 = _gated_reference(params, x2, recipe, activation)
    y2.backward(g)
    assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad)
    for n, p in mlp.named_parameters():
        assert p.grad.dtype == p.dtype and torch.equal(p.grad, params[n].grad), n


def test_gated_mlp_fp8_runs_one_gate_up_gemm_and_quantizes_the_input_once():
    """Forward: two FP8 GEMMs (gate+up, down), four quantizations (x, [gate; up], hidden,
    down); no copy of the packed gate and up weights."""
    mlp = cutlass_nn.GatedMLP(32, 48, dtype=torch.bfloat16, precision="fp8")
    x = torch.randn(7, 32, dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        mlp(x)
    names = [e.name for e in prof.events()]
    assert names.count("cutlass_nn::fp8_scaled_mm") == 2
    assert names.count("cutlass_nn::fp8_quantize") == 4
    assert "aten::cat" not in names


@pytest.mark.parametrize("recipe", [Fp8Recipe("tensorwise"), Fp8Recipe("rowwise")], ids=str)
def test_gated_mlp_fp8_close_to_three_fp8_projections(recipe):
    """The fused form differs from three FP8 layers only by its documented roundings (one scale
    for gate and up tensorwise, the activation and product rounded once)."""
    torch.manual_seed(5)
    mlp = cutlass_nn.GatedMLP(64, 96, dtype=torch.bfloat16, precision="fp8", fp8_recipe=recipe)
    x = torch.randn(40, 64, dtype=torch.bfloat16)
    fused = mlp(x).float()
    three = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)).float()
    err = (fused - three).norm() / three.norm()
    assert err < 0.05, err.item()


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
def test_gated_mlp_fp8_only_the_needed_gradients(needs):
    mlp = cutlass_nn.GatedMLP(32, 48, bias=True, dtype=torch.bfloat16, precision="fp8")
    need_x, need_w = needs
    for p in mlp.parameters():
        p.requires_grad_(need_w)
    x = torch.randn(6, 32, dtype=torch.bfloat16, requires_grad=need_x)
    mlp(x).float().sum().backward()
    assert (x.grad is not None) == need_x
    assert all((p.grad is not None) == need_w for p in mlp.parameters())


def test_gated_mlp_fp8_down_weight_only():
    """Only the down projection trains: the gate+up side of the backward is skipped."""
    mlp = cutlass_nn.GatedMLP(32, 48, dtype=torch.bfloat16, precision="fp8")
    mlp.gate_proj.weight.requires_grad_(False)
    mlp.up_proj.weight.requires_grad_(False)
    x = torch.randn(6, 32, dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        mlp(x).float().sum().backward()
    assert mlp.down_proj.weight.grad is not None and mlp.gate_proj.weight.grad is None
    names = [e.name for e in prof.events()]
    assert "cutlass_nn::gated_act_backward" not in names


def test_gated_mlp_fp8_weights_not_adjacent_still_right():
    torch.manual_seed(2)
    mlp = cutlass_nn.GatedMLP(32, 48, dtype=torch.bfloat16, precision="fp8")
    want = mlp(torch.ones(3, 32, dtype=torch.bfloat16))
    mlp.up_proj.weight.data = mlp.up_proj.weight.data.clone()  # separate storage
    assert torch.equal(mlp(torch.ones(3, 32, dtype=torch.bfloat16)), want)


def test_gated_mlp_fp8_autocast_and_compile():
    torch.manual_seed(4)
    mlp = cutlass_nn.GatedMLP(32, 48, precision="fp8")  # float32 parameters
    x = torch.randn(8, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = mlp(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and mlp.gate_proj.weight.grad.dtype == torch.float32
    eager = mlp(x.detach())
    compiled = torch.compile(mlp, fullgraph=True)(x.detach())
    assert torch.equal(eager, compiled)


@pytest.mark.parametrize(
    "args, error, message",
    [
        (dict(up_weight=torch.zeros(40, 32)), ValueError, "'up_weight' must have the shape"),
        (dict(down_weight=torch.zeros(32, 40)), ValueError, "'down_weight' must be [out_features, 48]"),
        (dict(gate_bias=torch.zeros(48)), ValueError, "'gate_bias' and 'up_bias' must both"),
        (dict(down_bias=torch.zeros(7)), ValueError, "'down_bias' must be None or a tensor of shape [32]"),
        (dict(activation="tanh"), ValueError, "'activation' must be one of"),
        (dict(up_weight=torch.zeros(48, 32, dtype=torch.float64)), TypeError, "'up_weight' must be a torch.float32"),
        (dict(input=torch.zeros(3, 31)), ValueError, "'input' must have a last dimension of 32"),
        (dict(gate_weight=torch.zeros(48, 32, dtype=torch.float64)), TypeError,
         "'gate_weight' must be a float16, bfloat16 or float32"),
        (dict(gate_bias=torch.zeros(48), up_bias=torch.zeros(47)), ValueError,
         "'up_bias' must be None or a tensor of shape [48]"),
    ],
)
def test_gated_mlp_fp8_errors(args, error, message):
    kwargs = dict(input=torch.zeros(3, 32), gate_weight=torch.zeros(48, 32),
                  up_weight=torch.zeros(48, 32), down_weight=torch.zeros(32, 48))
    kwargs.update(args)
    with pytest.raises(error, match=re.escape(message)):
        fp8.gated_mlp(**kwargs)


def test_gated_mlp_with_mixed_precisions_calls_the_projections():
    mlp = cutlass_nn.GatedMLP(32, 48, precision="fp8")
    # up back in float32: from an nn.Linear with its weight (from_linear of the FP8 layer keeps
    # the FP8)
    up = torch.nn.Linear(32, 48, bias=False)
    up.weight = mlp.up_proj.weight
    mlp.up_proj = cutlass_nn.CutlassLinear.from_linear(up)
    x = torch.randn(3, 32)
    want = mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    assert torch.equal(mlp(x), want)


def test_convert_fuse_mlp_with_fp8():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = transformers.LlamaConfig(hidden_size=1024, intermediate_size=1024, hidden_act="silu")
    model = nn.Sequential(LlamaMLP(cfg), nn.Linear(1024, 8))
    cutlass_nn.convert(model, fuse_mlp=True, precision="fp8")
    assert isinstance(model[0], cutlass_nn.GatedMLP) and model[0].down_proj.precision == "fp8"
    assert model[1].precision is None  # 8 outputs: below the size rule
    x = torch.randn(4, 1024)
    model(x).sum().backward()
    assert model[0].gate_proj.weight.grad is not None


# ---------------------------------------------------------------------------------------------
# Reuse of an input's quantization by consecutive FP8 layers (opt-in)
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def reuse_on():
    previous = fp8.reuse_quantized_inputs(True)
    yield
    fp8.reuse_quantized_inputs(previous)


def _qkv_step(layers, x, g):
    """Three FP8 layers reading one input (an attention's q / k / v projections; the input
    made by an operation, as a decoder's normalized activation is): outputs and every gradient,
    plus the profiled counts of the quantization operators."""
    for m in layers:
        m.zero_grad(set_to_none=True)
    leaf = x.detach().clone().requires_grad_()
    x = leaf * 1.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ys = [m(x) for m in layers]
        torch.autograd.backward(ys, [g[..., : y.shape[-1]] for y in ys])
    names = [e.name for e in prof.events()]
    counts = {op: names.count(f"cutlass_nn::{op}") for op in ("fp8_quantize", "fp8_cast")}
    return ys, leaf.grad, [m.weight.grad for m in layers], counts


@pytest.mark.parametrize("recipe", [Fp8Recipe("tensorwise"), Fp8Recipe("rowwise")], ids=str)
def test_layers_reading_one_input_quantize_it_once(recipe):
    torch.manual_seed(6)
    layers = [cutlass_nn.CutlassLinear(32, n, bias=False, dtype=torch.bfloat16, precision="fp8",
                                       fp8_recipe=recipe) for n in (48, 16, 16)]
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    g = torch.randn(2, 5, 48, dtype=torch.bfloat16)
    want = _qkv_step(layers, x, g)  # off by default
    previous = fp8.reuse_quantized_inputs(True)
    try:
        got = _qkv_step(layers, x, g)
        assert fp8._LastQuantization.entry is None  # dropped when the backward pass ended
    finally:
        fp8.reuse_quantized_inputs(previous)
    for a, b in zip(got[0], want[0]):
        assert torch.equal(a, b)
    assert torch.equal(got[1], want[1])
    for a, b in zip(got[2], want[2]):
        assert torch.equal(a, b)
    if recipe.scaling == "tensorwise":
        # forward: x once + 3 weights (not 6); backward: x^T cast once + 3 weights^T (not 6)
        assert want[3] == {"fp8_quantize": 6, "fp8_cast": 6}
        assert got[3] == {"fp8_quantize": 4, "fp8_cast": 4}
    else:
        # rowwise: forward x + 3 weights; backward: 3 dY per row, 3 dY per column, 3 weights per
        # column, x per column once (not 3)
        assert want[3]["fp8_quantize"] - got[3]["fp8_quantize"] == 4


def _forward_quantizations(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events()].count("cutlass_nn::fp8_quantize")


def test_reuse_only_for_graph_tensors_and_never_in_inference_mode(reuse_on):
    layer = cutlass_nn.CutlassLinear(32, 16, bias=False, dtype=torch.bfloat16, precision="fp8")
    leaf = torch.randn(8, 32, dtype=torch.bfloat16, requires_grad=True)
    made = leaf * 2
    assert _forward_quantizations(lambda: (layer(made), layer(made))) == 3  # x once, w twice
    plain = torch.randn(8, 32, dtype=torch.bfloat16)  # no graph: a buffer, a NumPy alias...
    assert _forward_quantizations(lambda: (layer(plain), layer(plain))) == 4
    assert _forward_quantizations(lambda: (layer(leaf), layer(leaf))) == 4
    with torch.inference_mode():
        frozen = torch.randn(8, 32, dtype=torch.bfloat16)
        assert torch.equal(layer(frozen), layer(frozen.clone()))
        mlp = cutlass_nn.GatedMLP(32, 48, dtype=torch.bfloat16, precision="fp8")
        mlp(frozen)


def test_reuse_sees_in_place_changes_and_other_views(reuse_on):
    torch.manual_seed(7)
    a = cutlass_nn.CutlassLinear(32, 16, bias=False, dtype=torch.bfloat16, precision="fp8")
    b = cutlass_nn.CutlassLinear(32, 16, bias=False, dtype=torch.bfloat16, precision="fp8")
    b.load_state_dict(a.state_dict())
    x = torch.randn(8, 32, dtype=torch.bfloat16, requires_grad=True) * 1.0
    first = a(x)
    x.mul_(4)  # bumps the version: b must quantize the new values
    assert torch.equal(b(x), a(x.detach().clone())) and not torch.equal(b(x), first)
    # another view of the same storage (other shape): quantized on its own
    flat = x.view(4, 64)
    c = cutlass_nn.CutlassLinear(64, 16, bias=False, dtype=torch.bfloat16, precision="fp8")
    assert torch.equal(c(flat), c(flat.detach().clone()))


def test_reuse_is_off_by_default_and_the_switch_returns_the_previous_setting():
    assert fp8.reuse_quantized_inputs(True) is False
    try:
        assert fp8.reuse_quantized_inputs(True) is True
    finally:
        fp8.reuse_quantized_inputs(False)


def test_gated_mlp_keeps_no_hidden_activation_for_reuse(reuse_on):
    """The MLP's hidden activation is recomputed by its backward, not saved: the reuse entry
    must not keep it alive either (after the forward it holds the MLP's input), nor any graph
    through its source (held detached)."""
    mlp = cutlass_nn.GatedMLP(32, 48, dtype=torch.bfloat16, precision="fp8")
    x = torch.randn(6, 32, dtype=torch.bfloat16, requires_grad=True) * 1.0
    y = mlp(x)
    source = fp8._LastQuantization.entry[1]
    assert source.data_ptr() == x.data_ptr() and source.shape[-1] == 32
    assert source.grad_fn is None and source._base is None
    y.float().sum().backward()
    assert fp8._LastQuantization.entry is None


# ---------------------------------------------------------------------------------------------
# Fp8Recipe(fast_accum_forward=True)
# ---------------------------------------------------------------------------------------------


def test_fast_accum_forward_reaches_only_the_forward_gemms(monkeypatch):
    """The flag goes to the forward GEMMs (the linear's; the gated MLP's two) and never to a
    backward one; the CPU computes exactly either way, so the results equal the reference."""
    seen = []
    real = fp8.ops.fp8_scaled_mm

    def spy(*args):
        seen.append(args[6] if len(args) > 6 else False)  # the default: promoted
        return real(*args)

    monkeypatch.setattr(fp8.ops, "fp8_scaled_mm", spy)
    recipe = Fp8Recipe(fast_accum_forward=True)
    torch.manual_seed(9)
    layer = cutlass_nn.CutlassLinear(32, 48, dtype=torch.bfloat16, precision="fp8",
                                     fp8_recipe=recipe)
    x = torch.randn(5, 32, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    assert seen == [True]
    y.backward(torch.ones_like(y))
    assert seen == [True, False, False]
    want = Fp8LinearReference.apply(x.detach(), layer.weight.detach(), layer.bias.detach(), recipe)
    assert torch.equal(y, want)
    seen.clear()
    mlp = cutlass_nn.GatedMLP(32, 48, dtype=torch.bfloat16, precision="fp8", fp8_recipe=recipe)
    mlp(x).float().sum().backward()
    assert seen == [True, True, False, False, False, False]


def test_recipe_fast_accum_forward_must_be_a_bool():
    with pytest.raises(TypeError, match="'fast_accum_forward' must be a bool, got str"):
        Fp8Recipe(fast_accum_forward="yes")
    assert "fast_accum_forward=True" in repr(Fp8Recipe(fast_accum_forward=True))


def test_gated_mlp_fp8_only_the_down_bias():
    mlp = cutlass_nn.GatedMLP(32, 48, bias=True, dtype=torch.bfloat16, precision="fp8")
    for name, p in mlp.named_parameters():
        p.requires_grad_(name == "down_proj.bias")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        mlp(torch.randn(6, 32, dtype=torch.bfloat16)).float().sum().backward()
    names = [e.name for e in prof.events()]
    assert names.count("cutlass_nn::gated_act") == 1  # the forward's; none recomputed
    assert torch.equal(mlp.down_proj.bias.grad, torch.full((32,), 6.0, dtype=torch.bfloat16))


def test_gated_mlp_fp8_traced_reads_the_packed_weight_through_one_operator():
    """Under torch.compile the [gate; up] weight is quantized by one operator that compares the
    storages when it runs (no concatenation in the graph), with results equal to eager."""
    torch.manual_seed(13)
    mlp = cutlass_nn.GatedMLP(32, 48, dtype=torch.bfloat16, precision="fp8")
    graphs = []

    def backend(gm, example_inputs):  # the graph and its subgraphs (the Function's bodies)
        graphs.extend(m.code for m in gm.modules() if isinstance(m, torch.fx.GraphModule))
        return gm.forward

    x = torch.randn(8, 32, dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(mlp, backend=backend, fullgraph=True)
    y = compiled(x)
    code = "\n".join(graphs)
    assert "_fp8_quantize_gate_up" in code and "_fp8_cast_gate_up" in code, code
    assert "cat" not in code, code
    # the activations' quantization as torch operations that inductor can fuse, not operators
    assert "amax" in code and "cutlass_nn.fp8_quantize" not in code, code
    y.float().sum().backward()
    grads = [p.grad.clone() for p in mlp.parameters()] + [x.grad.clone()]
    mlp.zero_grad()
    x.grad = None
    eager = mlp(x)
    eager.float().sum().backward()
    assert torch.equal(y, eager)
    for a, b in zip(grads, [p.grad for p in mlp.parameters()] + [x.grad]):
        assert torch.equal(a, b)
