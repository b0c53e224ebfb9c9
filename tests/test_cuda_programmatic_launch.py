"""Programmatic dependent launch (PDL) of the SM90 GEMMs (csrc/kernels/launch_settings.h).

With PDL a GEMM that follows another of our SM90 GEMMs starts before that one has finished and
waits on the GPU (griddepcontrol.wait) before it touches memory. A kernel that read or wrote
global memory before that wait would race with the kernel before it: read a stale operand,
bias, C operand or accumulation target, or overwrite memory the allocator had just handed back
while the previous kernel still read it. Each test runs dependent GEMMs back to back with PDL on
and compares them, bitwise, with the same calls with PDL off (the same kernels, so any
difference is a race), and the chain's end with a float64 reference. The paths: the rule's
kernels, every forced 16-bit tile configuration that takes the problem (cooperative, ping-pong,
stream-K, split-K, the transposed small-M and small-wgrad tiles), the bias and C-operand
epilogues, autograd's backward (dgrad then wgrad), FP8, and a captured CUDA graph.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import cutlass_nn
from cuda_helpers import CUDA_MARKS, forced_config, needs_sm90, seeded_generator, sm90_config_names

pytestmark = CUDA_MARKS

ops = cutlass_nn.ops

# (name, config, splits, tokens, width): a chain of linears [tokens, width] -> [tokens, width];
# config -1 is the per-shape rule. Widths and token counts give each configuration a few
# k-tiles and several waves of tiles (or, for the transposed kernels, a small M).
CHAINS = [
    ("rule_4096x1024", -1, 0, 4096, 1024),
    ("rule_512x768", -1, 0, 512, 768),
    ("rule_small_m", -1, 0, 48, 2048),
    ("cfg0", 0, 0, 2048, 1024),
    ("cfg1_128x192", 1, 0, 1536, 1024),
    ("cfg2_streamk", 2, 0, 1536, 1024),
    ("cfg2_splitk", 2, 3, 1024, 1024),
    ("cfg3_pingpong", 3, 0, 2048, 1024),
    ("cfg10", 10, 0, 2048, 768),
]


def _chain_weights(width, steps, dtype, key):
    gen = seeded_generator(key)
    return [
        (torch.randn(width, width, generator=gen, device="cuda") / width**0.5).to(dtype)
        for _ in range(steps)
    ]


def _run_chain(x, weights, bias_from_previous):
    """Each linear reads the previous one's output as its input (and, with
    ``bias_from_previous``, the previous output's first row as its bias, read in the epilogue)."""
    outs = []
    for w in weights:
        bias = x[0] if bias_from_previous else None
        x = ops.linear(x, w, bias)
        outs.append(x)
    torch.cuda.synchronize()
    return outs


def _chain_reference(x, weights, bias_from_previous):
    x = x.double()
    for w in weights:
        bias = x[0] if bias_from_previous else None
        x = x @ w.double().t()
        if bias is not None:
            x = x + bias
    return x


def _same_with_and_without_pdl(run, rounds, what):
    """Runs ``run`` (returning a tensor or a sequence of tensors) once with PDL off, then
    ``rounds`` times with it on (a race shows up only in some interleavings), each output bitwise
    equal to the PDL-off one; returns the PDL-off outputs as a list."""

    def outputs():
        out = run()
        return [out] if isinstance(out, torch.Tensor) else list(out)

    with ops.programmatic_launch(False):
        expected = outputs()
    with ops.programmatic_launch(True):
        for r in range(rounds):
            got = outputs()
            assert len(got) == len(expected), what
            for i, (g, e) in enumerate(zip(got, expected)):
                assert torch.equal(g, e), f"{what}: output {i} differs with PDL (round {r})"
    return expected


def test_switch_defaults_on_and_restores():
    if os.environ.get("CUTLASS_NN_PDL") == "0":
        pytest.skip("CUTLASS_NN_PDL=0 in this environment")
    assert ops.programmatic_launch_enabled()
    with ops.programmatic_launch(False):
        assert not ops.programmatic_launch_enabled()
        with ops.programmatic_launch(True):
            assert ops.programmatic_launch_enabled()
        assert not ops.programmatic_launch_enabled()
    assert ops.programmatic_launch_enabled()


def test_environment_variable_turns_it_off():
    code = "import cutlass_nn; print(cutlass_nn.ops.programmatic_launch_enabled())"
    env = dict(os.environ, CUTLASS_NN_PDL="0")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("bias_from_previous", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("name,config,splits,tokens,width", CHAINS, ids=[c[0] for c in CHAINS])
def test_dependent_chain_bitwise_equal_without_pdl(
    name, config, splits, tokens, width, bias_from_previous
):
    needs_sm90()
    if config >= len(sm90_config_names()):
        pytest.skip(f"configuration {config} is not compiled in this build")
    dtype = torch.bfloat16
    steps = 6
    weights = _chain_weights(width, steps, dtype, f"pdl-{name}")
    x0 = torch.randn(tokens, width, generator=seeded_generator(f"pdl-x-{name}"), device="cuda")
    x0 = x0.to(dtype)
    with forced_config(config, 0, splits):
        with ops.programmatic_launch(False):
            expected = _run_chain(x0, weights, bias_from_previous)
            kernel = ops.last_kernel_name()
        with ops.programmatic_launch(True):
            # Several rounds: a race shows up only in some interleavings.
            for _ in range(3):
                got = _run_chain(x0, weights, bias_from_previous)
                for step, (g, e) in enumerate(zip(got, expected)):
                    assert torch.equal(g, e), f"{name}: step {step} differs with PDL ({kernel})"
    ref = _chain_reference(x0, weights, bias_from_previous)
    err = (expected[-1].double() - ref).norm() / ref.norm()
    assert err < 3e-2, f"{name}: chain of {steps} linears off the float64 reference by {err:.2e}"


def test_reused_memory_is_not_written_early():
    """The allocator hands a freed operand's block to the next GEMM's output at once (stream
    order); with PDL that GEMM starts while the one reading the block still runs, so it must not
    write before its wait."""
    needs_sm90()
    dtype = torch.bfloat16
    m, k, n = 4096, 2048, 2048
    gen = seeded_generator("pdl-reuse")
    w1 = (torch.randn(n, k, generator=gen, device="cuda") / k**0.5).to(dtype)
    w2 = (torch.randn(k, 1024, generator=gen, device="cuda") / 32).to(dtype)
    sources = [torch.randn(m, k, generator=gen, device="cuda").to(dtype) for _ in range(8)]
    with ops.programmatic_launch(False):
        expected = [ops.linear(s, w1) for s in sources]
    x2 = torch.randn(m, 1024, generator=gen, device="cuda").to(dtype)
    with ops.programmatic_launch(True):
        for _ in range(3):
            results = []
            for s, e in zip(sources, expected):
                a = s.clone()
                y1 = ops.linear(a, w1)  # reads a
                del a  # a's block is free for the next allocation of its size
                y2 = ops.linear(x2, w2)  # [m, k]: the same size as a, likely its block
                results.append((y1, y2))
            torch.cuda.synchronize()
            for (y1, _), e in zip(results, expected):
                assert torch.equal(y1, e)


def test_accumulation_target_written_just_before():
    """linear_wgrad_accumulate_ reads its target through the epilogue's C operand: here the
    target was written by the GEMM just before."""
    needs_sm90()
    dtype = torch.bfloat16
    gen = seeded_generator("pdl-accumulate")
    g = torch.randn(4096, 1024, generator=gen, device="cuda").to(dtype)
    x = torch.randn(4096, 1024, generator=gen, device="cuda").to(dtype)
    a = torch.randn(1024, 2048, generator=gen, device="cuda").to(dtype)
    b = (torch.randn(1024, 2048, generator=gen, device="cuda") / 45).to(dtype)

    def run():
        target = ops.linear(a, b)  # [1024, 1024]
        ops.linear_wgrad_accumulate_(target, g, x)
        return target

    _same_with_and_without_pdl(run, 5, "accumulation into a target written just before")


def test_backward_bitwise_equal_without_pdl():
    """Autograd runs each linear's dgrad and wgrad back to back (two SM90 GEMMs)."""
    needs_sm90()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        cutlass_nn.CutlassLinear(1024, 2816, bias=False),
        cutlass_nn.CutlassLinear(2816, 1024, bias=True),
        cutlass_nn.CutlassLinear(1024, 256, bias=False),
    ).to("cuda", torch.bfloat16)
    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)

    def step():
        model.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        model(xi).float().square().mean().backward()
        return [xi.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    _same_with_and_without_pdl(step, 3, "input and parameter gradients")


def test_cuda_graph_replay_bitwise_equal_without_pdl():
    needs_sm90()
    dtype = torch.bfloat16
    weights = _chain_weights(1024, 5, dtype, "pdl-graph")
    x = torch.randn(2048, 1024, device="cuda").to(dtype)
    with ops.programmatic_launch(False):
        expected = _run_chain(x, weights, True)
    with ops.programmatic_launch(True):
        _run_chain(x, weights, True)  # warm-up outside the capture (first-call set-up)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            outs = []
            xi = x
            for w in weights:
                xi = ops.linear(xi, w, xi[0])
                outs.append(xi)
        torch.cuda.current_stream().wait_stream(stream)
        for _ in range(4):
            graph.replay()
            torch.cuda.synchronize()
            for got, exp in zip(outs, expected):
                assert torch.equal(got, exp)


@pytest.mark.parametrize("fp8_config", [-1, 0, 1, 5, 6, 7])
def test_fp8_dependent_bias_bitwise_equal_without_pdl(fp8_config):
    """Two FP8 GEMMs back to back, the second's bias a row of the first's output (read by the
    epilogue), with tensorwise and rowwise scales."""
    needs_sm90()
    names = [n for n in torch.ops.cutlass_nn._fp8_configs().split("\n") if n]
    if fp8_config >= len(names):
        pytest.skip(f"FP8 configuration {fp8_config} is not compiled in this build")
    gen = torch.Generator(device="cuda").manual_seed(11)
    m, k, n = 2048, 2048, 1024
    a = torch.randn(m, k, generator=gen, device="cuda").to(torch.float8_e4m3fn)
    b1 = torch.randn(n, k, generator=gen, device="cuda").to(torch.float8_e4m3fn).t()
    b2 = torch.randn(n, k, generator=gen, device="cuda").to(torch.float8_e4m3fn).t()
    row_scale = torch.rand(m, 1, generator=gen, device="cuda") + 0.5
    col_scale = torch.rand(1, n, generator=gen, device="cuda") + 0.5
    one = torch.ones((), device="cuda")

    def run():
        first = ops.fp8_scaled_mm(a, b1, row_scale, col_scale)
        second = ops.fp8_scaled_mm(a, b2, one * 0.01, one, bias=first[7])
        torch.cuda.synchronize()
        return first, second

    previous = torch.ops.cutlass_nn._set_fp8_config(fp8_config)
    try:
        expected = _same_with_and_without_pdl(run, 3, f"FP8 configuration {fp8_config}")
    finally:
        torch.ops.cutlass_nn._set_fp8_config(previous)
    ref = (a.double() @ b2.double()) * 0.01 + expected[0][7].double()
    err = (expected[1].double() - ref).abs().max() / ref.abs().max()
    assert err < 2e-2
