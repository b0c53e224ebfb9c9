"""FP8 linear layers on the GPU: CutlassLinear(precision="fp8") runs its three GEMMs on the SM90
FP8 kernels and matches cutlass_nn.fp8_reference's Fp8LinearReference (the same quantized operands,
float32 matmuls) within the kernels' accumulation and rounding error, for both recipes, bfloat16
and float32 parameters (the float32 weight gradient on the float32-out kernel), 3-d inputs, a
token count the kernels do not take (the ATen path for the weight gradient); under autocast;
compiled with inductor (fullgraph) close to eager; no host synchronization per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import cutlass_nn
from cuda_helpers import CUDA_MARKS
from cutlass_nn.fp8_reference import Fp8LinearReference, Fp8Recipe

pytestmark = CUDA_MARKS + [
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
        reason="the FP8 kernels are compiled for SM90",
    )
]

RECIPES = [Fp8Recipe(s, g) for s in ("tensorwise", "rowwise") for g in ("e4m3", "e5m2")]


def close(got, want, tol, what):
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item() or 1.0
    assert err <= tol * scale, f"{what}: {err:.3e} > {tol:.1e} * {scale:.3e}"


def run(layer_fn, x, g):
    x = x.detach().clone().requires_grad_()
    y = layer_fn(x)
    y.backward(g)
    return y.detach(), x.grad


@pytest.mark.parametrize("recipe", RECIPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [256, 77])
def test_layer_matches_reference(recipe, dtype, tokens):
    torch.manual_seed(0)
    stock = nn.Linear(512, 384, device="cuda", dtype=dtype)
    ours = cutlass_nn.CutlassLinear.from_linear(stock, precision="fp8", fp8_recipe=recipe)
    x = torch.randn(1, tokens, 512, device="cuda", dtype=dtype)
    g = torch.randn(1, tokens, 384, device="cuda", dtype=dtype)
    y, dx = run(ours, x, g)
    dw, db = ours.weight.grad.clone(), ours.bias.grad.clone()
    w = stock.weight.detach().clone().requires_grad_()
    b = stock.bias.detach().clone().requires_grad_()
    y_ref, dx_ref = run(lambda t: Fp8LinearReference.apply(t, w, b, recipe), x, g)
    # one bfloat16 ulp (both sides round their float32 results) plus the accumulation difference
    tol = (2.0**-7 if dtype == torch.bfloat16 else 0.0) + 2e-3
    close(y, y_ref, tol, "output")
    close(dx, dx_ref, tol, "input gradient")
    close(dw, w.grad, tol, "weight gradient")
    close(db, b.grad, 1e-5 if dtype == torch.float32 else 2.0**-8, "bias gradient")
    assert y.dtype == dx.dtype == dw.dtype == dtype


def test_kernels_run():
    layer = cutlass_nn.CutlassLinear(1024, 1024, precision="fp8", device="cuda",
                                     dtype=torch.bfloat16)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        x.requires_grad_()
        layer(x).sum().backward()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    fp8_kernels = [n for n in names if "float_e4m3" in n or "float_e5m2" in n]
    assert len(fp8_kernels) >= 3, names[:20]


def test_autocast_float32_parameters():
    torch.manual_seed(1)
    layer = cutlass_nn.CutlassLinear(256, 512, precision="fp8", device="cuda")
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and layer.weight.grad.dtype == torch.float32
    assert torch.isfinite(layer.weight.grad).all()


def test_compiled_close_to_eager():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512)).cuda().bfloat16()
    for i in (0, 2):  # the layers directly: 512-wide ones are below convert's size rule
        model[i] = cutlass_nn.CutlassLinear.from_linear(model[i], precision="fp8",
                                                        fp8_recipe=Fp8Recipe("rowwise"))
    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)

    def step(m):
        for p in model.parameters():
            p.grad = None
        y = m(x)
        y.float().square().mean().backward()
        return y.detach(), [p.grad.clone() for p in model.parameters()]

    y0, g0 = step(model)
    y1, g1 = step(torch.compile(model, fullgraph=True))
    close(y1, y0, 2e-2, "compiled output")
    for a, b in zip(g1, g0):
        close(a, b, 5e-2, "compiled gradient")


def test_no_host_synchronization():
    layer = cutlass_nn.CutlassLinear(1024, 1024, precision="fp8", device="cuda",
                                     dtype=torch.bfloat16, fp8_recipe=Fp8Recipe("rowwise"))
    x = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer(x).sum().backward()  # warm-up
    torch.cuda.set_sync_debug_mode("error")
    try:
        layer(x).sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------
# GatedMLP(precision="fp8"): cutlass_nn.fp8.gated_mlp on the kernels
# ---------------------------------------------------------------------------------------------


def rel(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("recipe", [Fp8Recipe("tensorwise"), Fp8Recipe("rowwise", "e5m2")],
                         ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("tokens", [512, 77])
def test_gated_mlp_matches_reference(recipe, bias, tokens):
    """Against the reference's arithmetic (gate+up as one FP8 linear, cutlass_nn.ops.gated_act,
    the down FP8 linear, float32 matmuls): the two sides round their GEMM outputs differently, so
    a hidden element may land on a neighbouring e4m3 value; compared by relative norm."""
    from cutlass_nn.fp8_reference import Fp8LinearReference as Ref

    torch.manual_seed(11)
    mlp = cutlass_nn.GatedMLP(512, 1024, bias=bias, device="cuda", dtype=torch.bfloat16,
                              precision="fp8", fp8_recipe=recipe)
    x = torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(tokens, 512, device="cuda", dtype=torch.bfloat16)
    y, dx = run(mlp, x, g)
    got = {n: p.grad for n, p in mlp.named_parameters()}
    params = {n: p.detach().clone().requires_grad_() for n, p in mlp.named_parameters()}

    def reference(t):
        b = params.get("gate_proj.bias")
        gate_up = Ref.apply(t, torch.cat((params["gate_proj.weight"], params["up_proj.weight"])),
                            None if b is None else torch.cat((b, params["up_proj.bias"])), recipe)
        hidden = cutlass_nn.ops.gated_act(gate_up, "silu")
        return Ref.apply(hidden, params["down_proj.weight"], params.get("down_proj.bias"), recipe)

    y_ref, dx_ref = run(reference, x, g)
    assert rel(y, y_ref) < 1e-2 and rel(dx, dx_ref) < 2e-2, (rel(y, y_ref), rel(dx, dx_ref))
    for n, p in params.items():
        assert rel(got[n], p.grad) < 2e-2, (n, rel(got[n], p.grad))
    # and near the bfloat16 module (FP8's own error, a few percent)
    bf16 = cutlass_nn.GatedMLP(512, 1024, bias=bias, device="cuda", dtype=torch.bfloat16)
    bf16.load_state_dict(mlp.state_dict())
    y_bf16, _ = run(bf16, x, g)
    assert rel(y, y_bf16) < 0.08, rel(y, y_bf16)


def test_gated_mlp_kernels_run_without_copies_or_syncs():
    """Six FP8 GEMMs per step (gate+up and down, forward, dgrad and wgrad each), the packed
    gate and up weights read in place, no host synchronization."""
    mlp = cutlass_nn.GatedMLP(1024, 2048, device="cuda", dtype=torch.bfloat16, precision="fp8")
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mlp(x).float().sum().backward()  # warm-up
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            mlp(x).float().sum().backward()
            torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    events = prof.events()
    cuda = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len([n for n in cuda if "float_e4m3" in n or "float_e5m2" in n]) >= 6, cuda[:30]
    assert "aten::cat" not in [e.name for e in events]


def test_input_reuse_equal_to_no_reuse_and_safe_in_cuda_graphs():
    """Layers reading one input share its quantization when fp8.reuse_quantized_inputs is on:
    the same results as without; eager calls after CUDA graph replays that rewrote their input
    quantize it again (the static tensors carry no autograd node: never reused)."""
    from cutlass_nn import fp8

    torch.manual_seed(8)
    layers = [cutlass_nn.CutlassLinear(1024, n, bias=False, device="cuda", dtype=torch.bfloat16,
                                       precision="fp8") for n in (1024, 256, 256)]
    x = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)

    def step():
        for m in layers:
            m.zero_grad(set_to_none=True)
        leaf = x.detach().clone().requires_grad_()
        xr = leaf * 1.0
        ys = [m(xr) for m in layers]
        torch.autograd.backward(ys, [g[:, : y.shape[1]] for y in ys])
        return [y.detach() for y in ys] + [leaf.grad] + [m.weight.grad for m in layers]

    want = step()
    previous = fp8.reuse_quantized_inputs(True)
    try:
        for a, b in zip(step(), want):
            assert torch.equal(a, b)
        static = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                hidden = static * 2.0
            for _ in range(2):
                static.copy_(torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16))
                graph.replay()
                got = [m(hidden) for m in layers]  # eager, after a replay rewrote hidden
                fresh = [m(hidden.clone()) for m in layers]
                for a, b in zip(got, fresh):
                    assert torch.equal(a, b)
    finally:
        fp8.reuse_quantized_inputs(previous)


def test_fast_accum_forward_runs_the_fast_accumulation_kernel():
    """Fp8Recipe(fast_accum_forward=True): the forward GEMM on the kernel without promotion,
    the backward GEMMs promoted; the output near the reference (fast accumulation rounds the
    tensor cores' partial sums more coarsely, so a looser bound than the promoted kernels')."""
    torch.manual_seed(12)
    recipe = Fp8Recipe(fast_accum_forward=True)
    stock = nn.Linear(2048, 1024, device="cuda", dtype=torch.bfloat16)
    ours = cutlass_nn.CutlassLinear.from_linear(stock, precision="fp8", fp8_recipe=recipe)
    x = torch.randn(512, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y = ours(x)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("FastAccum" in n for n in names), names[:10]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y.backward(torch.randn_like(y))
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert not any("FastAccum" in n for n in names)
    want = Fp8LinearReference.apply(x.detach(), stock.weight.detach(), stock.bias.detach(), recipe)
    close(y, want, 2.0**-7 + 1e-2, "fast-accumulation output")
