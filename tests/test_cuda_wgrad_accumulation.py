"""Fused weight-gradient accumulation on the GPU: micro-batches without zero_grad, with
cutlass_nn.fused_wgrad_accumulation() on, give gradients as accurate as the unfused run against a
float64 reference (each dtype, aligned and odd shapes, plain linear and linear + activation),
write them into the existing .grad tensors with linear_wgrad_accumulate_, synchronize nothing
with the host, and replay correctly from a CUDA graph; the gated MLP's weights too."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as TF

import cutlass_nn
from cuda_helpers import CUDA_MARKS
from cutlass_nn import functional as F

pytestmark = CUDA_MARKS


class Block(torch.nn.Module):
    """linear_act (gelu) then a plain linear: both autograd kernels that accumulate."""

    def __init__(self, d_in, d_hidden, d_out, bias, dtype, device):
        super().__init__()
        self.first = cutlass_nn.CutlassLinear(d_in, d_hidden, bias=bias, dtype=dtype, device=device)
        self.second = cutlass_nn.CutlassLinear(d_hidden, d_out, bias=bias, dtype=dtype, device=device)

    def forward(self, x):
        h = F.linear(x, self.first.weight, self.first.bias, activation="gelu")
        return self.second(h)


def batches(n, rows, d_in, d_out, dtype, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, d_in, generator=gen).to(dtype).cuda(),
             torch.randn(rows, d_out, generator=gen).to(dtype).cuda()) for _ in range(n)]


def accumulate(model, data):
    for x, y in data:
        TF.mse_loss(model(x).float(), y.float(), reduction="sum").backward()
    return {n: p.grad for n, p in model.named_parameters()}


def reference(model, data):
    """The same micro-batches in float64 on the CPU with torch's own layers."""
    ref = copy.deepcopy(model).cpu().double()
    grads = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for x, y in data:
        x, y = x.cpu().double(), y.cpu().double()
        h = TF.gelu(TF.linear(x, ref.first.weight, ref.first.bias))
        out = TF.linear(h, ref.second.weight, ref.second.bias)
        params = [p for _, p in ref.named_parameters()]
        gs = torch.autograd.grad(TF.mse_loss(out, y, reduction="sum"), params)
        for (n, _), g in zip(ref.named_parameters(), gs):
            grads[n] += g
    return grads


def error(got, want):
    return ((got.double().cpu() - want).abs().max() / want.abs().max()).item()


def op_counts(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    names = [e.name for e in prof.events()]
    return names.count("cutlass_nn::linear_wgrad"), names.count("cutlass_nn::linear_wgrad_accumulate_")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(256, 128, 64, 512), (37, 29, 23, 301), (64, 1000, 72, 130)],
                         ids=["aligned", "odd", "mixed"])
@pytest.mark.parametrize("bias", [True, False])
def test_micro_batches_are_as_accurate_as_unfused(dtype, shape, bias):
    d_in, d_hidden, d_out, rows = shape
    torch.manual_seed(1)
    plain = Block(d_in, d_hidden, d_out, bias, dtype, "cuda")
    fused = copy.deepcopy(plain)
    data = batches(4, rows, d_in, d_out, dtype)
    want = reference(plain, data)
    unfused = accumulate(plain, data)
    with cutlass_nn.fused_wgrad_accumulation():
        grads = {}
        new, in_place = op_counts(lambda: grads.update(accumulate(fused, data)))
    # 2 layers x 4 micro-batches: the first forms new gradients, the other three accumulate
    assert (new, in_place) == (2, 6)
    floor = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    for name in want:
        e_fused, e_plain = error(grads[name], want[name]), error(unfused[name], want[name])
        assert e_fused <= 2 * e_plain + floor, (name, e_fused, e_plain)


def test_the_gradient_tensor_is_updated_in_place_without_host_sync():
    torch.manual_seed(2)
    model = Block(64, 96, 32, True, torch.bfloat16, "cuda")
    data = batches(3, 128, 64, 32, torch.bfloat16)
    with cutlass_nn.fused_wgrad_accumulation():
        accumulate(model, data[:1])
        ptrs = {n: p.grad.data_ptr() for n, p in model.named_parameters()}
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            accumulate(model, data[1:])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert {n: p.grad.data_ptr() for n, p in model.named_parameters()} == ptrs


def test_cuda_graph_replays_accumulate():
    """A captured micro-batch backward adds its weight gradient into .grad on every replay."""
    torch.manual_seed(3)
    layer = cutlass_nn.CutlassLinear(64, 48, dtype=torch.float32, device="cuda")
    x = torch.randn(32, 64, device="cuda")
    with cutlass_nn.fused_wgrad_accumulation():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: .grad exists before capture
                layer(x).square().sum().backward()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(x).square().sum().backward()
        layer.weight.grad.zero_()
        layer.bias.grad.zero_()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    w = layer.weight.detach().double().requires_grad_()
    b = layer.bias.detach().double().requires_grad_()
    TF.linear(x.double(), w, b).square().sum().backward()
    torch.testing.assert_close(layer.weight.grad.double(), 3 * w.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(layer.bias.grad.double(), 3 * b.grad, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("sizes", [(256, 512), (72, 200)], ids=["aligned", "odd"])
def test_gated_mlp_micro_batches_are_as_accurate_as_unfused(dtype, sizes):
    hidden, inter = sizes
    torch.manual_seed(4)
    plain = cutlass_nn.GatedMLP(hidden, inter, dtype=dtype, device="cuda")
    fused = copy.deepcopy(plain)
    data = batches(3, 300, hidden, hidden, dtype, seed=9)
    ref = copy.deepcopy(plain).cpu().double()
    want = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for x, y in data:
        x64 = x.cpu().double()  # torch's formula in float64
        out = TF.linear(TF.silu(TF.linear(x64, ref.gate_proj.weight)) * TF.linear(x64, ref.up_proj.weight),
                        ref.down_proj.weight)
        gs = torch.autograd.grad(TF.mse_loss(out, y.cpu().double(), reduction="sum"),
                                 list(ref.parameters()))
        for (n, _), g in zip(ref.named_parameters(), gs):
            want[n] += g
    unfused = accumulate(plain, data)
    with cutlass_nn.fused_wgrad_accumulation():
        grads = {}
        new, in_place = op_counts(lambda: grads.update(accumulate(fused, data)))
    assert (new, in_place) == (2, 4)  # down and gate+up: new, then two accumulating GEMMs each
    floor = {torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    for name in want:
        e_fused, e_plain = error(grads[name], want[name]), error(unfused[name], want[name])
        assert e_fused <= 2 * e_plain + floor, (name, e_fused, e_plain)


def test_main_grads_are_as_accurate_as_16_bit_accumulation():
    """float32 main-gradient buffers: the GEMMs add float32 accumulators into float32, with no
    16-bit rounding of any micro-batch's weight gradient."""
    torch.manual_seed(6)
    hidden, inter = 256, 512
    plain = torch.nn.Sequential(cutlass_nn.GatedMLP(hidden, inter, dtype=torch.bfloat16, device="cuda"),
                                cutlass_nn.CutlassLinear(hidden, hidden, dtype=torch.bfloat16, device="cuda"))
    model = copy.deepcopy(plain)
    data = batches(8, 512, hidden, hidden, torch.bfloat16, seed=13)
    ref = copy.deepcopy(plain).cpu().double()
    want = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for x, y in data:
        x64 = x.cpu().double()
        mlp, last = ref[0], ref[1]
        h = TF.linear(TF.silu(TF.linear(x64, mlp.gate_proj.weight)) * TF.linear(x64, mlp.up_proj.weight),
                      mlp.down_proj.weight)
        out = TF.linear(h, last.weight, last.bias)
        gs = torch.autograd.grad(TF.mse_loss(out, y.cpu().double(), reduction="sum"), list(ref.parameters()))
        for (n, _), g in zip(ref.named_parameters(), gs):
            want[n] += g
    unfused = accumulate(plain, data)
    cutlass_nn.attach_main_grads(model)
    new, in_place = op_counts(lambda: accumulate(model, data))
    assert (new, in_place) == (0, 3 * 8)  # down, gate+up, last: every micro-batch in place
    for name, p in model.named_parameters():
        assert p.grad is None and p.main_grad.dtype == torch.float32
        e_main, e_plain = error(p.main_grad, want[name]), error(unfused[name], want[name])
        assert e_main <= 2 * e_plain + 1e-3, (name, e_main, e_plain)
